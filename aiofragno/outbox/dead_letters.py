"""Dead letters: entries a consumer gave up on, with the error that made it.

What is stored must always be storable, or one bad error message would stop
the consumer at its entry for good: the error text is cut to
:data:`MAX_ERROR_LENGTH` characters, and NUL (which PostgreSQL text cannot
hold) and lone surrogates (which no database's UTF-8 can) are stored as
backslash escapes, on every backend alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import tagged_json
from ..codec import utc_now
from ..sql import Fragment, Identifier, sql_using
from .entry import OutboxEntry
from .tables import DEAD_LETTERS_ID

if TYPE_CHECKING:
    from ..engine import Engine

MAX_ERROR_LENGTH = 10_000
_TRUNCATED = " ... (truncated)"
_COLUMNS = ("consumer", "versionstamp", "uow_id", "entry", "error", "attempts", "created_at")
_C = {f"c{i}": Identifier(c) for i, c in enumerate(_COLUMNS)}
_LIST = ", ".join(f"{{c{i}}}" for i in range(len(_COLUMNS)))


@dataclass(frozen=True, slots=True)
class DeadLetter:
    consumer: str
    versionstamp: str
    uow_id: str
    entry: dict[str, Any]
    error: str
    attempts: int
    created_at: datetime


def error_text(exc: BaseException) -> str:
    """``exc`` as a dead letter stores it: ``"Type: message"``, storable on
    every backend and at most :data:`MAX_ERROR_LENGTH` characters."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not stop the consumer
        message = "<the exception's message could not be built>"
    text = f"{type(exc).__name__}: {message}"[: MAX_ERROR_LENGTH * 2]
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_ERROR_LENGTH:
        text = text[: MAX_ERROR_LENGTH - len(_TRUNCATED)] + _TRUNCATED
    return text


def insert(db: Engine, consumer: str, entry: OutboxEntry, error: str, attempts: int) -> Fragment:
    """The INSERT of ``entry``'s dead letter (``error`` from :func:`error_text`)."""
    record = {
        "versionstamp": entry.versionstamp,
        "uow_id": entry.uow_id,
        "payload": entry.payload,
        "ref_map": entry.ref_map,
        "created_at": entry.created_at,
    }
    return sql_using(
        f"INSERT INTO {{t}} ({_LIST}) VALUES ({{consumer}}, {{vs}}, {{uow}}, {{entry}}, "
        "{error}, {attempts}, {now})",
        **_C,
        t=DEAD_LETTERS_ID,
        consumer=consumer,
        vs=entry.versionstamp,
        uow=entry.uow_id,
        entry=tagged_json.dumps(record),
        error=error,
        attempts=attempts,
        now=db.codec.encoder("timestamp")(utc_now()),
    )


def exists(consumer: str, versionstamp: str) -> Fragment:
    """A query with a row when ``consumer`` has a dead letter for the entry."""
    return sql_using(
        "SELECT 1 FROM {t} WHERE {c0} = {consumer} AND {c1} = {vs}",
        **_C,
        t=DEAD_LETTERS_ID,
        consumer=consumer,
        vs=versionstamp,
    )


async def read(db: Engine, consumer: str) -> list[DeadLetter]:
    """``consumer``'s dead letters, in entry order."""
    query = sql_using(
        f"SELECT {_LIST} FROM {{t}} WHERE {{c0}} = {{consumer}} ORDER BY {{c1}}",
        **_C,
        t=DEAD_LETTERS_ID,
        consumer=consumer,
    )
    decode = db.codec.decoder("timestamp")
    return [
        DeadLetter(
            consumer=row["consumer"],
            versionstamp=row["versionstamp"],
            uow_id=row["uow_id"],
            entry=tagged_json.loads(row["entry"]),
            error=row["error"],
            attempts=int(row["attempts"]),
            created_at=row["created_at"] if decode is None else decode(row["created_at"]),
        )
        for row in await db.fetch(query)
    ]
