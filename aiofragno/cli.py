"""The ``aiofragno`` command.

    aiofragno demo [--url URL] [--units N] [--concurrency C]
    aiofragno migrate --url URL module:attr [--namespace NS] [--dry-run] [--adopt]
        [--plan [--output FILE] | --apply FILE] [--allow-drop TABLE.NAME ...]
    aiofragno inspect [URL] [--namespace NS]
    aiofragno typegen module:attr [--output FILE]
    aiofragno outbox tail --url URL [--after VS] [--follow]
    aiofragno outbox consumers --url URL
    aiofragno outbox relay --url URL --to BROKER_URL --subject SUBJECT [--until-caught-up]
    aiofragno doctor --url URL
    aiofragno bench [--url URL] [--units N] [--concurrency C] [--outbox] [--compare raw,sqlalchemy]
    aiofragno --version

Also runs as ``python -m aiofragno``. ``--url`` defaults to ``$AIOFRAGNO_URL``. Errors print one line on stderr and
exit with status 1 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from . import __version__
from .bench import add_arguments as add_bench_arguments
from .bench import cmd_bench as run_bench_command
from .database import Database, connect
from .errors import Error
from .migration_plan import MigrationPlan
from .outbox.entry import OutboxEntry
from .outbox.relay import sink_for_url
from .outbox.tables import CONSUMERS_ID, DEAD_LETTERS_ID
from .outbox.versionstamp import check_versionstamp
from .row_types import render_module
from .schema import Schema
from .sql import Identifier, sql


class UsageError(Exception):
    """A mistake on the command line."""


def _url(args: argparse.Namespace) -> str:
    url: str | None = args.url or os.environ.get("AIOFRAGNO_URL")
    if not url:
        raise UsageError("no database URL: pass --url or set AIOFRAGNO_URL")
    return url


def schema_target(target: str) -> tuple[str, str]:
    """``module:attr`` split, or :class:`UsageError` unless both are Python
    names (``a.b``, ``..x:y``, ``x:``, ``:y`` are not)."""
    module_name, colon, attr = target.partition(":")
    names = module_name.split(".")
    if not (colon and all(n.isidentifier() for n in names) and attr.isidentifier()):
        raise UsageError(
            f"expected module:attr naming an af.Schema (e.g. app.schema:shop), got {target!r}"
        )
    return module_name, attr


def load_schema(target: str) -> Schema:
    """``module:attr`` -> the Schema it names. The module may live in the
    current directory, which is on ``sys.path`` only while it is imported:
    a file there named like a module aiofragno imports later (a driver, the
    standard library's) must not take its place. Import drivers first."""
    module_name, attr = schema_target(target)
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # whatever the module's own code raises, too
        raise UsageError(
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        if added:
            sys.path.remove(cwd)
    schema = getattr(module, attr, None)
    if not isinstance(schema, Schema):
        found = "nothing" if schema is None else type(schema).__name__
        raise UsageError(f"{target} is not an af.Schema (found {found})")
    return schema


async def cmd_migrate(args: argparse.Namespace) -> None:
    schema_target(args.schema)  # a malformed target fails before connecting
    if args.plan and (args.apply or args.dry_run):
        raise UsageError("--plan makes a plan and changes nothing: not with --apply or --dry-run")
    expected = None
    if args.apply:
        expected = MigrationPlan.from_json(await anyio.Path(args.apply).read_text("utf-8"))
    allow_drop = set(args.allow_drop or ())
    async with connect(_url(args)) as db:
        # Connected first: the driver is imported before the current directory
        # (where the schema's module may be) goes on sys.path.
        schema = load_schema(args.schema)
        if args.plan:
            plan = await db.migration_plan(
                schema, namespace=args.namespace, adopt=args.adopt, allow_drop=allow_drop
            )
            await _print_plan(plan, args.output)
            return
        result = await db.migrate(
            schema,
            namespace=args.namespace,
            dry_run=args.dry_run,
            adopt=args.adopt,
            allow_drop=allow_drop,
            plan=expected,
        )
    for statement in result.statements:
        print(statement.rstrip() + ";")
    for difference in result.left:
        print(f"-- left as it is: {escape_controls(str(difference))}", file=sys.stderr)
    verb = "would be" if args.dry_run else "now at"
    print(
        f"-- namespace {result.namespace}: schema version {verb} {result.version}", file=sys.stderr
    )


async def _print_plan(plan: MigrationPlan, output: str | None) -> None:
    """The plan for a reader on standard output; its JSON in ``output``
    (for ``--apply``)."""
    print("\n".join(escape_controls(line) for line in plan.text().splitlines()))
    if output is not None:
        await anyio.Path(output).write_text(plan.to_json(), "utf-8")
        print(f"-- plan {plan.id} written to {output}; run it with --apply", file=sys.stderr)


async def cmd_inspect(args: argparse.Namespace) -> None:
    url = args.database or _url(args)
    async with connect(url) as db:
        live = await db.inspect(namespace=args.namespace)
    # (JSON strings hold no line breaks: each line is escaped on its own.)
    text = json.dumps(dataclasses.asdict(live), indent=2)
    print("\n".join(escape_controls(line) for line in text.splitlines()))


# Characters a terminal acts on, or reorders the text around, instead of
# showing them: C0 and C1 controls, DEL, the Unicode bidirectional controls,
# line and paragraph separators; and lone surrogates, which UTF-8 cannot print.
_UNSAFE = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def escape_controls(text: str) -> str:
    """``text`` with each such character written as ``\\uXXXX``. JSON text
    (where they can only occur inside strings) stays valid JSON of the same value."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _entry_json(entry: OutboxEntry) -> str:
    """One JSON line for ``entry``, safe to print to a terminal."""
    return escape_controls(entry.to_json())


async def cmd_outbox_tail(args: argparse.Namespace) -> None:
    after = None if args.after is None else check_versionstamp(args.after, "--after")
    async with connect(_url(args)) as db:
        if args.follow:
            async for entry in db.outbox.tail(after=after, poll_interval=args.poll):
                print(_entry_json(entry), flush=True)
            return
        while True:
            entries = await db.outbox.list(after=after, limit=1000)
            for entry in entries:
                print(_entry_json(entry))
            if len(entries) < 1000:
                return
            after = entries[-1].versionstamp


async def cmd_outbox_relay(args: argparse.Namespace) -> None:
    after = None if args.after is None else check_versionstamp(args.after, "--after")
    options: dict[str, Any] = {}
    if args.stream is not None:
        options["stream"] = args.stream
    if args.max_in_flight is not None:
        options["max_in_flight"] = args.max_in_flight
    sink = sink_for_url(args.to, args.subject, **options)
    async with connect(_url(args)) as db:
        published = await db.outbox.relay(
            sink,
            batch_size=args.batch_size,
            poll_interval=args.poll,
            until_caught_up=args.until_caught_up,
            after=after,
        )
    print(json.dumps({"published": published}))


async def cmd_outbox_consumers(args: argparse.Namespace) -> None:
    async with connect(_url(args)) as db:
        names = [
            row["name"]
            for row in await db.fetch(
                sql("SELECT {n} FROM {t} ORDER BY {n}", n=Identifier("name"), t=CONSUMERS_ID)
            )
        ]
        letters = await db.fetch(
            sql(
                "SELECT {c} AS consumer, COUNT(*) AS n FROM {t} GROUP BY {c}",
                c=Identifier("consumer"),
                t=DEAD_LETTERS_ID,
            )
        )
        dead = {row["consumer"]: int(row["n"]) for row in letters}
        latest = await db.outbox.latest()
        print(json.dumps({"latest": latest}))
        for name in names:
            consumer = db.outbox.consumer(name)
            report = {
                "consumer": name,
                "cursor": await consumer.position(),
                "lag": await consumer.lag(),
                "dead_letters": dead.get(name, 0),
            }
            print(json.dumps(report))


async def cmd_doctor(args: argparse.Namespace) -> None:
    async with connect(_url(args)) as db:
        await doctor(db)


async def doctor(db: Database) -> None:
    engine = db._engine  # (the adapter is internal; doctor shows its flags)
    adapter = engine.adapter
    report: dict[str, Any] = {
        "url": db.url.describe(),
        "backend": db.backend,
        "healthy": await db.is_healthy(),
        "server_version": await db.fetch_value(engine.raw(adapter.sql.version)),
        "server_time": (await db.now()).isoformat(),
    }
    report["capabilities"] = {
        **dataclasses.asdict(adapter.capabilities),
        "outbox_version_strategy": adapter.outbox_version_strategy,
        "commit_plan": adapter.commit.plan,
        "default_naming": adapter.default_naming,
    }
    options = db.options
    report["pool"] = {
        "pool_size": db.pool_size,
        "acquire_timeout": options.acquire_timeout,
        "pre_ping": options.pre_ping,
        "max_lifetime": options.max_lifetime,
        "max_idle": options.max_idle,
    }
    report["servers"], warnings = await _servers(db)
    if warnings:
        report["warnings"] = warnings
    report["schema_versions"] = await _schema_versions(db)
    print(json.dumps(report, indent=2, default=str))


async def _servers(db: Database) -> tuple[list[str], list[str]]:
    """Each server's role, timeline and replay lag, and what
    in them needs attention: a URL whose only server refuses writes, a
    fenced stale primary, a server that does not answer."""
    servers = await db.servers()
    warnings = [f"{server.describe()}" for server in servers if server.error or server.fenced]
    writable = [s for s in servers if s.error is None and not s.read_only and not s.fenced]
    if servers and not writable:
        warnings.append(
            "no server of the URL accepts writes (standbys, replicas or read-only): writes fail with "
            "ReadOnlyDatabase; point the URL at the primary"
        )
    return [server.describe() for server in servers], warnings


async def _schema_versions(db: Database) -> dict[str, str]:
    try:
        rows = await db.fetch(
            sql(
                "SELECT {k} AS k, {v} AS v FROM fragno_db_settings",
                k=Identifier("key"),
                v=Identifier("value"),
            )
        )
    except Error:
        return {}  # never migrated: no settings table yet
    suffix = ".schema_version"
    return {r["k"][: -len(suffix)]: r["v"] for r in rows if r["k"].endswith(suffix)}


async def cmd_typegen(args: argparse.Namespace) -> None:
    source = render_module(load_schema(args.schema))
    if args.output is None:
        sys.stdout.write(source)
    else:
        await anyio.Path(args.output).write_text(source, encoding="utf-8")


async def cmd_bench(args: argparse.Namespace) -> None:
    await run_bench_command(args, args.url or os.environ.get("AIOFRAGNO_URL"))


async def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo

    await run_demo(
        args.url or os.environ.get("AIOFRAGNO_URL"), units=args.units, concurrency=args.concurrency
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiofragno", description="aiofragno: async database layer"
    )
    parser.add_argument("--version", action="version", version=f"aiofragno {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument(
        "--runtime",
        choices=["asyncio", "trio"],
        default="asyncio",
        help="the event loop to run the command on (default: asyncio)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(
        name: str, handler: Any, help: str, parent: Any = commands
    ) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = parent.add_parser(name, help=help)
        sub.set_defaults(handler=handler)
        sub.add_argument("--url", help="database URL (default: $AIOFRAGNO_URL)")
        return sub

    demo = command("demo", cmd_demo, "a tour: schema, migration, concurrent transfers, outbox")
    demo.add_argument("--units", type=int, default=400, help="transfers to run (default: 400)")
    demo.add_argument("--concurrency", type=int, default=16, help="transfers at once (default: 16)")
    migrate = command("migrate", cmd_migrate, "create or extend a schema's tables")
    migrate.add_argument("schema", help="module:attr of an af.Schema")
    migrate.add_argument(
        "--namespace", help="the namespace to create the tables in (default: the schema's name)"
    )
    migrate.add_argument("--dry-run", action="store_true", help="print the SQL, change nothing")
    migrate.add_argument(
        "--adopt",
        action="store_true",
        help="take over existing tables that are not aiofragno's, adding its columns",
    )
    migrate.add_argument(
        "--plan",
        action="store_true",
        help="print each step with its SQL and whether it locks, rewrites or destroys; "
        "change nothing",
    )
    migrate.add_argument("--output", "-o", help="with --plan: write the plan (JSON) to this file")
    migrate.add_argument(
        "--apply",
        metavar="FILE",
        help="run the plan in FILE (from --plan --output), refusing if the database changed",
    )
    migrate.add_argument(
        "--allow-drop",
        action="append",
        metavar="TABLE.NAME",
        help="let this column or index, no longer declared, be dropped (repeatable)",
    )
    inspect = command("inspect", cmd_inspect, "print the tables the database has, as JSON")
    inspect.add_argument(
        "database", nargs="?", metavar="URL", help="database URL (instead of --url)"
    )
    inspect.add_argument(
        "--namespace", help="only the tables migrated for this namespace (default: every table)"
    )
    typegen = commands.add_parser(
        "typegen", help="write a schema's row types (TypedDicts, for af.Table(..., row=...))"
    )
    typegen.set_defaults(handler=cmd_typegen)
    typegen.add_argument("schema", help="module:attr of an af.Schema")
    typegen.add_argument("--output", "-o", help="the file to write (default: standard output)")
    outbox = commands.add_parser("outbox", help="read the outbox").add_subparsers(
        dest="outbox_command", required=True
    )
    tail = command("tail", cmd_outbox_tail, "print entries as JSON lines", outbox)
    tail.add_argument("--after", help="start after this versionstamp")
    tail.add_argument("--follow", action="store_true", help="keep waiting for new entries")
    tail.add_argument(
        "--json", action="store_true", help="JSON lines (the default and only format)"
    )
    tail.add_argument(
        "--poll",
        type=float,
        default=0.5,
        help="with --follow: seconds between reads when there is nothing new (default: 0.5)",
    )
    command("consumers", cmd_outbox_consumers, "cursor, lag and dead letters per consumer", outbox)
    relay = command(
        "relay", cmd_outbox_relay, "publish entries to NATS JetStream or Redis Streams", outbox
    )
    relay.add_argument(
        "--to", required=True, help="the broker: nats://HOST:4222 or redis://HOST:6379/0"
    )
    relay.add_argument(
        "--subject", required=True, help="the NATS subject, or the Redis stream's key"
    )
    relay.add_argument("--stream", help="NATS: the stream (default: the one capturing --subject)")
    relay.add_argument(
        "--max-in-flight",
        type=int,
        help="NATS: messages awaiting acknowledgement at once (default: 256)",
    )
    relay.add_argument(
        "--batch-size", type=int, default=1000, help="entries read at a time (default: 1000)"
    )
    relay.add_argument(
        "--after", help="start after this versionstamp while the broker holds no entry yet"
    )
    relay.add_argument(
        "--until-caught-up", action="store_true", help="stop once every entry is published"
    )
    relay.add_argument(
        "--poll",
        type=float,
        default=0.5,
        help="seconds between reads when there is nothing new (default: 0.5)",
    )
    command("doctor", cmd_doctor, "connectivity, versions, capabilities, pool settings")
    bench = command("bench", cmd_bench, "the transfer workload: units/s, latency, conflicts")
    add_bench_arguments(bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        anyio.run(args.handler, args, backend=args.runtime)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`aiofragno outbox tail | head`): not an error.
        # Point stdout at nothing, so that flushing it at exit does not fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        if args.debug:
            raise
        print(f"aiofragno: error: {escape_controls(_describe(exc))}", file=sys.stderr)
        return 1
    return 0


def _describe(exc: Exception) -> str:
    """One line for ``exc``: its message, with its type unless it is one of
    the errors whose messages say what went wrong on their own."""
    if isinstance(exc, Error | UsageError | OSError | ValueError | RuntimeError) and str(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc} (--debug shows the traceback)"


if __name__ == "__main__":
    sys.exit(main())
