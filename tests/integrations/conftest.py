"""Fixtures of the framework integration tests (helpers in integration_support.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from .integration_support import DAEMON_READY_S, daemon_command, daemon_config, daemon_ticking


@pytest.fixture
def daemon(sqlite_url, tmp_path):
    """The real `agent-watchdog run --config FILE --db URL`, up and ticking; stopped afterwards."""
    config = tmp_path / "watchdog.toml"
    config.write_text(daemon_config())
    log_path = tmp_path / "daemon.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*daemon_command(), "run", "--config", str(config), "--db", sqlite_url],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
        )

    def output() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    try:
        deadline = time.monotonic() + DAEMON_READY_S
        while not daemon_ticking(sqlite_url):
            if proc.poll() is not None:
                pytest.fail(f"agent-watchdog run exited with {proc.returncode} before ticking:\n{output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"agent-watchdog run published no lease nor settings in {DAEMON_READY_S:g} s:\n{output()}")
            time.sleep(0.05)
        proc.output = output
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@pytest.fixture
def wd(sqlite_url):
    """A Watchdog on the test's migrated SQLite store, closed afterwards."""
    from watchdog import Watchdog

    handle = Watchdog(sqlite_url)
    yield handle
    handle.close()
