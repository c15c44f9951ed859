"""Issue 32, item 9: a state_dir another user made first does not switch the daemon off.

The attack: a local user creates the daemon's `state_dir` before the daemon does (here under
a sticky, world-writable parent, as /tmp is) and holds an flock on the lease lock file inside
it. The daemon took that for another daemon and exited 0 "already watching", which systemd's
Restart=on-failure never restarts. Now the daemon refuses a state_dir or lock file that is not
its own and private: exit 2 (a configuration error, which systemd reports as a failure), one
line naming the path and the fix. The control: once the directory is the daemon's own, it runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from agent_procs import wait_until
from attest_support import LocalUsers, short_dir
from daemon_support import ME
from watchdog.store import access
from watchdog.store.engine import make_engine
from watchdog.store.memory import state_path
from watchdog.store.schema import daemons

AGENT_WATCHDOG = str(Path(sys.executable).parent / "agent-watchdog")
DEADLINE_S = 60

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a second real local user (useradd)")


def _toml(path: Path, url: str, state: Path, keys: Path) -> Path:
    path.write_text(
        f'[store]\nurl = "{url}"\n\n'
        "[daemon]\ntick_s = 0.2\n"
        f'allowed_users = ["{ME}"]\nkey_file = "{keys / "attest.key"}"\nsocket = "{keys / "attest.sock"}"\n'
        f'state_dir = "{state}"\n')
    return path


def _run(cfg: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    return subprocess.run([AGENT_WATCHDOG, "run", "--config", str(cfg)], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=DEADLINE_S)


@pytest.fixture
def users():
    u = LocalUsers()
    yield u
    u.close()


def test_a_squatted_state_dir_is_refused_loudly_and_an_own_one_runs(tmp_path, users):
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    parent, keys = short_dir("awsq"), short_dir("awk")
    parent.chmod(0o1777)  # like /tmp: anyone may make a directory in it
    state = parent / "state"
    squatter = users.add("squat")
    holder = None
    try:
        subprocess.run(["mkdir", "-m", "0755", str(state)], user=squatter, check=True)
        engine = make_engine(url)
        access.upgrade(engine)
        lock = state_path(str(state), engine.url, "lock")
        # The squatter holds the flock the daemon would take for its own (util-linux flock).
        holder = subprocess.Popen(["flock", lock, "sleep", "600"], user=squatter)
        assert wait_until(lambda: os.path.exists(lock), 10)
        cfg = _toml(tmp_path / "wd.toml", url, state, keys)

        done = _run(cfg)
        assert done.returncode == 2, done.stdout + done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert str(state) in lines[0] and "owned by uid" in lines[0] and "chown" in lines[0], lines[0]
        assert "already watching" not in done.stdout + done.stderr

        # Taken back by root but left writable by others: still refused, for that reason.
        holder.kill()
        holder.wait()
        holder = None
        os.chown(state, 0, 0)
        os.unlink(lock)
        state.chmod(0o777)
        done = _run(cfg)
        assert done.returncode == 2 and "may be written by others" in done.stderr, done.stdout + done.stderr

        # The daemon's own directory, but a lock file others may open (0644): flock needs only a
        # read-only descriptor, so that is refused too (review of item 9).
        state.chmod(0o755)
        fd = os.open(lock, os.O_CREAT | os.O_WRONLY, 0o644)
        os.close(fd)
        os.chmod(lock, 0o644)
        done = _run(cfg)
        assert done.returncode == 2 and "may be opened by others" in done.stderr and "go-rwx" in done.stderr, \
            done.stdout + done.stderr
        os.unlink(lock)

        # The control: private and the daemon's own, the same config runs and ticks.
        state.chmod(0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
        daemon = subprocess.Popen([AGENT_WATCHDOG, "run", "--config", str(cfg)], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            def ticked() -> bool:
                with engine.connect() as conn:
                    row = conn.execute(select(daemons.c.pid, daemons.c.last_tick_at)).first()
                return row is not None and row.pid == daemon.pid and row.last_tick_at is not None

            assert wait_until(ticked, DEADLINE_S)
            assert daemon.poll() is None
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
        engine.dispose()
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        shutil.rmtree(parent, ignore_errors=True)
        shutil.rmtree(keys, ignore_errors=True)
