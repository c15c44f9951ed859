"""`agent-watchdog exec` without a daemon: exit statuses, exec's own failures, forwarded signals,
the command's environment, and where the run's cgroup comes from when exec may not make one."""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest

from agent_procs import wait_until
from exec_support import (STUBBORN, Daemon, attestation, daemon_config, exec_runs, gone, read_pid, run_exec, runs_json,
                          start_exec)
from watchdog.gateways.exec import cgroup as cg

pytestmark = pytest.mark.slow
ROOT = os.geteuid() == 0

# -- exit statuses ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command, code", [
    (["sh", "-c", "exit 3"], 3),
    (["sh", "-c", "kill -USR1 $$"], 128 + signal.SIGUSR1),
    (["/nonexistent/agent"], 127),
    (["no-such-command-anywhere"], 127),
    (["/etc/hostname"], 126),  # exists, not executable
    (["true"], 0),
])
def test_exit_status_is_the_commands_as_timeout_says(command, code, sqlite_url):
    p = run_exec(["--agent", "a", "--", *command], db_url=sqlite_url)
    assert p.returncode == code, p.stderr
    (row,) = runs_json(sqlite_url)
    assert row["status"] == ("completed" if code == 0 else "failed") and row["source"] == "exec"
    if code == 127:  # issue 36: a mistyped command is a clear `failed`, said so on stderr and in the run
        assert "not found" in p.stderr, p.stderr
        from sqlalchemy import select

        from watchdog.store.engine import make_engine
        from watchdog.store.schema import runs

        engine = make_engine(sqlite_url)
        with engine.connect() as conn:
            detail = conn.execute(select(runs.c.stop_detail).where(runs.c.id == row["id"])).scalar()
        engine.dispose()
        assert detail.startswith("command not found"), detail


@pytest.mark.parametrize("args", [
    ["--agent", "a", "--bogus", "--", "true"],
    ["--", "true"],  # no --agent
    ["--agent", "a", "--max-steps", "-1", "--", "true"],
    ["--agent", "a", "--label", "novalue", "--", "true"],
    ["--agent", "a", "--kill-mode", "process", "--", "true"],
])
def test_execs_own_failures_exit_125(args, sqlite_url):
    p = run_exec(args, db_url=sqlite_url)
    assert p.returncode == 125, p.stderr
    assert p.stderr.strip()


def test_a_misconfigured_store_is_125_and_the_command_never_runs(tmp_path):
    marker = tmp_path / "ran"
    p = run_exec(["--agent", "a", "--", "touch", str(marker)], db_url=f"sqlite:///{tmp_path / 'missing.db'}")
    assert p.returncode == 125, p.stderr
    assert not marker.exists()
    assert len(p.stderr.strip().splitlines()) == 1


def test_budget_options_never_raise_the_profile(sqlite_url, engine_sqlite=None):
    p = run_exec(["--agent", "a", "--max-steps", "500", "--max-tool-calls", "5", "-v", "--", "true"],
                 db_url=sqlite_url)
    assert p.returncode == 0, p.stderr
    assert "above the profile's 12" in p.stderr
    from watchdog.store.engine import make_engine

    engine = make_engine(sqlite_url)
    try:
        (row,) = exec_runs(engine)
        assert (row.max_steps, row.max_tool_calls) == (12, 5)
    finally:
        engine.dispose()


def test_sigterm_sent_to_exec_is_forwarded_to_the_tree_once(sqlite_url, tmp_path):
    got = tmp_path / "got"
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        def on_term(sig, frame):
            with open({str(got)!r}, "a") as f:
                f.write("TERM\\n")
            sys.exit(7)
        signal.signal(signal.SIGTERM, on_term)
        open({str(got)!r} + ".ready", "w").close()
        while True:
            time.sleep(0.1)
    """)
    p = start_exec(["--agent", "a", "--", sys.executable, "-c", script], db_url=sqlite_url)
    assert wait_until(lambda: os.path.exists(f"{got}.ready"), 60)
    p.send_signal(signal.SIGTERM)
    _out, err = p.communicate(timeout=60)
    assert p.returncode == 7, err
    assert got.read_text() == "TERM\n"
    (row,) = runs_json(sqlite_url)
    assert row["status"] == "failed"


def test_the_environment_names_the_run_the_store_and_the_socket(sqlite_url, tmp_path):
    out = tmp_path / "env"
    p = run_exec(["--agent", "a", "--", "sh", "-c", f"env > {out}"], db_url=sqlite_url)
    assert p.returncode == 0, p.stderr
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    (row,) = runs_json(sqlite_url)
    assert env["AGENT_WATCHDOG_RUN"] == row["id"]
    assert env["AGENT_WATCHDOG_DB"] == sqlite_url
    assert env["AGENT_WATCHDOG_SOCKET"] == "/nonexistent/agent-watchdog/attest.sock"
    assert "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" not in env  # [otlp] is off


# -- a systemd user manager makes the scope (faked: systemd-run on PATH, a manager as root) ----------

FAKE_SYSTEMD_RUN = '''#!{python}
# A stand-in for systemd-run --user --scope: asks "the user manager" (the test, over a socket) to
# make the scope's cgroup and move this process into it, then execs the command, as the real one does.
import json, os, socket, sys
args = sys.argv[1:]
assert args[:2] == ["--user", "--scope"], args
unit = next((a.split("=", 1)[1] for a in args if a.startswith("--unit=")), "run-probe.scope")
cmd = args[args.index("--") + 1:]
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["FAKE_SYSTEMD_SOCKET"])
s.sendall(json.dumps({{"pid": os.getpid(), "unit": unit}}).encode() + b"\\n")
if s.makefile().readline().strip() != "ok":
    sys.exit("Failed to connect to bus: No medium found")
os.execvp(cmd[0], cmd)
'''


class _FakeUserManager:
    """Makes `<mount>/<base>/<unit>` owned by `user` and moves the asking pid into it, as systemd's
    user manager does for a scope (a delegated subtree the user may write)."""

    def __init__(self, user: str):
        import pwd
        import socket
        import threading

        from attest_support import short_dir

        self.uid = pwd.getpwnam(user).pw_uid
        self.base = os.path.join(cg.mount_point(), f"aw-user-{os.getpid()}-{id(self):x}")
        os.makedirs(self.base)
        folder = short_dir()
        folder.chmod(0o777)
        self.path = str(folder / "manager.sock")
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o777)
        self.sock.listen(8)
        self.units: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import json

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                req = json.loads(conn.makefile().readline())
                d = os.path.join(self.base, req["unit"])
                os.makedirs(d, exist_ok=True)
                for name in ("", "cgroup.procs", "cgroup.kill"):
                    os.chown(os.path.join(d, name), self.uid, -1)
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(str(req["pid"]))
                self.units.append(req["unit"])
                conn.sendall(b"ok\n")

    def close(self) -> None:
        import time

        self.sock.close()
        for _ in range(100):
            try:
                for dirpath, _dirs, _files in sorted(os.walk(self.base), key=lambda t: -len(t[0])):
                    os.rmdir(dirpath)
                return
            except OSError:
                time.sleep(0.05)


@pytest.mark.skipif(not ROOT, reason="needs a second local user and root to fake the user manager")
def test_without_a_writable_cgroup_exec_uses_a_systemd_user_scope(tmp_path):
    import subprocess

    from attest_support import LocalUsers, foreign_python, shared_sqlite

    users = LocalUsers()
    manager = daemon = None
    try:
        user = users.add("exec")
        python, env = foreign_python()
        url, folder = shared_sqlite()
        bin_dir = folder / "bin"
        bin_dir.mkdir()
        fake = bin_dir / "systemd-run"
        fake.write_text(FAKE_SYSTEMD_RUN.format(python=python))
        fake.chmod(0o755)
        manager = _FakeUserManager(user)
        cfg, sock = daemon_config(tmp_path / "wd.toml", url, users=(user,))
        daemon = Daemon(tmp_path, cfg, sock)
        pid_file = folder / "grandchild.pid"
        env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_SYSTEMD_SOCKET=manager.path, HOME=str(folder),
                   AGENT_WATCHDOG_SOCKET=sock)
        p = subprocess.Popen([python, "-m", "watchdog.cli", "--db", url, "exec", "--agent", "scoped", "-v", "--",
                              python, "-c", STUBBORN, str(pid_file)], user=user, env=env, cwd=str(folder),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        grandchild = read_pid(pid_file)
        (row,) = runs_json(url)
        unit = f"agent-watchdog-run-{row['id']}.scope"
        assert manager.units[-1] == unit and row["kill_mode"] == "cgroup"
        assert cg.cgroup_of(grandchild.pid).endswith("/" + unit)
        from watchdog.store.engine import make_engine

        engine = make_engine(url)
        try:  # the daemon attested the scope as the run's cgroup: exec's child is in it
            assert wait_until(lambda: attestation(engine, row["id"]) is not None, 30), daemon.log()
            assert attestation(engine, row["id"]).cgroup == os.path.join(manager.base, unit)
        finally:
            engine.dispose()
        kill = subprocess.run([sys.executable, "-m", "watchdog.cli", "--db", url, "kill", row["id"]],
                              capture_output=True, text=True, timeout=60)
        assert kill.returncode == 0, kill.stderr
        p.wait(timeout=60)
        err = p.stderr.read()
        assert p.returncode == 124, err
        assert "systemd-run --user --scope" in err and "manual" in err
        assert wait_until(lambda: gone(grandchild), 30)
    finally:
        if daemon is not None:
            daemon.stop()
        if manager is not None:
            manager.close()
        users.close()


@pytest.mark.skipif(not ROOT, reason="needs a second local user")
def test_kill_mode_cgroup_where_none_can_be_made_is_125_and_the_default_falls_back_to_tree(tmp_path):
    import subprocess

    from attest_support import LocalUsers, foreign_python, shared_sqlite

    users = LocalUsers()
    try:
        user = users.add("nocg")
        python, env = foreign_python()
        url, folder = shared_sqlite()
        marker = folder / "ran"
        # No writable cgroup for this user and no systemd-run on its PATH.
        env.update(PATH="/usr/local/bin:/bin", HOME=str(folder), AGENT_WATCHDOG_SOCKET="/nonexistent/attest.sock")
        base = [python, "-m", "watchdog.cli", "--db", url, "exec", "--agent", "a"]
        forced = subprocess.run([*base, "--kill-mode", "cgroup", "--", "touch", str(marker)], user=user, env=env,
                                capture_output=True, text=True, timeout=120, cwd=str(folder))
        assert forced.returncode == 125, forced.stderr
        assert "--kill-mode cgroup is impossible here" in forced.stderr and not marker.exists()
        default = subprocess.run([*base, "-v", "--", "touch", str(marker)], user=user, env=env,
                                 capture_output=True, text=True, timeout=120, cwd=str(folder))
        assert default.returncode == 0, default.stderr
        assert "kill mode tree" in default.stderr and marker.exists()
        assert [r["kill_mode"] for r in runs_json(url)] == ["tree"]
    finally:
        users.close()


def test_without_a_daemon_exec_still_stops_the_run_past_max_wall_s(sqlite_url, tmp_path):
    cfg, _sock = daemon_config(tmp_path / "wd.toml", sqlite_url, tick_s=0.5)  # no daemon is started
    p = run_exec(["--agent", "a", "--max-wall-s", "1", "-v", "--", "sleep", "600"], db_url=sqlite_url, cfg=cfg)
    assert p.returncode == 124, p.stderr
    assert "exec stops it itself" in p.stderr and "wall_clock" in p.stderr
    (row,) = runs_json(sqlite_url)
    assert (row["status"], row["stop_reason"]) == ("killed", "wall_clock")


COUNT_SIGINT = textwrap.dedent("""
    import os, signal, sys, time
    out = sys.argv[1]
    got = []
    quit = []
    signal.signal(signal.SIGINT, lambda *a: got.append(1))
    signal.signal(signal.SIGQUIT, lambda *a: quit.append(1))
    open(out + ".ready", "w").close()
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    open(out + ".got", "w").close()
    # The test then sends exec a SIGQUIT, which exec forwards: exec takes its pending signals
    # lowest number first and forwards them in order, and the kernel delivers ours the same way,
    # so a second SIGINT (2) from exec has arrived by the time its SIGQUIT (3) does.
    while not quit and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(out, "w") as f:
        f.write(str(len(got)))
    sys.exit(3)
""")


@pytest.mark.parametrize("sender", ["terminal", "process"])
def test_ctrl_c_reaches_the_command_once_whether_the_terminal_or_a_process_sent_it(sender, sqlite_url, tmp_path):
    import pty

    from exec_support import AGENT_WATCHDOG, exec_env

    out = tmp_path / "count"
    argv = [AGENT_WATCHDOG, "--db", sqlite_url, "exec", "--agent", "a", "--", sys.executable, "-c", COUNT_SIGINT,
            str(out)]
    env = exec_env()
    pid, fd = pty.fork()  # exec on a terminal of its own, in the terminal's foreground group
    if pid == 0:
        try:
            os.execve(AGENT_WATCHDOG, argv, env)
        finally:
            os._exit(99)
    try:
        assert wait_until(lambda: os.path.exists(f"{out}.ready"), 60)
        if sender == "terminal":
            os.write(fd, b"\x03")  # the tty sends SIGINT to exec and the command alike
        else:
            os.kill(pid, signal.SIGINT)  # only exec gets it: exec forwards it
        assert wait_until(lambda: os.path.exists(f"{out}.got"), 60)
        os.kill(pid, signal.SIGQUIT)  # the positive event: once the command has it, no SIGINT is still coming
        assert wait_until(lambda: out.exists(), 60)
        _pid, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 3
        assert out.read_text() == "1"
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)
