"""Where a transfer unit's time goes: aiofragno's own code vs the driver.

Runs two variants of ``benchmarks.transfer`` (``--compare``, default
``aiofragno,raw``; ``aiofragno+outbox,aiofragno`` shows what the outbox adds)
at ``--concurrency`` (default 1, after a warm-up) under a profiler:

* ``cprofile`` (default; the two variants alternate in chunks of the run):
  own time (tottime) of the event-loop thread grouped by area (each aiofragno
  module, the driver, asyncio, anyio, waiting in epoll or on a lock, the
  harness), in microseconds per unit and % of the profiled time, for both
  variants side by side; the functions that account for the difference; and
  aiofragno's own top functions in the first variant. The deterministic profiler inflates
  Python-heavy code, so read the per-unit *differences* between the variants
  rather than absolute numbers.
* ``pyinstrument``: a sampling call tree of the first variant (less
  distortion; time in the driver's threads shows as waiting), and the wall
  and CPU time per unit of both variants.

    python -m benchmarks.profile_transfer --backend sqlite|postgresql|mysql \\
        [--units 2000] [--concurrency 1] [--profiler cprofile|pyinstrument] \\
        [--compare aiofragno,raw]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiofragno as af

from . import _common as common
from .transfer import VARIANTS, Variant, run

DRIVERS = ("asyncpg", "aiosqlite", "asyncmy", "sqlalchemy")


def area(filename: str, function: str) -> str:
    """The part of the stack a function belongs to."""
    if "/aiofragno/" in filename:
        return "aiofragno/" + filename.rsplit("/aiofragno/", 1)[1]
    for driver in DRIVERS:
        if f"/{driver}/" in filename:
            return f"driver: {driver}"
    if "/anyio/" in filename:
        return "anyio"
    if "/asyncio/" in filename:
        return "asyncio"
    if "/benchmarks/" in filename:
        return "benchmark harness"
    if "select.epoll" in function or "poll" in function:
        return "waiting (epoll: I/O, threads)"
    if "_thread.lock" in function or "acquire" in function:
        return "waiting (lock)"
    if "sqlite3" in function:
        return "driver: sqlite3 (C)"
    if "asyncpg" in function or "asyncmy" in function:
        return "driver (C)"
    if filename == "~":
        return "builtins"
    return "other Python"


def by_area(stats: pstats.Stats) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for (filename, _, function), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        totals[area(filename, function)] += tottime
    return totals


async def profiled(
    variants: dict[str, Variant], units: int, concurrency: int, chunks: int = 8
) -> dict[str, pstats.Stats]:
    """Profile each variant over ``units`` units, in interleaved chunks (so
    that load from elsewhere on the machine hits them alike)."""
    profilers = {name: cProfile.Profile() for name in variants}
    work = common.plan(units, seed=3)
    size = -(-units // chunks)
    for start in range(0, units, size):
        for name, variant in variants.items():
            profilers[name].enable()
            await run(variant, work[start : start + size], concurrency)
            profilers[name].disable()
    return {name: pstats.Stats(p) for name, p in profilers.items()}


async def cprofile_report(
    variants: dict[str, Variant], admin: af.Database, units: int, concurrency: int
) -> None:
    await common.reset(admin)
    stats = await profiled(variants, units, concurrency)
    first, second = variants
    areas = {name: by_area(s) for name, s in stats.items()}
    totals = {name: sum(a.values()) for name, a in areas.items()}
    names = sorted({k for a in areas.values() for k in a}, key=lambda k: -areas[first].get(k, 0))
    print(
        f"\ncProfile, {units} units at concurrency {concurrency}: own time per unit (us) and share"
    )
    rows = []
    for key in names:
        row: list[Any] = [key]
        for name in variants:
            t = areas[name].get(key, 0.0)
            row += [t / units * 1e6, f"{100 * t / totals[name]:.1f}%"]
        rows.append(row)
    rows.append(["total", *[x for n in variants for x in (totals[n] / units * 1e6, "100%")]])
    common.print_table(
        ["area", *[h for n in variants for h in (f"{n} us", "%")]],
        rows,
    )
    print(f"\nwhat {first} adds: functions by own time per unit, {first} minus {second} (top 25):")
    per_fn = {
        name: {
            key: (calls / units, tottime / units * 1e6)
            for key, (_, calls, tottime, _, _) in s.stats.items()  # type: ignore[attr-defined]
        }
        for name, s in stats.items()
    }
    a, b = per_fn[first], per_fn[second]
    deltas = sorted(
        ((a.get(k, (0, 0.0))[1] - b.get(k, (0, 0.0))[1], k) for k in set(a) | set(b)),
        reverse=True,
    )
    common.print_table(
        ["function", "area", f"calls/unit {first}", second, f"us/unit {first}", second, "delta us"],
        [
            [
                f"{Path(k[0]).name}:{k[1]}({k[2]})"[:70],
                area(k[0], k[2]),
                a.get(k, (0, 0.0))[0],
                b.get(k, (0, 0.0))[0],
                a.get(k, (0, 0.0))[1],
                b.get(k, (0, 0.0))[1],
                delta,
            ]
            for delta, k in deltas[:25]
        ],
    )
    print(f"\naiofragno's own functions in {first}, by own time (top 25):")
    s = stats[first]
    own = [
        (tottime, calls, f"{Path(f).name}:{line}({fn})")
        for (f, line, fn), (_, calls, tottime, _, _) in s.stats.items()  # type: ignore[attr-defined]
        if "/aiofragno/" in f
    ]
    own.sort(reverse=True)
    aio_total = totals[first]
    common.print_table(
        ["function", "calls/unit", "us/unit", "% of all"],
        [
            [name, calls / units, t / units * 1e6, f"{100 * t / aio_total:.1f}%"]
            for t, calls, name in own[:25]
        ],
    )


async def pyinstrument_report(
    variants: dict[str, Variant], admin: af.Database, units: int, concurrency: int
) -> None:
    from pyinstrument import Profiler

    summary = []
    for name, variant in variants.items():
        await common.reset(admin)
        profiler = Profiler(interval=0.0002, async_mode="disabled")
        profiler.start()
        await run(variant, common.plan(units, seed=3), concurrency)
        session = profiler.stop()
        summary.append(
            f"{name}: {session.duration / units * 1e6:.0f} us wall, "
            f"{session.cpu_time / units * 1e6:.0f} us CPU per unit"
        )
        if name == next(iter(variants)):
            print(profiler.output_text(unicode=False, color=False, show_all=False))
    print("\n".join(summary))


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_transfer")
    parser.add_argument("--backend", default="sqlite", choices=common.BACKENDS)
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--profiler", default="cprofile", choices=("cprofile", "pyinstrument"))
    parser.add_argument(
        "--compare",
        default="aiofragno,raw",
        help="two variant names of benchmarks.transfer, e.g. aiofragno+outbox,aiofragno",
    )
    args = parser.parse_args(argv)
    compare = args.compare.split(",")
    if len(compare) != 2:
        parser.error("--compare takes two variant names separated by a comma")
    with tempfile.TemporaryDirectory(prefix="aiofragno-bench-") as tmp:
        async with common.target(args.backend, Path(tmp)) as target:
            if target is None:
                raise SystemExit(1)
            admin = await af.connect(target.url, pool_size=1)
            found = {v.name: v for v in (make(target) for make in VARIANTS[args.backend])}
            unknown = [name for name in compare if name not in found]
            if unknown:
                raise SystemExit(f"unknown variant(s) {unknown}; choose from {sorted(found)}")
            variants = {name: found[name] for name in compare}
            try:
                await common.prepare(admin)
                for v in variants.values():
                    await v.open(admin)
                    await run(v, common.plan(args.warmup, seed=-1), 1)
                if args.profiler == "cprofile":
                    await cprofile_report(variants, admin, args.units, args.concurrency)
                else:
                    await pyinstrument_report(variants, admin, args.units, args.concurrency)
            finally:
                for v in variants.values():
                    await v.close()
                await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
