"""The wall clock jumps ±1 h under a running daemon (libfaketime), real processes throughout.

The daemon (`agent-watchdog run`) runs under libfaketime with a timestamp file this test
rewrites mid-run; the monotonic clock is left alone (FAKETIME_DONT_FAKE_MONOTONIC), as a
real step of the wall clock (NTP, `date -s`) leaves it. A healthy run and a runaway run
are real agent processes.

SQLite (one host): the agents share the daemon's faked clock, as processes of one host
share its clock. After +1 h the healthy run completes (not stopped for wall_clock) and the
runaway is stopped by its step budget; after -1 h the runaway is stopped too (the tick goes
on: the old APScheduler loop slept for the hour). PostgreSQL: the daemon's `now` and the
SDK's times come from the database server's clock, so a jump of the daemon's own clock
changes nothing at all: no jump is even seen.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from agent_procs import wait_until
from daemon_support import alerts_of, daemon_toml, run_row
from watchdog.store.engine import make_engine
from watchdog.store.schema import interventions

pytestmark = pytest.mark.slow

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
CLI = str(Path(sys.executable).with_name("agent-watchdog"))
TICK_S = 0.5
WAIT_S = 60.0

if not os.path.exists(LIBFAKETIME):  # .ci/run installs the Debian package `faketime`
    pytest.fail(f"libfaketime is not installed ({LIBFAKETIME}): apt-get install faketime", pytrace=False)


# The agents (real processes). They wait with threading.Event, never time.sleep: under
# libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC, Python's time.sleep (an absolute
# clock_nanosleep on the monotonic clock) fails with EINVAL; a condition wait does not.
AGENT = r"""
import json, os, sys, threading
from watchdog import RunKilled, Watchdog
kind, url, ready, result, go = sys.argv[1:6]
pause = threading.Event().wait


def say(path, data):  # atomic: the test never reads half a file
    open(path + ".tmp", "w").write(json.dumps(data))
    os.replace(path + ".tmp", path)


wd = Watchdog(url, attest_socket="")
out = {}
try:
    if kind == "healthy":  # alive all along (a heartbeat every 0.2 s), done when told
        with wd.run(agent="healthy", guards=False) as run:
            run.step(model="gpt-x", tokens_in=10, tokens_out=5)
            say(ready, {"run_id": run.id})
            while not os.path.exists(go):
                run.heartbeat("working")
                pause(0.2)
            run.step(model="gpt-x", tokens_in=10, tokens_out=5)
        out = {"status": run.status}
    else:  # a step every 0.25 s until stopped
        with wd.run(agent="runaway", guards=False, max_steps=30) as run:
            run.step(model="gpt-x", tokens_in=10, tokens_out=5)
            say(ready, {"run_id": run.id})
            while True:
                run.step(model="gpt-x", tokens_in=10, tokens_out=5)
                pause(0.25)
except RunKilled as stop:
    out = {"killed": stop.reason}
finally:
    wd.close()
say(result, out)
"""


class AgentProc:
    def __init__(self, kind: str, url: str, folder: Path, go: Path, env: dict):
        self.ready_path, self.result_path, self.log_path = (folder / f"{kind}.{x}" for x in ("ready", "result", "log"))
        full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG")}
        full.update(env)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", AGENT, kind, url, str(self.ready_path),
                                          str(self.result_path), str(go)], env=full, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        ok = wait_until(lambda: self.ready_path.exists() or self.proc.poll() is not None, WAIT_S)
        assert ok and self.ready_path.exists(), self.log()
        self.run_id = json.loads(self.ready_path.read_text())["run_id"]

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def result(self) -> dict | None:
        return json.loads(self.result_path.read_text()) if self.result_path.exists() else None

    def wait(self) -> int:
        return self.proc.wait(timeout=WAIT_S)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=WAIT_S)


class FakeClock:
    """A wall-clock offset that processes started with `env()` follow, rewritten at will."""

    def __init__(self, folder: Path):
        self.file = folder / "faketime"
        self.set("+0")

    def set(self, offset: str) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(offset + "\n")
        tmp.replace(self.file)  # atomic: a reader never sees an empty file

    def env(self) -> dict:
        return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME_TIMESTAMP_FILE": str(self.file), "FAKETIME_NO_CACHE": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


class DaemonProc:
    def __init__(self, url: str, folder: Path, clock: FakeClock):
        self.log_path = folder / "daemon.log"
        cfg = folder / "watchdog.toml"
        # keep_days = 0: no retention pass (its pacing sleeps with time.sleep, see AGENT).
        cfg.write_text(daemon_toml(tick_s=TICK_S) + "[store]\nkeep_days = 0\n"
                       "[defaults]\nmax_wall_s = 300\nheartbeat_timeout_s = 120\nmax_steps = 40\n"
                       "[prices.\"gpt-x\"]\ninput_eur_per_mtok = 0.0\noutput_eur_per_mtok = 0.0\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG")}
        env.update(clock.env())
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([CLI, "--config", str(cfg), "--db", url, "run", "-v"], env=env,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return self.log_path.read_text()

    def ticks(self) -> int:
        return self.log().count("tick: ")

    def wait_ticks(self, n: int) -> None:
        start = self.ticks()
        assert wait_until(lambda: self.ticks() >= start + n, WAIT_S), self.log()[-3000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the daemon did not exit on SIGTERM\n{self.log()[-3000:]}") from None


def scenario(url: str, tmp_path: Path, offset: str) -> str:
    """Daemon and agents on one faked clock; the clock jumps by `offset` while they run.
    Returns the daemon's log."""
    clock = FakeClock(tmp_path)
    daemon = DaemonProc(url, tmp_path, clock)
    engine = make_engine(url)
    agents: list[AgentProc] = []
    try:
        daemon.wait_ticks(2)
        go = tmp_path / "go"
        healthy = AgentProc("healthy", url, tmp_path, go, clock.env())
        agents.append(healthy)
        runaway = AgentProc("runaway", url, tmp_path, go, clock.env())
        agents.append(runaway)
        daemon.wait_ticks(2)
        clock.set(offset)  # the wall clock jumps under the daemon and the agents
        daemon.wait_ticks(4)  # the tick goes on (the old scheduler slept through a -1 h jump)
        # The runaway: stopped by its step budget, whatever the clock did.
        assert wait_until(lambda: runaway.result() is not None, WAIT_S), daemon.log()[-3000:] + runaway.log()
        assert runaway.result() == {"killed": "max_steps"}, (runaway.result(), daemon.log()[-3000:])
        assert run_row(engine, runaway.run_id).stop_reason == "max_steps"
        daemon.wait_ticks(4)  # ticks after the jump judged the healthy run too
        go.touch()
        assert runaway.wait() == 0 and healthy.wait() == 0, healthy.log()
        assert healthy.result() == {"status": "completed"}, (healthy.result(), daemon.log()[-3000:])
        row = run_row(engine, healthy.run_id)
        assert (row.status, row.stop_reason) == ("completed", None)
        with engine.connect() as conn:
            acted = conn.execute(select(interventions.c.action, interventions.c.reason)
                                 .where(interventions.c.run_id == healthy.run_id)).all()
        assert acted == [], acted  # never judged over its wall-clock or silence budget
        assert daemon.stop() == 0, daemon.log()[-3000:]
        return daemon.log()
    finally:
        for agent in agents:
            agent.kill()
        daemon.stop()
        engine.dispose()


@pytest.mark.parametrize("offset", ["+1h", "-1h"])
def test_a_clock_jump_neither_stops_the_healthy_run_nor_spares_the_runaway(db_url, tmp_path, offset):
    log = scenario(db_url, tmp_path, offset)
    engine = make_engine(db_url)
    try:
        clock_alerts = [a for a in alerts_of(engine) if a.dedupe_key.startswith("clock:")]
    finally:
        engine.dispose()
    jumps = [line for line in log.splitlines() if "WARNING watchdog.daemon:" in line and "jumped" in line]
    if db_url.startswith("sqlite"):  # one host, one clock: the jump is seen, logged and alerted once
        sign = offset[0]
        assert len(jumps) == 1 and f"jumped {sign}36" in jumps[0] and "2 active run(s)" in jumps[0], log[-3000:]
        (alert,) = clock_alerts
        assert f"clock jump of {sign}36" in alert.title and alert.mac, alert
    else:  # the database server's clock did not move: nothing to see, nothing to correct
        assert jumps == [] and "jumped" not in log and clock_alerts == [], log[-3000:]


RECORDER = r"""
import sys
from watchdog import Watchdog
wd = Watchdog(sys.argv[1], attest_socket="")
with wd.run(agent="skewed", guards=False) as run:
    run.step(model="gpt-x", tokens_in=1, tokens_out=1)
    run.heartbeat("here")
wd.close()
print(run.id)
"""


def test_the_sdk_writes_the_stores_clock_whatever_its_hosts_clock_says(db_url):
    """An agent host whose clock is an hour behind: on PostgreSQL its run's times are the
    database server's (nothing to skew); on SQLite (one host) they are the host's own."""
    from watchdog.store.schema import events, runs, utcnow

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG")}
    env.update(LD_PRELOAD=LIBFAKETIME, FAKETIME="-1h")
    t0 = utcnow()
    done = subprocess.run([sys.executable, "-c", RECORDER, db_url], env=env, capture_output=True, text=True,
                          timeout=WAIT_S)
    t1 = utcnow()
    assert done.returncode == 0, done.stderr
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(select(runs).where(runs.c.id == done.stdout.strip())).one()
            q = select(events.c.at).where(events.c.run_id == row.id).order_by(events.c.seq)
            ats = [e.at for e in conn.execute(q)]
    finally:
        engine.dispose()
    times = [row.started_at, row.last_seen_at, row.ended_at, *ats]
    assert len(ats) == 2
    hour = dt.timedelta(hours=1)
    if db_url.startswith("postgresql"):
        assert all(t0 <= t <= t1 for t in times), (t0, times, t1)
    else:
        assert all(t0 - hour <= t <= t1 - hour for t in times), (t0, times, t1)
    assert row.started_at <= ats[0] <= ats[1] <= row.last_seen_at <= row.ended_at
