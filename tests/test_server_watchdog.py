"""A private test server (tests/servers.py) does not outlive the test
process: killed without a chance to clean up, its watchdog stops the server
and removes its directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import required_dialects
from tests.server_watchdog import alive
from tests.servers import SERVERS, ServerUnavailable

ROOT = Path(__file__).resolve().parent.parent
HOLDER = """
import sys, time
from tests.servers import SERVERS
server = SERVERS[sys.argv[1]]()
server.create_blocking()
print(server.directory, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("dialect", list(SERVERS))
def test_server_of_a_killed_test_process_is_removed(dialect: str) -> None:
    try:
        SERVERS[dialect]().close()  # (installed? and no server started)
    except ServerUnavailable as exc:
        if dialect in required_dialects():
            pytest.fail(f"{exc}; AIOFRAGNO_REQUIRE_BACKENDS requires {dialect}")
        pytest.skip(str(exc))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, dialect], cwd=ROOT, env=env, stdout=subprocess.PIPE
    ) as holder:
        assert holder.stdout is not None
        directory = Path(holder.stdout.readline().decode().strip())
        pid = int((directory / "server.pid").read_text())
        assert alive(pid)
        holder.kill()
    deadline = time.monotonic() + 10
    while (alive(pid) or directory.exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), f"server {pid} still runs"
    assert not directory.exists(), f"{directory} is still there"
