"""Issue 20, attack 1: the daemon's lease is a flock on a file of its own, never a store row.

A store writer pointed the `daemons` row at a `sleep` of its own: the daemon lost its lease
and exited 1, and its restart exited 0 ("another daemon is already watching"), so systemd
left it down for good. Here a real daemon (`agent-watchdog run`) keeps watching through the
same rewrite, stops a runaway afterwards, and a second daemon exits 0 only while the first
really holds the lock; once the first is killed (SIGKILL: no release), the next one runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select, update

from agent_procs import wait_until
from attest_support import short_dir
from daemon_support import ME, run_row
from watchdog.core import lifecycle as lc
from watchdog.daemon.leases.hostlock import HostLock, HostLockHeld
from watchdog.store.memory import store_key
from watchdog.store.schema import daemons, utcnow

AGENT_WATCHDOG = str(Path(sys.executable).parent / "agent-watchdog")
DEADLINE_S = 60


def _toml(path: Path, url: str, state: Path) -> Path:
    path.write_text(
        f'[store]\nurl = "{url}"\n\n'
        "[daemon]\ntick_s = 0.2\ncancel_grace_s = 0.5\nterm_grace_s = 0.5\n"
        f'allowed_users = ["{ME}"]\nkey_file = "{state / "attest.key"}"\nsocket = "{state / "attest.sock"}"\n'
        f'state_dir = "{state}"\n')
    return path


def _start(cfg: Path, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    with open(log, "w") as f:
        return subprocess.Popen([AGENT_WATCHDOG, "run", "--config", str(cfg)], env=env, stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _last_tick(engine, pid):
    with engine.connect() as conn:
        row = conn.execute(select(daemons.c.pid, daemons.c.last_tick_at)).first()
    return row.last_tick_at if row is not None and row.pid == pid else None


@pytest.fixture
def daemons_started():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_rewritten_daemons_row_neither_stops_nor_shuts_out_the_daemon(db_url, engine, tmp_path, wd,
                                                                        daemons_started):
    state = short_dir()
    cfg = _toml(tmp_path / "wd.toml", db_url, state)
    first = _start(cfg, tmp_path / "first.log")
    daemons_started.append(first)
    assert wait_until(lambda: _last_tick(engine, first.pid) is not None, DEADLINE_S), (tmp_path / "first.log").read_text()
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        import psutil

        far = utcnow().replace(year=2099)
        with engine.begin() as conn:  # the attack: the row names the attacker's own process
            conn.execute(update(daemons).values(pid=sleeper.pid, pid_create_time=psutil.Process(sleeper.pid).create_time(),
                                                expires_at=far))
        # The daemon writes its row again and goes on ticking...
        assert wait_until(lambda: _last_tick(engine, first.pid) is not None, DEADLINE_S)
        seen = _last_tick(engine, first.pid)
        assert wait_until(lambda: (_last_tick(engine, first.pid) or seen) > seen, DEADLINE_S)
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        # ...and still stops a runaway started after the attack.
        run = wd.run(agent="bot", max_steps=5, guards=False).start()
        for _ in range(8):
            run.step(model="gpt-x", tokens_in=1, tokens_out=1)
        assert wait_until(lambda: run_row(engine, run.id).status != lc.RUNNING, DEADLINE_S)
        assert run_row(engine, run.id).stop_reason == lc.MAX_STEPS

        # A second daemon exits 0 only because the first holds the lock file (its pid is named).
        second = subprocess.run([AGENT_WATCHDOG, "run", "--config", str(cfg)], capture_output=True, text=True,
                                timeout=120)
        assert second.returncode == 0, second.stderr
        assert f"another agent-watchdog daemon (pid {first.pid}" in second.stderr
        assert "is already watching this store" in second.stderr

        # The first dies without releasing anything: the lock goes with it, the next one runs
        # (exit 0 would leave the store unwatched under systemd's Restart=on-failure).
        first.send_signal(signal.SIGKILL)
        first.wait()
        third = _start(cfg, tmp_path / "third.log")
        daemons_started.append(third)
        assert wait_until(lambda: _last_tick(engine, third.pid) is not None, DEADLINE_S), \
            (tmp_path / "third.log").read_text()
        assert third.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_lock_file_is_per_store_private_and_named_without_the_password(tmp_path):
    state = str(tmp_path / "state")
    a = HostLock(state, "postgresql+psycopg://aw:secret@db.example/aw")
    b = HostLock(state, "postgresql+psycopg://aw:other@db.example/aw")  # the same store, another password
    c = HostLock(state, "postgresql+psycopg://aw:secret@db.example/other")
    assert a.path == b.path != c.path
    assert "secret" not in a.path and store_key("postgresql+psycopg://aw:x@db.example/aw") in a.path
    a.acquire()
    try:
        assert oct(os.stat(a.path).st_mode & 0o777) == "0o600"
        assert oct(os.stat(state).st_mode & 0o777) == "0o700"
        with pytest.raises(HostLockHeld) as held:
            b.acquire()  # flock is per open file: a second descriptor of this very process is refused too
        assert held.value.pid == os.getpid()
        c.acquire()  # another store: its own lock
        c.release()
        # lockf would be dropped by any close of the file: opening and closing it leaves the flock held
        os.close(os.open(a.path, os.O_RDONLY))
        with pytest.raises(HostLockHeld):
            b.acquire()
    finally:
        a.release()
    b.acquire()  # released: taken at once
    b.release()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_session_squatting_the_host_lock_does_not_make_the_daemon_exit(db_url, engine, tmp_path):
    """Any store session can take an advisory lock: it is no proof of another daemon. The file
    lock is; the daemon watches, and takes the host lock once the squatter lets go."""
    from daemon_support import config
    from watchdog.daemon.stops.killer import Killer
    from watchdog.daemon.process.service import Daemon
    from watchdog.store import leases

    squatter = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        assert leases.try_lock(squatter, leases.host_key("squatted"))
        daemon = Daemon(engine, config(daemon={"state_dir": str(tmp_path / "state")}), killer=Killer(host="squatted"))
        daemon.acquire()  # no AlreadyRunning
        try:
            assert daemon.membership.lease.held
            assert daemon.once(utcnow()) is not None  # it ticks
            leases.unlock(squatter, leases.host_key("squatted"))
            daemon.membership.lease.refresh()
            assert daemon.membership.lease._host_locked
        finally:
            daemon.release()
    finally:
        squatter.close()


def test_the_state_file_is_private_survives_a_restart_and_a_corrupt_one_is_rebuilt(tmp_path):
    from watchdog.store.memory import Memory, state_path

    path = state_path(str(tmp_path), "sqlite:////srv/runs.db", "state")
    m = Memory(path)
    m.see([("r1", 100.0)])
    m.reached("r1", "term", 101.0)
    m.deliver("stop:r1@t", "target-a")
    m.close()
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    again = Memory(path)
    assert again.first == {"r1": 100.0} and again.stages("r1") == {"term": 101.0}
    assert again.delivered("stop:r1@t", "target-a") and not again.delivered("stop:r1@t", "target-b")
    again.close()
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    Path(path).write_bytes(b"not a database" * 100)
    rebuilt = Memory(path)  # never fatal: set aside and rebuilt empty
    assert rebuilt.first == {}
    rebuilt.see([("r2", 5.0)])
    assert rebuilt.first == {"r2": 5.0}
    assert [p for p in os.listdir(tmp_path) if ".corrupt-" in p]
    rebuilt.close()
