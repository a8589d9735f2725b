"""The backends aiofragno knows, by name. Nothing here imports a driver: a backend
module is imported only when a Database is opened with it.

Each backend module exposes ``create_dialect(url, options) -> Dialect``. A backend
whose driver works only on asyncio (``asyncio_only``) may still list "trio" in its
runtimes: under trio, :func:`create_dialect` puts it behind ``asyncio_bridge``
(a private asyncio loop in a helper thread); under asyncio it is used directly.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

from ..driver import Dialect
from ..errors import Error, ValidationError
from ..runtime import current_runtime
from ..url import DatabaseURL, Options


class BackendNotInstalled(Error, ImportError):
    """The backend's driver package is missing: install the extra it names."""


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    dialect: str
    module: str
    extra: str
    runtimes: frozenset[str]
    # The driver runs only on asyncio; under trio it is reached through the bridge.
    asyncio_only: bool = False


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "asyncpg",
            "postgresql",
            "aiofragno.backends.asyncpg",
            "postgres",
            frozenset({"asyncio", "trio"}),
            asyncio_only=True,
        ),
        Backend(
            "aiosqlite", "sqlite", "aiofragno.backends.aiosqlite", "sqlite", frozenset({"asyncio"})
        ),
        Backend(
            "sqlite", "sqlite", "aiofragno.backends.sqlite", "", frozenset({"asyncio", "trio"})
        ),
        Backend(
            "asyncmy",
            "mysql",
            "aiofragno.backends.asyncmy",
            "mysql",
            frozenset({"asyncio", "trio"}),
            asyncio_only=True,
        ),
    )
}

# Per dialect, the backends to try in order of preference.
DEFAULTS: dict[str, tuple[str, ...]] = {
    "postgresql": ("asyncpg",),
    "sqlite": ("sqlite", "aiosqlite"),
    "mysql": ("asyncmy",),
}


class _BackendModule(Protocol):
    def create_dialect(self, url: DatabaseURL, options: Options) -> Dialect: ...


def choose_backend(url: DatabaseURL, requested: str | None, runtime: str) -> Backend:
    """The backend for ``url`` under ``runtime`` ("asyncio" / "trio")."""
    name = requested or url.backend
    if name is None:
        for candidate in DEFAULTS[url.dialect]:
            if runtime in BACKENDS[candidate].runtimes:
                return BACKENDS[candidate]
        raise ValidationError(f"no {url.dialect} backend runs under {runtime} yet")
    backend = BACKENDS.get(name)
    if backend is None:
        raise ValidationError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    if backend.dialect != url.dialect:
        raise ValidationError(f"backend {name!r} speaks {backend.dialect}, not {url.dialect}")
    if runtime not in backend.runtimes:
        raise ValidationError(
            f"backend {name!r} runs under {', '.join(sorted(backend.runtimes))}, not {runtime}"
        )
    return backend


def create_dialect(
    backend: Backend, url: DatabaseURL, options: Options, runtime: str | None = None
) -> Dialect:
    """``backend``'s dialect for ``url`` under ``runtime`` (default: the running one)."""
    module = _import(backend)
    dialect = module.create_dialect(url, options)
    if backend.asyncio_only and (runtime or current_runtime()) != "asyncio":
        from .asyncio_bridge import bridged

        return bridged(dialect)
    return dialect


def _import(backend: Backend) -> _BackendModule:
    try:
        module: _BackendModule = importlib.import_module(backend.module)
    except ImportError as exc:
        hint = (
            f"pip install 'aiofragno[{backend.extra}]'" if backend.extra else "reinstall aiofragno"
        )
        raise BackendNotInstalled(
            f"the {backend.name} backend needs a package that is not installed ({exc.name}): {hint}"
        ) from exc
    return module
