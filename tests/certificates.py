"""Throw-away certificates for the TLS tests, made with the ``openssl``
command (EC P-256 keys: quick to make) and valid for two days.

* ``ca``: the test CA, which signed the two certificates below;
* ``server_cert`` / ``server_key``: for the host name "localhost" only, so
  that 127.0.0.1 (the same server) is a host the certificate does not name;
* ``client_cert`` / ``client_key``: for the database user "certuser"
  (PostgreSQL's ``cert`` authentication takes the user from the common
  name), and ``client_key_encrypted``, the same key under ``KEY_PASSWORD``;
* ``other_ca``: a CA that signed nothing here (a server certificate checked
  against it fails verification).
"""

from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

KEY_PASSWORD = "Kp7-client-key-secret"
CLIENT_USER = "certuser"

_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""
_NEW_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Certificates:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def other_ca(self) -> Path:
        return self.directory / "other-ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server-cert.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server-key.pem"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client-cert.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client-key.pem"

    @property
    def client_key_encrypted(self) -> Path:
        return self.directory / "client-key-encrypted.pem"


def make_certificates(openssl: Path, directory: Path, owner: str | None = None) -> Certificates:
    """The certificates, made with the ``openssl`` command in ``directory``
    (created); owned by the OS user ``owner`` if given (a server running as
    that user reads its key, which PostgreSQL wants readable by its owner
    only)."""
    directory.mkdir(parents=True)
    config = directory / "openssl.cnf"
    config.write_text(_CONFIG)
    made = Certificates(directory)

    def run(*arguments: str | Path) -> None:
        subprocess.run(
            [openssl, *map(str, arguments)], check=True, capture_output=True, cwd=directory
        )

    for ca in ("ca", "other-ca"):
        run(
            "req",
            "-x509",
            "-new",
            *_NEW_KEY,
            "-keyout",
            f"{ca}-key.pem",
            "-out",
            f"{ca}.pem",
            "-days",
            "2",
            "-config",
            config,
            "-extensions",
            "ca",
            "-subj",
            f"/CN=aiofragno {ca}",
        )
    for name, common_name in (("server", "localhost"), ("client", CLIENT_USER)):
        run(
            "req",
            "-new",
            *_NEW_KEY,
            "-keyout",
            f"{name}-key.pem",
            "-out",
            f"{name}.csr",
            "-config",
            config,
            "-subj",
            f"/CN={common_name}",
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            made.ca,
            "-CAkey",
            "ca-key.pem",
            "-set_serial",
            str(int.from_bytes(os.urandom(8), "big")),
            "-days",
            "2",
            "-out",
            f"{name}-cert.pem",
            "-extfile",
            config,
            "-extensions",
            name,
        )
    run(
        "pkey",
        "-in",
        made.client_key,
        "-out",
        made.client_key_encrypted,
        "-aes256",
        "-passout",
        f"pass:{KEY_PASSWORD}",
    )
    for path in directory.iterdir():
        path.chmod(0o600 if path.name.endswith("key.pem") else 0o644)
        if owner is not None:
            user = pwd.getpwnam(owner)
            os.chown(path, user.pw_uid, user.pw_gid)
    return made
