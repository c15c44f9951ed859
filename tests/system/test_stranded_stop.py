"""No run stays stranded in `stopping` (issue 36, item 2). A real daemon, run as root but without
CAP_KILL (`setpriv --bounding-set -kill`), against the agent of another real user: it says at
start that it cannot signal that user, and its stop, refused with EPERM, is not final: the next
daemon, started with the capability, signals it. A stop refused for another reason (the user was
not in allowed_users) is driven again by root's `agent-watchdog kill`, not answered "the daemon
is on it"."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from agent_procs import AgentProcs, wait_until
from attest_support import LocalUsers, shared_sqlite, short_dir
from daemon_support import actions, interventions_of, run_row, wait_ticks
from test_daemon import AGENT_WATCHDOG
from watchdog.core import lifecycle as lc
from watchdog.core.periods import utcnow
from watchdog.daemon.stops.redrive import DENIED
from watchdog.store.engine import make_engine

WAIT_S = 60


@pytest.fixture(scope="module")
def users():
    made = LocalUsers()
    try:
        yield {"agent": made.add("agent"), "other": made.add("other")}
    finally:
        made.close()


@pytest.fixture
def world(tmp_path, monkeypatch):
    url, folder = shared_sqlite()
    state = short_dir("awst")
    state.chmod(0o711)  # agents reach the socket; the key stays 0600
    monkeypatch.setenv("AGENT_WATCHDOG_SOCKET", str(state / "attest.sock"))
    procs_dir = short_dir("awp")
    procs_dir.chmod(0o777)
    procs = AgentProcs(procs_dir)
    engine = make_engine(url)
    started: list[subprocess.Popen] = []

    def daemon(allowed: list[str], *, cap_kill: bool, name: str) -> tuple[subprocess.Popen, Path]:
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(f'[store]\nurl = "{url}"\n\n[daemon]\ntick_s = 0.2\ncancel_grace_s = 0.5\nterm_grace_s = 0.5\n'
                       f'allowed_users = {allowed!r}\nstate_dir = "{state}"\nsocket = "{state / "attest.sock"}"\n'
                       .replace("'", '"'))
        log = tmp_path / f"{name}.log"
        argv = [AGENT_WATCHDOG, "run", "--config", str(cfg)]
        if not cap_kill:
            argv = ["setpriv", "--bounding-set", "-kill", "--", *argv]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
        with open(log, "w") as f:
            p = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        started.append(p)
        assert wait_until(lambda: (state / "attest.sock").exists() or p.poll() is not None, WAIT_S), log.read_text()
        return p, log

    def stop(p: subprocess.Popen) -> None:
        p.terminate()
        p.wait(timeout=WAIT_S)
        (state / "attest.sock").unlink(missing_ok=True)

    yield {"url": url, "engine": engine, "procs": procs, "daemon": daemon, "stop": stop, "tmp": tmp_path}
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()
    procs.close()
    engine.dispose()
    for d in (folder, state, procs_dir):
        shutil.rmtree(d, ignore_errors=True)


def _kill(run_id: str, cfg: Path) -> subprocess.CompletedProcess:
    return subprocess.run([AGENT_WATCHDOG, "kill", run_id[:8], "--config", str(cfg)], capture_output=True,
                          text=True, timeout=WAIT_S)


def test_a_refused_signal_is_retried_and_kill_drives_a_stuck_stop_again(world, users):
    assert os.geteuid() == 0  # CI runs as root
    engine, procs = world["engine"], world["procs"]
    d1, log1 = world["daemon"]([users["agent"]], cap_kill=False, name="nocap")
    agent = procs.start("runaway", world["url"], user=users["agent"], kill_mode="process",
                        budgets={"max_steps": 2}, steps=3, then="attest_then_hang")

    # Without CAP_KILL: said once at start, the stop held (stage NULL), not final.
    assert wait_until(lambda: DENIED in [i.outcome for i in interventions_of(engine, agent.run_id)], WAIT_S), \
        log1.read_text()
    text = log1.read_text()
    assert f"cannot signal the processes of {users['agent']}" in text and "--ambient-caps +kill" in text, text
    row = run_row(engine, agent.run_id)
    assert (row.status, row.signal_stage) == (lc.STOPPING, None) and agent.alive()
    done = _kill(agent.run_id, world["tmp"] / "nocap.toml")
    assert done.returncode == 0, done.stderr
    assert "driven again" in done.stdout and "permission denied" in done.stdout, done.stdout
    world["stop"](d1)
    assert agent.alive()

    # Restarted with the capability: the same stop is retried, and the runaway is gone.
    d2, log2 = world["daemon"]([users["agent"]], cap_kill=True, name="cap")
    assert agent.wait(timeout_s=WAIT_S) is not None, log2.read_text()
    assert wait_until(lambda: run_row(engine, agent.run_id).status == lc.KILLED, WAIT_S), log2.read_text()
    assert "sigterm" in actions(engine, agent.run_id)
    assert "cannot signal" not in log2.read_text()

    # Refused for a user outside allowed_users: waits (`refused`) until the operator drives it again.
    other = procs.start("runaway", world["url"], user=users["other"], kill_mode="process",
                        budgets={"max_steps": 2}, steps=3, then="attest_then_hang")
    assert wait_until(lambda: run_row(engine, other.run_id).signal_stage == lc.Stage.REFUSED, WAIT_S), \
        log2.read_text()
    world["stop"](d2)
    d3, log3 = world["daemon"]([users["agent"], users["other"]], cap_kill=True, name="fixed")
    # A store writer's own redrive row (no seal of the daemon's key) drives nothing.
    with sqlite3.connect(world["url"].removeprefix("sqlite:///")) as conn:
        conn.execute("INSERT INTO alerts (dedupe_key, created_at, run_id, title, body, attempts, delivered_targets, "
                     "sealed_by, mac) VALUES (?, ?, ?, 't', 'b', 0, '[]', 'x', ?)",
                     (f"redrive:{other.run_id}:forged", utcnow().isoformat(), other.run_id, "0" * 64))
        conn.execute("UPDATE runs SET signal_stage = signal_stage WHERE id = ?", (other.run_id,))
    wait_ticks(engine, 2)  # two ticks of d3 ended after the forged rows: nothing may have driven it meanwhile
    assert other.alive() and run_row(engine, other.run_id).signal_stage == lc.Stage.REFUSED
    done = _kill(other.run_id, world["tmp"] / "fixed.toml")
    assert done.returncode == 0, done.stderr
    assert "the daemon is on it" not in done.stdout and "driven again" in done.stdout, done.stdout
    assert other.wait(timeout_s=WAIT_S) is not None, log3.read_text()
    assert wait_until(lambda: run_row(engine, other.run_id).status == lc.KILLED, WAIT_S), log3.read_text()
    assert actions(engine, other.run_id)[-3:] == ["stop_redriven", "sigterm", "ended"], actions(engine, other.run_id)
    world["stop"](d3)
    assert "Traceback" not in log1.read_text() + log2.read_text() + log3.read_text()
