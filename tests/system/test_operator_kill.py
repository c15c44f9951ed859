"""`agent-watchdog kill` does what it says (issue 19, item 2): by root or the daemon's user it
leads to the full ladder (the stop is sealed with the daemon's key, which root may read even
when the daemon's own user owns it); anyone else gets a cooperative stop, told so in one
sentence. A real daemon, a real agent process that ignores the stop and SIGTERM, real signals."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess

from agent_procs import wait_until
from daemon_support import actions, run_row
from test_daemon import AGENT_WATCHDOG, SOCKET_OF, _toml, daemon_procs  # noqa: F401 — the fixture
from watchdog.core import lifecycle as lc
from watchdog.daemon.trust import keyfile


def test_root_reads_a_private_key_owned_by_the_daemons_user_but_never_a_readable_one(tmp_path):
    assert os.geteuid() == 0  # CI runs as root
    path = tmp_path / "attest.key"
    key = keyfile.load_or_create(str(path))
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(path, nobody, -1)  # the daemon runs as its own user; the operator is root
    assert keyfile.load_existing(str(path)) == key
    os.chmod(path, 0o640)  # a key others could read is nobody's key: never used
    assert keyfile.load_existing(str(path)) is None


def test_kill_as_root_takes_a_stubborn_run_down_the_whole_ladder(tmp_path, db_url, engine, procs, daemon_procs,
                                                                 monkeypatch):
    cfg = _toml(tmp_path / "wd.toml", db_url)
    daemon = daemon_procs(cfg)
    assert wait_until(lambda: os.path.exists(SOCKET_OF[cfg]), 60), daemon.log()
    monkeypatch.setenv("AGENT_WATCHDOG_SOCKET", SOCKET_OF[cfg])
    # It never looks at the store again (a run that swallows the stop) and ignores SIGTERM.
    agent = procs.start("runaway", db_url, kill_mode="process", steps=1, ignore_sigterm=True,
                        then="attest_then_hang")
    assert wait_until(lambda: _attested(engine, agent.run_id), 60), daemon.log()

    done = subprocess.run([AGENT_WATCHDOG, "kill", agent.run_id[:8], "--config", str(cfg)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"stop requested for bot run {agent.run_id[:8]}: it stops at its next write; "
                                   "if it has not ended 0.5 s later the daemon sends SIGTERM, then SIGKILL 0.5 s "
                                   "after that")
    assert agent.wait(timeout_s=60) == -signal.SIGKILL, daemon.log()  # graces + a few ticks, not heartbeat_timeout
    assert wait_until(lambda: run_row(engine, agent.run_id).status == lc.KILLED, 30), daemon.log()
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigkill", "ended"]
    assert daemon.stop() == 0, daemon.log()


def test_kill_by_a_user_without_the_key_is_cooperative_and_says_so(tmp_path, sqlite_url):
    from watchdog.cli.daemon_cmds import kill_sentence
    from watchdog.core.config import parse

    d = parse({}).daemon
    assert kill_sentence("bot", "abcdef123456", "process", False, d) == (
        "stop requested for bot run abcdef12: it stops at its next write; cooperative only: its process is not "
        "signalled, because only root or the daemon's user can have the daemon signal it")
    assert kill_sentence("bot", "abcdef123456", "cooperative", True, d) == (
        "stop requested for bot run abcdef12: it stops at its next write; its kill_mode is cooperative, so its "
        "process is never signalled")


def _attested(engine, run_id) -> bool:
    from sqlalchemy import select

    from watchdog.store.schema import attestations

    with engine.connect() as conn:
        return conn.execute(select(attestations.c.run_id).where(attestations.c.run_id == run_id)).first() is not None
