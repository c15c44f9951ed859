"""issue 32, attack 6: under `exec --kill-mode tree` the command SIGKILLs exec (its parent and
subreaper), then double-forks a worker that ignores SIGTERM and is reparented to init. The daemon
pinned what it saw of the tree at each tick, so the worker is taken down all the same and the run
is stopped once, `process_gone`, alerted; a healthy command is untouched, and no process of
another user, nor one outside the tree, is ever signalled.

Real processes: exec runs as a second local user (its command too), the daemon's own attestation
server and tick in this process, the clock passed in. Each step waits on a condition the attacker
or the test wrote, never on a sleep: the attacker here is one tick slower than it could be (the
window left: docs/howto/exec.md)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import textwrap
from pathlib import Path

import psutil
import pytest

from agent_procs import wait_until
from daemon_support import alerts_of, config, interventions_of, later, run_row
from exec_support import attestation, exec_runs, gone
from watchdog.core import lifecycle as lc
from watchdog.core.interventions import Action
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.engine import make_engine
from watchdog.store.schema import utcnow

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs second local users (root)")]

CANCEL_GRACE_S, TERM_GRACE_S = 0.5, 0.5

# The command: waits for `go`, SIGKILLs exec, then double-forks a worker that leaves the session,
# ignores SIGTERM and writes its pid; the middle process and the command exit on `orphan`, which
# leaves the worker reparented to init. Beforehand it starts `foreign`: another user's setuid
# program inside its tree (real uid the agent's, effective uid another's), which is not the run's.
ATTACK = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    d, foreign = sys.argv[1], sys.argv[2]
    def wait(name):
        while not os.path.exists(os.path.join(d, name)):
            time.sleep(0.01)
    def put(name, text):
        with open(os.path.join(d, name + ".tmp"), "w") as f:
            f.write(text)
        os.rename(os.path.join(d, name + ".tmp"), os.path.join(d, name))
    setuid = subprocess.Popen([foreign, "600"], start_new_session=True)
    put("foreign.pid", str(setuid.pid))
    wait("go")
    exec_pid = os.getppid()
    os.kill(exec_pid, signal.SIGKILL)
    while os.getppid() == exec_pid:
        time.sleep(0.01)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            put("worker.pid", str(os.getpid()))
            while True:
                time.sleep(1)
        wait("orphan")
        os._exit(0)
    wait("orphan")
    os._exit(0)
""")

# A command whose stubborn worker (setsid, double-forked, ignores SIGTERM) starts under exec; on
# `go` the command SIGKILLs exec and exits, which leaves the worker to init.
LEAVES_A_WORKER = textwrap.dedent("""
    import os, signal, sys, time
    d = sys.argv[1]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(os.path.join(d, "worker.pid.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(d, "worker.pid.tmp"), os.path.join(d, "worker.pid"))
            while True:
                time.sleep(1)
        os._exit(0)
    while not os.path.exists(os.path.join(d, "go")):
        time.sleep(0.01)
    os.kill(os.getppid(), signal.SIGKILL)
""")

# The window tree mode leaves: exec killed, a worker double-forked and orphaned at once.
INSTANT = textwrap.dedent("""
    import os, signal, sys, time
    d = sys.argv[1]
    while not os.path.exists(os.path.join(d, "go")):
        time.sleep(0.01)
    os.kill(os.getppid(), signal.SIGKILL)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(os.path.join(d, "worker.pid.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(d, "worker.pid.tmp"), os.path.join(d, "worker.pid"))
            while True:
                time.sleep(1)
""")

# A healthy command: a child of its own, runs across the ticks it is told to, exits 0.
HEALTHY = textwrap.dedent("""
    import os, subprocess, sys, time
    kid = subprocess.Popen(["sleep", "600"])
    with open(os.path.join(sys.argv[1], "healthy.pid.tmp"), "w") as f:
        f.write(str(kid.pid))
    os.rename(os.path.join(sys.argv[1], "healthy.pid.tmp"), os.path.join(sys.argv[1], "healthy.pid"))
    while not os.path.exists(os.path.join(sys.argv[1], "done")):
        time.sleep(0.01)
    kid.terminate()
    kid.wait()
""")


class World:
    """Two local users, a store both may write, the daemon's key and socket, the daemon's tick."""

    def __init__(self) -> None:
        from attest_support import Attestor, LocalUsers, foreign_python, shared_sqlite

        self.users = LocalUsers()
        self.agent, self.other = self.users.add("tree"), self.users.add("other")
        self.url, self.folder = shared_sqlite()
        self.attestor = Attestor(self.url)
        self.attestor.dir.chmod(0o711)  # the agent's user reaches the socket by its name
        self.attestor.start()
        self.python, self.env = foreign_python()
        self.env.update(HOME=str(self.folder), AGENT_WATCHDOG_SOCKET=self.attestor.socket)
        self.engine = make_engine(self.url)
        self.cfg = config(daemon={"allowed_users": [self.agent, self.other], "cancel_grace_s": CANCEL_GRACE_S,
                             "term_grace_s": TERM_GRACE_S},
                     agents={"pausing": {"on_breach": "pause", "max_wall_s": 60}})
        self.tk = self.daemon()
        self.spare: list[subprocess.Popen] = []

    def daemon(self) -> Ticker:
        """The daemon's tick (a new one: a restarted daemon, on the same state file).
        The other user is allowed too: what spares its processes is the tree's own user, not a gap."""
        return Ticker(self.engine, self.cfg, Killer(allowed_users=[self.agent, self.other]),
                      sealer=self.attestor.sealer)

    def exec(self, name: str, script: str, *args: str) -> subprocess.Popen:
        d = self.folder / name
        d.mkdir(mode=0o777)
        d.chmod(0o777)
        log = open(d / "exec.log", "w")  # not a pipe: an orphan would hold it open
        return subprocess.Popen([self.python, "-m", "watchdog.cli", "--db", self.url, "exec", "--agent", name,
                                 "--kill-mode", "tree", "-v", "--", self.python, "-c", script, str(d), *args],
                                user=self.agent, env=self.env, cwd=str(self.folder), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)

    def bystander(self, user: str) -> psutil.Process:
        """A process of `user` outside every exec'd tree."""
        p = subprocess.Popen(["sleep", "600"], user=user, start_new_session=True)
        self.spare.append(p)
        return psutil.Process(p.pid)

    def run_of(self, agent: str):
        assert wait_until(lambda: any(r.agent == agent for r in exec_runs(self.engine))), "exec never registered"
        (run,) = [r for r in exec_runs(self.engine) if r.agent == agent]
        assert wait_until(lambda: attestation(self.engine, run.id) is not None), "exec never attested"
        return run

    def close(self) -> None:
        for p in self.spare:
            p.kill()
            p.wait()
        # Whatever a failed test left of these two users' processes (users this file made).
        mine = {_uid(self.agent), _uid(self.other)}
        for proc in psutil.process_iter(["uids"]):
            if proc.info["uids"] is not None and {proc.info["uids"].real, proc.info["uids"].effective} & mine:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
        self.attestor.close()
        self.engine.dispose()
        self.users.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def world():
    w = World()
    yield w
    w.close()


def _pid(path: Path) -> psutil.Process:
    assert wait_until(path.exists), f"{path} never written"
    return psutil.Process(int(path.read_text()))


def _taken_down(world, run, worker: psutil.Process, stopped_at) -> list[str]:
    """The ladder's ticks after a stop at `stopped_at`: SIGTERM (ignored), SIGKILL, the end. The
    actions recorded for the run."""
    t = later(stopped_at, CANCEL_GRACE_S + 0.1)
    world.tk.tick(t)  # SIGTERM to the worker (ignored)
    assert run_row(world.engine, run.id).signal_stage == lc.Stage.TERM
    world.tk.tick(later(t, TERM_GRACE_S + 0.1))  # SIGKILL
    assert wait_until(lambda: gone(worker)), "the worker survived the SIGKILL"
    world.tk.tick(later(t, TERM_GRACE_S + 0.2))
    row = run_row(world.engine, run.id)
    assert (row.status, row.stop_reason) == (lc.KILLED, lc.PROCESS_GONE)
    acts = [i.action for i in interventions_of(world.engine, run.id)]
    assert acts.count(Action.STOP_REQUESTED) == 1 and Action.SIGKILL in acts and acts[-1] == Action.ENDED, acts
    return acts


def test_a_worker_double_forked_after_the_command_killed_exec_is_taken_down(world):
    # Another user's setuid program, which the command starts inside its own tree.
    foreign = world.folder / "foreign-sleep"
    shutil.copy("/bin/sleep", foreign)
    os.chown(foreign, _uid(world.other), -1)
    foreign.chmod(0o4755)
    mine, theirs = world.bystander(world.agent), world.bystander(world.other)
    p = world.exec("escape", ATTACK, str(foreign))
    d = world.folder / "escape"
    run = world.run_of("escape")
    setuid = _pid(d / "foreign.pid")
    assert wait_until(lambda: setuid.uids().effective == _uid(world.other))
    t0 = utcnow()
    world.tk.tick(t0)  # the command, under exec: pinned
    memory = world.tk.exec_trees.memory
    assert memory.pinned(run.id) == 1, "only the command: the setuid process is another user's"
    (d / "go").touch()
    worker = _pid(d / "worker.pid")
    assert p.wait(timeout=60) == -signal.SIGKILL  # exec, SIGKILLed by its own command
    rep = world.tk.tick(later(t0, 1))  # exec gone; the worker is still under the command: pinned
    assert rep.stops == [(run.id, lc.PROCESS_GONE)], rep
    assert memory.pinned(run.id) == 3  # the command, the middle process, the worker
    (d / "orphan").touch()
    assert wait_until(lambda: _orphaned(worker)), "the worker was never reparented away"
    acts = _taken_down(world, run, worker, later(t0, 1))
    # One stop alert, and one for the signals past the cooperative stop.
    assert [a.dedupe_key.split(":")[0] for a in alerts_of(world.engine, run.id)] == ["stop", "escalate"]
    assert "process_gone" in alerts_of(world.engine, run.id)[0].title
    for _ in range(2):  # nothing more, however often it ticks
        world.tk.tick(later(t0, 9))
    assert [i.action for i in interventions_of(world.engine, run.id)] == acts
    # Never signalled: another user's process inside the tree, and both bystanders.
    assert not any(gone(proc) for proc in (setuid, mine, theirs))


def test_a_paused_run_whose_exec_is_killed_is_stopped_and_its_tree_taken_down(world):
    p = world.exec("pausing", LEAVES_A_WORKER)
    d = world.folder / "pausing"
    run = world.run_of("pausing")
    worker = _pid(d / "worker.pid")
    assert wait_until(lambda: worker.ppid() == p.pid)  # reparented to exec, its subreaper
    t0 = utcnow()
    rep = world.tk.tick(later(t0, 61))  # past max_wall_s: paused (on_breach = "pause"), the worker pinned
    assert rep.pauses == [(run.id, lc.WALL_CLOCK)], rep
    (d / "go").touch()
    assert p.wait(timeout=60) == -signal.SIGKILL
    assert wait_until(lambda: _orphaned(worker))
    rep = world.tk.tick(later(t0, 62))  # not lost: exec is gone, its tree is not
    assert rep.stops == [(run.id, lc.PROCESS_GONE)] and not rep.lost, rep
    _taken_down(world, run, worker, later(t0, 62))


def test_a_daemon_restarted_after_exec_died_still_takes_the_tree_down(world):
    p = world.exec("restarted", LEAVES_A_WORKER)
    d = world.folder / "restarted"
    run = world.run_of("restarted")
    worker = _pid(d / "worker.pid")
    assert wait_until(lambda: worker.ppid() == p.pid)
    t0 = utcnow()
    world.tk.tick(t0)  # the command and the worker pinned, in the daemon's state file too
    (d / "go").touch()
    assert p.wait(timeout=60) == -signal.SIGKILL
    assert wait_until(lambda: _orphaned(worker))
    world.tk = world.daemon()  # restarted: nothing but its state file knows the tree
    rep = world.tk.tick(later(t0, 1))
    assert rep.stops == [(run.id, lc.PROCESS_GONE)] and not rep.lost, rep
    _taken_down(world, run, worker, later(t0, 1))


def test_the_window_left_is_named_in_the_lost_alert(world):
    """Born and orphaned within one tick: nothing links the worker to the run (use cgroup); the
    run is lost, and the alert says what may be left."""
    p = world.exec("instant", INSTANT)
    d = world.folder / "instant"
    run = world.run_of("instant")
    (command,) = psutil.Process(p.pid).children()
    t0 = utcnow()
    world.tk.tick(t0)
    (d / "go").touch()
    worker = _pid(d / "worker.pid")
    assert p.wait(timeout=60) == -signal.SIGKILL
    assert wait_until(lambda: _orphaned(worker) and gone(command))  # the middle and the command exited
    rep = world.tk.tick(later(t0, 1))
    assert rep.lost == [run.id] and not rep.stops, rep
    (alert,) = alerts_of(world.engine, run.id)
    assert "born and orphaned since its last look" in alert.body and "cgroup" in alert.body
    worker.kill()


def test_a_healthy_command_under_exec_runs_to_its_exit_untouched(world):
    p = world.exec("healthy", HEALTHY)
    d = world.folder / "healthy"
    run = world.run_of("healthy")
    kid = _pid(d / "healthy.pid")
    t0 = utcnow()
    for i in range(3):
        world.tk.tick(later(t0, i))
    assert world.tk.exec_trees.memory.pinned(run.id) == 2  # the command and its child
    (d / "done").touch()
    assert p.wait(timeout=60) == 0, (d / "exec.log").read_text()
    world.tk.tick(later(t0, 3))
    assert wait_until(lambda: gone(kid))
    row = run_row(world.engine, run.id)
    assert (row.status, row.stop_reason) == (lc.COMPLETED, None)
    assert interventions_of(world.engine, run.id) == [] and alerts_of(world.engine, run.id) == []
    log = (d / "exec.log").read_text()
    assert "born and orphaned within one tick" in log and "--kill-mode cgroup" in log, log


def _uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid


def _orphaned(proc: psutil.Process) -> bool:
    """Reparented away from the tree: its parent is no process of the run's any more."""
    try:
        parent = proc.parent()
    except psutil.Error:
        return True
    return parent is None or parent.uids().real != proc.uids().real

