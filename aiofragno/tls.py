"""TLS for server connections: the mode and :class:`ssl.SSLContext` that the
options ask for (libpq's rules, and PyMySQL's where it has its own), built
once per Database; and which connect failures are TLS failures.

The modes are libpq's: "disable" (no TLS), "allow" (plain, TLS if the server
insists), "prefer" (TLS if the server offers it, plain otherwise), "require"
(TLS, the certificate not checked), "verify-ca" (the certificate must chain
to a trusted CA), "verify-full" (and name the host connected to). TLS does
not apply to Unix sockets, as in libpq and the MySQL client.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TLSError, ValidationError
from .url import TLS_FILE_OPTIONS, DatabaseURL, Options

VERIFYING = ("verify-ca", "verify-full")
REQUIRED = ("require", *VERIFYING)
# Closed sockets rather than refusals: a connection lost mid-handshake.
_LOSSES = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)
# OpenSSL's verify codes for a certificate that does not name the host.
_NAME_MISMATCH = (62, 64)  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH


@dataclass(frozen=True, slots=True)
class TLS:
    """How a connection uses TLS: the mode, the context (None: no TLS), and
    the client certificate's files for a driver that builds its own context
    (asyncpg, in the modes that may fall back to plain)."""

    mode: str
    context: ssl.SSLContext | None = None
    cert: str | None = None
    key: str | None = None
    password: str | None = field(default=None, repr=False)
    given_context: bool = False  # the caller's ssl=SSLContext

    @property
    def required(self) -> bool:
        return self.mode in REQUIRED

    def describe(self) -> str:
        return "the given ssl.SSLContext" if self.given_context else f"sslmode={self.mode}"


NONE = TLS("disable")


def configure(url: DatabaseURL, options: Options, home: Path | None = None) -> TLS:
    """The TLS that ``options`` ask for on ``url`` (none for a Unix socket);
    :class:`ValidationError` for settings that contradict each other or
    files that cannot be used. ``home``: where PostgreSQL's default files
    (``~/.postgresql/``) are looked for (default: the user's home)."""
    if url.unix_socket:
        return NONE
    if isinstance(options.ssl, ssl.SSLContext):
        return _given(options)
    mode = _mode(options, url.dialect)
    if mode == "disable":
        return NONE
    ca, cert, key = _files(options, url.dialect, home)
    mode = _checked(mode, ca, url.dialect, options)
    context = _context(mode, ca, cert, key, options.sslpassword)
    return TLS(mode, context, cert, key, options.sslpassword)


def _files(
    options: Options, dialect: str, home: Path | None
) -> tuple[str | None, str | None, str | None]:
    """The root certificate, client certificate and key: as given, else (on
    PostgreSQL) libpq's default files where they exist."""
    defaults = _libpq_files(home) if dialect == "postgresql" else {}
    ca = options.sslrootcert or defaults.get("root.crt")
    cert = options.sslcert or defaults.get("postgresql.crt")
    key = options.sslkey or (defaults.get("postgresql.key") if cert else None)
    if key and not cert:
        raise ValidationError(
            "sslkey (ssl_key) is given without sslcert (ssl_cert), the certificate it is the key of"
        )
    return ca, cert, key


def _checked(mode: str, ca: str | None, dialect: str, options: Options) -> str:
    """``mode`` as the root certificate ``ca`` makes it, or ValidationError
    where they do not go together."""
    if mode == "allow" and dialect == "mysql":
        raise ValidationError(
            "MySQL has no sslmode 'allow' (plain, then TLS if the server insists); "
            "use prefer or disable"
        )
    if ca == "system" and mode != "verify-full":
        raise ValidationError(
            f"sslrootcert=system trusts every CA the system does, so it needs "
            f"sslmode=verify-full (as in libpq), not {mode}"
        )
    if mode == "require" and ca is not None and options.ssl_verify_cert is not False:
        mode = "verify-ca"  # libpq: a root certificate is there to be used
    if mode in VERIFYING and ca is None:
        raise ValidationError(
            f"sslmode={mode} verifies the server's certificate, so it needs the CA that signed "
            "it: give sslrootcert (ssl_ca) the CA's PEM file, or sslrootcert=system for the "
            "system's trusted CAs"
            + (" (or put it in ~/.postgresql/root.crt)" if dialect == "postgresql" else "")
        )
    return mode


def _given(options: Options) -> TLS:
    """An SSLContext the caller built: used as it is (TLS required)."""
    context = options.ssl
    assert isinstance(context, ssl.SSLContext)
    mode = options.sslmode or "require"
    named = (*TLS_FILE_OPTIONS, "ssl_verify_cert", "ssl_verify_identity")
    others = [name for name in named if getattr(options, name) is not None]
    if others:
        raise ValidationError(
            f"ssl is an SSLContext, which {', '.join(others)} cannot add to: load the "
            "certificates into the context (load_verify_locations, load_cert_chain) instead"
        )
    if mode not in REQUIRED:
        raise ValidationError(
            f"ssl is an SSLContext, so TLS is required: sslmode={mode} cannot go with it "
            "(leave sslmode out, or use require, verify-ca or verify-full)"
        )
    if mode in VERIFYING and context.verify_mode != ssl.CERT_REQUIRED:
        raise ValidationError(
            f"sslmode={mode}, but the SSLContext does not verify certificates (verify_mode)"
        )
    if mode == "verify-full" and not context.check_hostname:
        raise ValidationError(
            "sslmode=verify-full, but the SSLContext does not check host names (check_hostname)"
        )
    return TLS(mode, context, given_context=True)


def _mode(options: Options, dialect: str) -> str:
    """The mode asked for, before a root certificate makes "require" "verify-ca"."""
    flags = (options.ssl_verify_cert, options.ssl_verify_identity)
    flagged = flags != (None, None)
    if options.sslmode is not None:
        if flagged:
            raise ValidationError(
                "sslmode and ssl_verify_cert/ssl_verify_identity both say how to verify; give one"
            )
        wanted = REQUIRED if options.ssl else ("disable",)
        if options.ssl is not None and options.sslmode not in wanted:
            raise ValidationError(
                f"ssl={str(options.ssl).lower()} and sslmode={options.sslmode} disagree; give one"
            )
        return options.sslmode
    if options.ssl is False:
        if flagged:
            raise ValidationError(
                "ssl=false turns TLS off: ssl_verify_cert/ssl_verify_identity cannot go with it"
            )
        return "disable"
    files = any(getattr(options, name) is not None for name in ("sslrootcert", "sslcert", "sslkey"))
    if flagged or (dialect == "mysql" and (options.ssl or files)):
        return _pymysql_mode(*flags, has_ca=options.sslrootcert is not None)
    if options.sslrootcert == "system":
        return "verify-full"  # libpq 16
    if dialect == "mysql":
        return "disable"
    return "require" if options.ssl else "prefer"


def _pymysql_mode(verify_cert: bool | None, verify_identity: bool | None, *, has_ca: bool) -> str:
    """PyMySQL's rules: with a CA, the certificate and the host name are
    verified unless told not to be; without one, only what is asked for."""
    cert = has_ca if verify_cert is None else verify_cert
    identity = cert and has_ca if verify_identity is None else verify_identity
    if identity and not cert:
        raise ValidationError(
            "ssl_verify_identity=true checks the certificate's host name, so ssl_verify_cert cannot be false"
        )
    return "verify-full" if identity else "verify-ca" if cert else "require"


def _libpq_files(home: Path | None) -> dict[str, str]:
    """libpq's default files in ``~/.postgresql`` that exist, by name."""
    try:
        directory = (home or Path.home()) / ".postgresql"
    except (RuntimeError, KeyError):  # no home directory
        return {}
    names = ("root.crt", "postgresql.crt", "postgresql.key")
    return {name: str(directory / name) for name in names if (directory / name).is_file()}


def _context(
    mode: str, ca: str | None, cert: str | None, key: str | None, password: str | None
) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if mode in VERIFYING:
        context.check_hostname = mode == "verify-full"
        if ca == "system":
            context.load_default_certs()
        else:
            _load(
                "sslrootcert (ssl_ca)",
                str(ca),
                lambda: context.load_verify_locations(cafile=ca),
                hint="; it must hold PEM certificates (-----BEGIN CERTIFICATE-----)",
            )
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        files = f"{cert}" + (f" and {key}" if key else "")
        _load(
            "sslcert/sslkey (ssl_cert/ssl_key)",
            files,
            lambda: context.load_cert_chain(cert, key, password=lambda: password or ""),
            hint="; an encrypted key needs its sslpassword",
        )
    return context


def _load(what: str, path: str, load: Callable[[], None], hint: str = "") -> None:
    try:
        load()
    except OSError as exc:
        reason = getattr(exc, "reason", None) if isinstance(exc, ssl.SSLError) else exc.strerror
        raise ValidationError(f"{what} {path}: cannot be used ({reason or exc}){hint}") from None


def failure(
    exc: BaseException, *, address: str, tls: TLS, offers_tls: bool | None = None
) -> TLSError | None:
    """The :class:`TLSError` that ``exc``, raised while connecting to
    ``address`` with ``tls``, amounts to; None if it is no TLS failure (or
    TLS was optional). ``offers_tls``: whether the server said it speaks TLS,
    where the driver tells."""
    if not tls.required:
        return None
    if offers_tls is False:
        return TLSError(
            f"the server at {address} does not offer TLS, and {tls.describe()} requires it: "
            "enable TLS on the server, or use sslmode=prefer (ssl_mode=PREFERRED) to fall "
            "back to an unencrypted connection"
        )
    cause = _ssl_error(exc)
    if isinstance(cause, ssl.SSLCertVerificationError):
        if cause.verify_code in _NAME_MISMATCH:
            hint = "connect with a host name the certificate names, or use sslmode=verify-ca (which checks the CA only)"
        else:
            hint = "give sslrootcert (ssl_ca) the CA certificate that signed the server's (for a hosted database: the provider's CA bundle)"
        return TLSError(
            f"the certificate of the server at {address} failed verification "
            f"({tls.describe()}): {cause.verify_message}; {hint}"
        )
    if cause is not None:
        return TLSError(
            f"the TLS handshake with the server at {address} failed ({tls.describe()}): "
            f"{getattr(cause, 'reason', None) or cause}; check the server's TLS setup, and the client "
            "certificate (sslcert/sslkey) if the server asks for one"
        )
    return None


def _ssl_error(exc: BaseException | None) -> ssl.SSLError | None:
    """The TLS refusal in ``exc``'s chain (drivers wrap it), if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ssl.SSLError) and not isinstance(exc, _LOSSES):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
