"""Defaults that work everywhere (issue 19, item 6): a plain user runs the daemon with no
config beyond the store URL (docs/howto/try-the-daemon.md, run as written), and an agent whose
socket path is wrong is told once, on stderr and on its run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from sqlalchemy import select

from attest_support import LocalUsers, foreign_python
from watchdog.core import paths
from watchdog.store.schema import runs

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "docs" / "howto" / "try-the-daemon.md"


def _block(md: Path) -> str:
    (text,) = re.findall(r"```bash\n(.*?)```", md.read_text(), re.S)
    return text


def test_a_plain_user_runs_the_try_the_daemon_recipe_unchanged():
    import psutil  # noqa: F401 — loaded here: a shadow copy for other users carries what is loaded
    import watchdog.cli.app  # noqa: F401
    import watchdog.daemon.process.service  # noqa: F401
    import watchdog.daemon.alerts.notify  # noqa: F401

    exe, env = foreign_python()
    users = LocalUsers()
    base = Path(tempfile.mkdtemp(prefix="awtry-", dir="/tmp"))
    try:
        base.chmod(0o755)
        user = users.add("try")
        home = base / "home"
        home.mkdir()
        shutil.chown(home, user, user)
        bindir = base / "bin"
        bindir.mkdir()
        for name, code in (("agent-watchdog", f'exec {exe} -m watchdog.cli "$@"\n'), ("python", f'exec {exe} "$@"\n')):
            (bindir / name).write_text("#!/bin/sh\n" + code)
            (bindir / name).chmod(0o755)
        env = {k: v for k, v in env.items()
               if not k.startswith(("XDG_", "STATE_DIRECTORY", "RUNTIME_DIRECTORY", "AGENT_WATCHDOG_SOCKET"))}
        env.update(HOME=str(home), PATH=f"{bindir}:/usr/bin:/bin", USER=user, LOGNAME=user)
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", _block(RECIPE)], user=user, env=env, cwd=home,
                              capture_output=True, text=True, timeout=180)
        log = (home / "aw-try" / "daemon.log")
        assert done.returncode == 0, done.stderr + (log.read_text() if log.exists() else "")
        assert "attested by the daemon: True" in done.stdout, done.stdout + done.stderr
        assert "stopped: max_steps" in done.stdout
        assert "try-bot" in done.stdout and "killed" in done.stdout
        assert "no alerts yet" not in done.stdout and "max_steps" in done.stdout.rsplit("killed", 1)[-1], done.stdout
        state = home / ".local" / "state" / "agent-watchdog"
        assert (state / "attest.key").stat().st_mode & 0o777 == 0o600
        assert state.stat().st_mode & 0o777 == 0o700
        assert "not attested" not in done.stderr
    finally:
        users.close()
        shutil.rmtree(base, ignore_errors=True)


AGENT = textwrap.dedent("""
    import sys
    from watchdog import Watchdog
    wd = Watchdog(sys.argv[1])
    for i in range(2):
        with wd.run(agent="lonely", kill_mode="process") as run:
            run.step(cost_eur=0.0)
            print(run.id, run.attested, flush=True)
""")


def test_an_agent_with_a_wrong_socket_path_warns_once_and_says_so_on_its_run(db_url, engine):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    env["AGENT_WATCHDOG_SOCKET"] = "/nonexistent/agent-watchdog/attest.sock"
    p = subprocess.run([sys.executable, "-c", AGENT, db_url], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    ids = [line.split()[0] for line in p.stdout.splitlines()]
    assert [line.split()[1] for line in p.stdout.splitlines()] == ["False", "False"]
    warnings = [line for line in p.stderr.splitlines() if "not attested" in line]
    assert len(warnings) == 1, p.stderr  # once per process, however many runs
    assert warnings[0].startswith(f"agent-watchdog: run {ids[0][:8]} not attested (no daemon at "
                                  "/nonexistent/agent-watchdog/attest.sock")
    assert "AGENT_WATCHDOG_SOCKET" in warnings[0]
    with engine.connect() as conn:
        progress = dict(conn.execute(select(runs.c.id, runs.c.progress)).all())
    assert progress[ids[0]].startswith("not attested (no daemon at")  # recorded on the run too


def test_agents_look_for_the_socket_in_designs_order():
    home = "/home/u"
    none = lambda p: False  # noqa: E731
    assert paths.agent_socket({"AGENT_WATCHDOG_SOCKET": "/x.sock"}, home) == "/x.sock"
    # An agent user under the shipped unit has no $XDG_RUNTIME_DIR: it still finds the system socket.
    assert paths.agent_socket({}, home, exists=lambda p: p == paths.SYSTEM_SOCKET) == paths.SYSTEM_SOCKET
    xdg = "/run/user/1000/agent-watchdog/attest.sock"
    assert paths.agent_socket({"XDG_RUNTIME_DIR": "/run/user/1000"}, home, exists=lambda p: p == xdg) == xdg
    mine = "/home/u/.local/state/agent-watchdog/attest.sock"
    assert paths.agent_socket({}, home, exists=lambda p: p == mine) == mine
    assert paths.agent_socket({}, home, exists=none) == paths.SYSTEM_SOCKET


def test_a_socket_path_over_107_bytes_is_refused_with_one_line(tmp_path):
    from watchdog.core.config import parse
    from watchdog.errors import ConfigError

    long = "/tmp/" + "s" * 120 + "/attest.sock"
    try:
        parse({"daemon": {"socket": long}})
    except ConfigError as exc:
        (line,) = str(exc).splitlines()
        assert "daemon.socket" in line and "107" in line
    else:
        raise AssertionError("a socket path over 107 bytes was accepted")
