"""Liveness without polling (watchdog.daemon.liveness), with real child processes: a process's
end is known from its pidfd, a recycled or vanished pid is never taken for the run's process,
and the polling fallback says the same."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from watchdog.core.procid import create_time
from watchdog.daemon.liveness import Liveness

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
    # The incremental tick (watchdog.daemon.activeset) keeps only the runs still active: an
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
