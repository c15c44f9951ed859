"""Liveness without polling (watchdog.daemon.stops.liveness), with real child processes: a process's
end is known from its pidfd, a recycled or vanished pid is never taken for the run's process,
and the polling fallback says the same."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from watchdog.core.procid import create_time
from watchdog.daemon.stops.liveness import Liveness

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
MODES = ["pidfd", "polling"]


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _spawn(children: list[subprocess.Popen[bytes]]) -> tuple[int, float]:
    p = subprocess.Popen(SLEEPER)
    children.append(p)
    ctime = create_time(p.pid)
    assert ctime is not None
    return p.pid, ctime


def _liveness(mode: str) -> Liveness:
    live = Liveness(use_pidfd=mode == "pidfd")
    if mode == "pidfd":
        assert live.uses_pidfd and live.fileno() is not None, "this Linux/Python has no pidfd"
    return live


def _until_dead(live: Liveness, want: set[str]) -> set[str]:
    """dead() until `want` is reported (each end is an event: no timing assumed beyond a bound)."""
    got: set[str] = set()
    for _ in range(200):
        got.update(live.dead(timeout_s=0.05))
        if want <= got:
            break
    return got


@pytest.mark.parametrize("mode", MODES)
def test_a_process_that_ends_is_reported_once_the_others_are_not(children, mode):
    with _liveness(mode) as live:
        procs = {f"run{k}": _spawn(children) for k in range(4)}
        for rid, (pid, ctime) in procs.items():
            assert live.watch(rid, pid, ctime)
        assert live.dead() == [] and len(live) == 4
        os.kill(procs["run1"][0], signal.SIGKILL)  # not reaped: a zombie still holds the pid
        os.kill(procs["run3"][0], signal.SIGTERM)
        assert _until_dead(live, {"run1", "run3"}) == {"run1", "run3"}
        assert live.dead() == [] and set(procs) - {"run1", "run3"} == {r for r in procs if r in live}
        assert (live.polled() == 2) == (mode == "polling")


def test_the_epoll_wakes_a_sleeping_loop_when_a_process_ends(children):
    with _liveness("pidfd") as live:
        pid, ctime = _spawn(children)
        live.watch("r", pid, ctime)
        fd = live.fileno()
        assert fd is not None
        assert select.select([fd], [], [], 0)[0] == []  # nothing yet: the loop would sleep
        os.kill(pid, signal.SIGKILL)
        assert select.select([fd], [], [], 30)[0] == [fd]  # woken by the end, not by a poll
        assert live.dead() == ["r"]


@pytest.mark.parametrize("mode", MODES)
def test_a_recycled_pid_is_not_the_runs_process(children, mode):
    """The pid runs, but since another time than the run's process: that process is gone."""
    with _liveness(mode) as live:
        pid, ctime = _spawn(children)
        assert not live.watch("old", pid, ctime - 5.0)
        assert "old" not in live and live.dead() == ["old"] and live.dead() == []
        assert live.watch("mine", pid, ctime)  # the same pid with its own create time is watched
        assert live.dead() == []


@pytest.mark.parametrize("mode", MODES)
def test_a_process_already_gone_is_reported_at_once(children, mode):
    with _liveness(mode) as live:
        pid, ctime = _spawn(children)
        children[-1].kill()
        children[-1].wait()  # reaped: the pid names nothing (or, later, someone else)
        assert not live.watch("gone", pid, ctime)
        assert live.dead() == ["gone"]
        assert not live.watch("nothing", 0, 1.0) and live.dead() == ["nothing"]


@pytest.mark.parametrize("mode", MODES)
def test_unwatch_and_rewatch(children, mode):
    with _liveness(mode) as live:
        pid, ctime = _spawn(children)
        other_pid, other_ctime = _spawn(children)
        assert live.watch("r", pid, ctime) and live.watch("r", pid, ctime)  # the same: kept
        assert live.watch("r", other_pid, other_ctime)  # another process for the run: moved
        os.kill(pid, signal.SIGKILL)
        children[0].wait()
        assert live.dead(timeout_s=0.2) == []  # not the run's process any more
        live.unwatch("r")
        live.unwatch("never")
        os.kill(other_pid, signal.SIGKILL)
        assert live.dead(timeout_s=0.2) == [] and len(live) == 0


@pytest.mark.parametrize("mode", MODES)
def test_keep_stops_watching_the_runs_that_left_and_forgets_their_ends(children, mode):
    # The incremental tick (watchdog.daemon.tick.activeset) keeps only the runs still active: an
    # ended run's process is no longer watched, and its end is never reported.
    with _liveness(mode) as live:
        procs = {f"run{k}": _spawn(children) for k in range(3)}
        for rid, (pid, ctime) in procs.items():
            assert live.watch(rid, pid, ctime)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        assert not live.watch("ended", gone.pid, 1.0)  # already gone: reported by the next dead()...
        live.keep({"run0", "run2"})  # ...unless the run left first
        assert len(live) == 2 and "run1" not in live
        for pid, _ctime in procs.values():
            os.kill(pid, signal.SIGKILL)
        assert _until_dead(live, {"run0", "run2"}) == {"run0", "run2"}


# Run in a child Python: lowering RLIMIT_NOFILE here would leak into the tests that follow.
_UNDER_A_LOW_LIMIT = r"""
import json, os, resource, signal, subprocess, sys
from watchdog.core.procid import create_time
from watchdog.daemon.stops.liveness import FD_RESERVE, Liveness

soft, reserve, n = (int(a) for a in sys.argv[1:])
children = [subprocess.Popen(["sleep", "600"]) for _ in range(n)]  # spawned before the limit bites
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, soft))  # the hard one too: it cannot be raised

def pidfds_held():  # what the kernel says is open, not what Liveness counts
    return sum(os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]"
               for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))

out = {"base_fds": len(os.listdir("/proc/self/fd"))}
try:
    with Liveness(fd_reserve=reserve) as live:
        out["polled_after"] = []
        for k, c in enumerate(children):
            assert live.watch(f"run{k}", c.pid, create_time(c.pid))
            out["polled_after"].append(live.polled())
        out.update(held=pidfds_held(), counted=live.pidfds(), watched=len(live))
        os.kill(children[0].pid, signal.SIGKILL)  # the first watched holds a pidfd...
        os.kill(children[-1].pid, signal.SIGKILL)  # ...the last is polled
        dead = set()
        for _ in range(200):
            dead.update(live.dead(timeout_s=0.05))
            if len(dead) >= 2:
                break
        out.update(dead=sorted(dead), still=len(live))
        files = []
        try:
            while len(files) < reserve:
                files.append(open(os.devnull))
        except OSError:
            pass
        out["opened"] = len(files)
        for f in files:
            f.close()
    with Liveness() as live:  # FD_RESERVE by default: more than this whole soft limit
        c = children[1]
        assert live.watch("default", c.pid, create_time(c.pid))
        out.update(default_reserve=FD_RESERVE, default_pidfds=live.pidfds(), default_polled=live.polled())
finally:
    for c in children:
        c.kill()
        c.wait()
print(json.dumps(out))
"""


def test_pidfds_leave_a_reserve_of_descriptors_and_the_rest_are_polled():
    soft, reserve, n = 64, 32, 40
    done = subprocess.run([sys.executable, "-c", _UNDER_A_LOW_LIMIT, str(soft), str(reserve), str(n)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    budget = soft - reserve
    # The first `budget` processes get a pidfd, each one after that is polled.
    assert out["polled_after"] == [max(0, k + 1 - budget) for k in range(n)]
    assert out["held"] == out["counted"] == budget and out["watched"] == n
    # A pidfd-watched and a polled process that end are both reported, and nothing else.
    assert out["dead"] == ["run0", f"run{n - 1}"] and out["still"] == n - 2
    # What the reserve is for: the daemon can still open files (all of it, less what it held).
    assert out["opened"] >= reserve - out["base_fds"] - 1  # - 1: the epoll
    assert out["default_reserve"] >= soft and (out["default_pidfds"], out["default_polled"]) == (0, 1)
