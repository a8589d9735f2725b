"""Client instructions per transfer unit, counted by callgrind: a measure of
aiofragno's own cost on each backend (driver included, server excluded) that
does not move with the machine's load, so two versions of the code can be
compared on a busy machine.

    python -m benchmarks.unit_instructions [--backend postgresql] [--outbox]
                                           [--tree DIR ...] [--json PATH]

For each ``--tree`` (a checkout or ``git archive`` of aiofragno; default: this
one) it runs the workload twice under ``valgrind --tool=callgrind``, with
``SMALL`` and ``LARGE`` units, and reports (total instructions of the large
run - of the small run) / (LARGE - SMALL): start-up, connecting and migrating
cancel out. The workload is one task running transfer units one after
another between two accounts (2 reads, 2 checked updates, 1 insert), through
aiofragno's public API only, so it runs on older versions of the code as well.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SMALL, LARGE = 100, 600
URLS = {
    "sqlite": None,  # a file in a temporary directory
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}


async def workload(backend: str, units: int, outbox: bool) -> None:
    """``units`` transfers on one task (run under callgrind by :func:`count`)."""
    import aiofragno as af

    shop = af.Schema(
        "unitinstr",
        af.Table("accounts", af.Column("owner", "string"), af.Column("balance", "bigint")),
        af.Table(
            "transfers",
            af.Reference("src", "accounts"),
            af.Reference("dst", "accounts"),
            af.Column("amount", "bigint"),
        ),
    )
    with tempfile.TemporaryDirectory() as tmp:
        url = URLS[backend] or f"sqlite:///{tmp}/unitinstr.db"
        async with af.connect(url, outbox=outbox) as db:
            namespace = f"unitinstr{os.getpid()}"
            await db.migrate(shop, namespace=namespace)

            async def open_accounts(uow: Any) -> None:
                uow.create("accounts", {"owner": "a", "balance": 1_000_000})
                uow.create("accounts", {"owner": "b", "balance": 1_000_000})

            async def transfer(uow: Any) -> None:
                a = uow.find_first("accounts", where={"owner": "a"})
                b = uow.find_first("accounts", where={"owner": "b"})
                await uow.retrieve()
                ra, rb = a.result, b.result
                uow.update("accounts", ra["id"], {"balance": ra["balance"] - 1}, check=True)
                uow.update("accounts", rb["id"], {"balance": rb["balance"] + 1}, check=True)
                uow.create("transfers", {"src": ra["id"], "dst": rb["id"], "amount": 1})

            await db.execute_uow(open_accounts, schema=shop, namespace=namespace)
            for _ in range(units):
                await db.execute_uow(transfer, schema=shop, namespace=namespace)


def count(tree: Path, backend: str, units: int, outbox: bool) -> int:
    """Total instructions callgrind counts for :func:`workload` on ``tree``'s code."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            sys.executable, str(Path(__file__).resolve()), "--run", str(units),
            "--backend", backend, *(["--outbox"] if outbox else []),
        ]  # fmt: skip
        # Run as a script, so that aiofragno comes from ``tree`` alone.
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run(command, env=env, check=True, capture_output=True, cwd=tmp)
        summary = re.search(r"^summary: (\d+)", out.read_text(), re.MULTILINE)
        if summary is None:
            raise RuntimeError(f"no summary line in {out}")
        return int(summary[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="postgresql", choices=list(URLS))
    parser.add_argument("--outbox", action="store_true")
    parser.add_argument("--tree", action="append", type=Path, help="code to measure")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)  # the measured process
    args = parser.parse_args()
    if args.run is not None:
        asyncio.run(workload(args.backend, args.run, args.outbox))
        return
    trees = args.tree or [Path(__file__).resolve().parent.parent]
    results = []
    for tree in trees:
        started = time.monotonic()
        small, large = (count(tree, args.backend, n, args.outbox) for n in (SMALL, LARGE))
        per_unit = (large - small) / (LARGE - SMALL)
        results.append({"tree": str(tree), "instructions_per_unit": round(per_unit)})
        print(f"{tree}: {per_unit:,.0f} instructions per unit ({time.monotonic() - started:.0f} s)")
    if args.json:
        config = {"backend": args.backend, "outbox": args.outbox, "small": SMALL, "large": LARGE}
        args.json.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
