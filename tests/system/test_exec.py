"""`agent-watchdog exec`: real commands, real signals, a real daemon, real cgroups (as root).

Each stop here is the daemon's own (wall clock, tool calls, exec gone); exec takes the tree
down itself and exits 124, or — exec SIGKILLed — the daemon signals the tree it attested.
"""

from __future__ import annotations

import glob
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
        if mode == "cgroup":  # exec could not remove its cgroup: the daemon did, once empty
            assert wait_until(lambda: _no_run_cgroups(row.id), 30)
    finally:
        engine.dispose()
        if not gone(grandchild):
            grandchild.kill()


# -- hostile: a row cannot point the daemon at a cgroup exec did not make for the run --------------


def _kill_cgroup(d: str) -> None:
    import time

    with open(os.path.join(d, "cgroup.kill"), "w") as f:
        f.write("1")
    for _ in range(200):
        try:
            os.rmdir(d)
            return
        except OSError:
            time.sleep(0.05)


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
    real = None
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
        assert "Traceback" not in d.log()
    finally:
        engine.dispose()
        for v in victims:
            v.close()
        for left in glob.glob(os.path.join(mount, "agent-watchdog-run-*")):  # what exec (SIGKILLed) left
            if real is not None and left.endswith(real.id):
                _kill_cgroup(left)



# -- silence: judged only once the command has reported something ----------------------------------


QUIET_AFTER_ONE_STEP = textwrap.dedent("""
    import time
    from watchdog import Watchdog
    with Watchdog().run(agent="inner") as run:
        run.step(model="gpt-x", tokens_in=1, tokens_out=1)
        time.sleep(600)  # then silence
""")


@pytest.mark.parametrize("reports", [False, True])
def test_silence_is_judged_only_once_the_command_has_reported(reports, sqlite_url, daemon):
    d = daemon(sqlite_url, extra='\n[defaults]\nheartbeat_timeout_s = 2\n'
                                 '\n[prices."gpt-x"]\ninput_eur_per_mtok = 0.0\noutput_eur_per_mtok = 0.0\n')
    command = [sys.executable, "-c", QUIET_AFTER_ONE_STEP] if reports else ["sleep", "600"]
    p = run_exec(["--agent", "quiet", "--max-wall-s", "8", "--", *command], db_url=sqlite_url, cfg=d.cfg,
                 sock=d.sock)
    assert p.returncode == 124, p.stderr + d.log()
    (row,) = [r for r in runs_json(sqlite_url) if r["source"] == "exec"]
    # A command that reports nothing is bounded by max_wall_s; one that reported, then went
    # silent, by heartbeat_timeout_s.
    assert row["stop_reason"] == ("heartbeat_timeout" if reports else "wall_clock"), p.stderr
