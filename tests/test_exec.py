"""`agent-watchdog exec`: real commands, real signals, a real daemon, real cgroups (as root).

Each stop here is the daemon's own (wall clock, tool calls, exec gone); exec takes the tree
down itself and exits 124, or — exec SIGKILLed — the daemon signals the tree it attested.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import psutil
import pytest

from agent_procs import wait_until
from exec_support import (EXAMPLES, STUBBORN, Daemon, attestation, daemon_config, exec_runs, gone, read_pid,
                          run_exec, runs_json, start_exec)
from watchdog.core import lifecycle as lc
from watchdog.gateways.exec import cgroup as cg

pytestmark = pytest.mark.slow
ROOT = os.geteuid() == 0


@pytest.fixture
def daemon(tmp_path, request):
    started = []

    def start(db_url, **kw):
        cfg, sock = daemon_config(tmp_path / "wd.toml", db_url, **kw)
        d = Daemon(tmp_path, cfg, sock)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def _no_run_cgroups(run_id: str) -> bool:
    mount = cg.mount_point()
    return mount is None or not any(f"agent-watchdog-run-{run_id}" in d for d, _s, _f in os.walk(mount))


# -- the daemon stops, exec takes the tree down -------------------------------------------------


def test_a_command_that_reports_nothing_is_stopped_at_max_wall_s_with_124(db_url, engine, daemon):
    d = daemon(db_url)
    p = run_exec(["--agent", "sleeper", "--max-wall-s", "3", "--", "sleep", "600"], db_url=db_url, cfg=d.cfg,
                 sock=d.sock)
    assert p.returncode == 124, p.stderr + d.log()
    (run,) = exec_runs(engine)
    assert "stopped by agent-watchdog: wall_clock" in p.stderr and run.id[:8] in p.stderr
    assert (run.status, run.stop_reason, run.source, run.agent) == (lc.KILLED, lc.WALL_CLOCK, "exec", "sleeper")
    assert run.max_wall_s == 3
    assert not [c for c in psutil.Process().children(recursive=True) if "sleep" in " ".join(c.cmdline())]


@pytest.mark.parametrize("mode", ["tree", "cgroup"])
def test_a_setsid_double_forked_grandchild_that_ignores_sigterm_is_gone_after_the_stop(mode, sqlite_url, tmp_path,
                                                                                      daemon):
    if mode == "cgroup" and not ROOT:
        pytest.skip("creating a cgroup under the cgroup2 mount needs root here")
    d = daemon(sqlite_url)
    pid_file = tmp_path / "grandchild.pid"
    p = start_exec(["--agent", "stubborn", "--max-wall-s", "3", "--kill-mode", mode, "-v", "--",
                    sys.executable, "-c", STUBBORN, str(pid_file)], db_url=sqlite_url, cfg=d.cfg, sock=d.sock)
    grandchild = read_pid(pid_file)
    assert grandchild.ppid() == p.pid  # exec is the subreaper: the orphan is reparented to it, not init
    _out, err = p.communicate(timeout=120)
    assert p.returncode == 124, err + d.log()
    assert wait_until(lambda: gone(grandchild), 30), err
    assert f"kill mode {mode}" in err
    (row,) = runs_json(sqlite_url)
    assert (row["kill_mode"], row["status"], row["stop_reason"], row["source"]) == (mode, "killed", "wall_clock", "exec")
    assert _no_run_cgroups(row["id"])  # exec removes the cgroup it made


def test_the_shell_script_example_is_stopped_with_its_stubborn_helper(sqlite_url, tmp_path, daemon):
    d = daemon(sqlite_url)
    helper_file = tmp_path / "helper.pid"
    env = dict(os.environ, AGENT_WATCHDOG_SOCKET=d.sock, HELPER_PID_FILE=str(helper_file))
    env.pop("AGENT_WATCHDOG_DB", None)
    p = start_exec(["--agent", "shell-bot", "--max-wall-s", "3", "-v", "--", "sh", str(EXAMPLES / "exec_shell_agent.sh")],
                   db_url=sqlite_url, cfg=d.cfg, env=env)
    helper = read_pid(helper_file)
    _out, err = p.communicate(timeout=120)
    assert p.returncode == 124, err
    assert "tool call 3" in err and "wall_clock" in err
    assert wait_until(lambda: gone(helper), 30)
    assert "attested by the daemon" in err


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


# -- the SDK inside joins exec's run ------------------------------------------------------------


SDK_AGENT = textwrap.dedent("""
    import sys
    from watchdog import Watchdog
    wd = Watchdog()  # $AGENT_WATCHDOG_DB, set by exec
    with wd.run(agent="inner") as run:
        print(run.id, run.parent_id, flush=True)
        n = 0
        while True:
            n += 1
            run.step(model="gpt-x", tokens_in=10, tokens_out=5)
            run.tool_call("search", {"q": n}, lambda q: q)
""")


def test_a_python_sdk_agent_under_exec_joins_the_run_as_its_child_and_is_stopped(db_url, engine, daemon):
    d = daemon(db_url, extra='\n[prices."gpt-x"]\ninput_eur_per_mtok = 0.0\noutput_eur_per_mtok = 0.0\n')
    p = run_exec(["--agent", "outer", "--max-tool-calls", "4", "--", sys.executable, "-c", SDK_AGENT],
                 db_url=db_url, cfg=d.cfg, sock=d.sock)
    assert p.returncode == 124, p.stderr + d.log()
    child_id, parent_id = p.stdout.split()
    (outer,) = exec_runs(engine)
    assert parent_id == outer.id
    assert outer.stop_reason == lc.MAX_TOOL_CALLS and outer.status == lc.KILLED
    assert outer.tool_calls >= 4  # the child's calls rolled up into exec's run
    inner = {r["id"]: r for r in runs_json(db_url)}[child_id]
    assert inner["parent_id"] == outer.id and inner["source"] == "sdk"


# -- the daemon takes the tree down when exec is gone ---------------------------------------------


@pytest.mark.parametrize("mode, how", [("tree", "SIGKILL"), ("cgroup", "SIGKILL"), ("tree", "SIGSTOP")])
def test_the_daemon_kills_the_tree_when_exec_is_gone_or_unresponsive(mode, how, sqlite_url, tmp_path, daemon):
    if mode == "cgroup" and not ROOT:
        pytest.skip("creating a cgroup under the cgroup2 mount needs root here")
    d = daemon(sqlite_url, cancel_grace_s=0.5)
    pid_file = tmp_path / "grandchild.pid"
    wall = ["--max-wall-s", "4"] if how == "SIGSTOP" else []
    p = start_exec(["--agent", "orphaned", "--kill-mode", mode, *wall, "--", sys.executable, "-c", STUBBORN,
                    str(pid_file)], db_url=sqlite_url, cfg=d.cfg, sock=d.sock)
    grandchild = read_pid(pid_file)
    from watchdog.store.engine import make_engine

    engine = make_engine(sqlite_url)
    try:
        (run,) = exec_runs(engine)
        assert wait_until(lambda: attestation(engine, run.id) is not None, 30), d.log()
        if mode == "cgroup":
            assert attestation(engine, run.id).cgroup.endswith(f"agent-watchdog-run-{run.id}")
        import time

        time.sleep(1.0)  # a few ticks: the daemon has seen the tree (tree mode remembers it)
        if how == "SIGKILL":
            p.kill()  # exec cannot take anything down
            p.wait(timeout=30)  # (not communicate: the orphans still hold exec's pipes)
        else:
            p.send_signal(signal.SIGSTOP)  # exec cannot act on the stop at max_wall_s
        assert wait_until(lambda: gone(grandchild), 60), d.log()
        assert wait_until(lambda: exec_runs(engine)[0].status == lc.KILLED, 60), d.log()
        row = exec_runs(engine)[0]
        assert row.stop_reason == (lc.PROCESS_GONE if how == "SIGKILL" else lc.WALL_CLOCK)
        assert p.wait(timeout=30) == -signal.SIGKILL  # the stopped exec too: it is the tree's root
        assert "Traceback" not in d.log()
    finally:
        engine.dispose()
        if not gone(grandchild):
            grandchild.kill()


# -- hostile: a row cannot point the daemon at a cgroup exec did not make for the run --------------


class _Victim:
    """A process in a cgroup of its own that no exec made: `name` may even be a run's cgroup name."""

    def __init__(self, parent: str, name: str):
        import subprocess

        self.dir = os.path.join(parent, name)
        os.makedirs(self.dir)
        self.proc = subprocess.Popen(["sleep", "600"])
        with open(os.path.join(self.dir, "cgroup.procs"), "w") as f:
            f.write(str(self.proc.pid))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for _ in range(100):
            try:
                os.rmdir(self.dir)
                os.rmdir(os.path.dirname(self.dir))
                return
            except OSError:
                import time

                time.sleep(0.05)


@pytest.mark.skipif(not ROOT, reason="making the victim's cgroup needs root")
def test_a_forged_cgroup_is_never_attested_nor_killed(sqlite_url, tmp_path, daemon):
    import subprocess
    import uuid

    from sqlalchemy import update

    from watchdog.store.engine import make_engine
    from watchdog.store.schema import attestations

    d = daemon(sqlite_url, cancel_grace_s=0.5)
    mount = cg.mount_point()
    engine = make_engine(sqlite_url)
    victims = []
    try:
        # 1. A process asks the daemon to attest its own cgroup run with a cgroup of the right
        #    name that it is not in: refused.
        run_id = uuid.uuid4().hex
        victims.append(_Victim(os.path.join(mount, f"aw-victim-{run_id[:8]}"), f"agent-watchdog-run-{run_id}"))
        claim = textwrap.dedent(f"""
            from watchdog import Watchdog
            from watchdog.sdk.attest import request
            wd = Watchdog({sqlite_url!r}, attest_socket="")
            run = wd.run(agent="forger", kill_mode="cgroup", run_id={run_id!r}, guards=False).start()
            print(request({d.sock!r}, run.id, "cgroup", cgroup={victims[0].dir!r}))
        """)
        out = subprocess.run([sys.executable, "-c", claim], capture_output=True, text=True, timeout=60)
        assert "cgroup refused: neither your process nor a child of it is in" in out.stdout, out.stdout + out.stderr
        assert attestation(engine, run_id) is None

        # 2. A real exec'd cgroup run; someone rewrites its attestation to name the victim's cgroup
        #    (right name, elsewhere), then exec dies: the seal no longer verifies, nothing is signalled.
        pid_file = tmp_path / "grandchild.pid"
        p = start_exec(["--agent", "real", "--kill-mode", "cgroup", "--", sys.executable, "-c", STUBBORN,
                        str(pid_file)], db_url=sqlite_url, cfg=d.cfg, sock=d.sock)
        grandchild = read_pid(pid_file)
        real = next(r for r in exec_runs(engine) if r.agent == "real")
        assert wait_until(lambda: attestation(engine, real.id) is not None, 30), d.log()
        victims.append(_Victim(os.path.join(mount, f"aw-victim-{real.id[:8]}"), f"agent-watchdog-run-{real.id}"))
        with engine.begin() as conn:
            conn.execute(update(attestations).where(attestations.c.run_id == real.id).values(cgroup=victims[1].dir))
        p.kill()
        p.wait(timeout=30)
        assert wait_until(lambda: exec_runs(engine)[-1].status not in lc.ACTIVE_STATUSES, 60), d.log()
        import time

        time.sleep(1.0)  # a few more ticks: still nothing
        assert all(v.alive() for v in victims)
        assert not gone(grandchild)  # not attested any more: the daemon signals nothing, not even exec's own
        grandchild.kill()
    finally:
        engine.dispose()
        for v in victims:
            v.close()


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
    manager = None
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
        pid_file = folder / "grandchild.pid"
        env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_SYSTEMD_SOCKET=manager.path, HOME=str(folder),
                   AGENT_WATCHDOG_SOCKET="/nonexistent/attest.sock")
        p = subprocess.Popen([python, "-m", "watchdog.cli", "--db", url, "exec", "--agent", "scoped", "-v", "--",
                              python, "-c", STUBBORN, str(pid_file)], user=user, env=env, cwd=str(folder),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        grandchild = read_pid(pid_file)
        (row,) = runs_json(url)
        unit = f"agent-watchdog-run-{row['id']}.scope"
        assert manager.units[-1] == unit and row["kill_mode"] == "cgroup"
        assert cg.cgroup_of(grandchild.pid).endswith("/" + unit)
        kill = subprocess.run([sys.executable, "-m", "watchdog.cli", "--db", url, "kill", row["id"]],
                              capture_output=True, text=True, timeout=60)
        assert kill.returncode == 0, kill.stderr
        p.wait(timeout=60)
        err = p.stderr.read()
        assert p.returncode == 124, err
        assert "systemd-run --user --scope" in err and "manual" in err
        assert wait_until(lambda: gone(grandchild), 30)
    finally:
        if manager is not None:
            manager.close()
        users.close()
