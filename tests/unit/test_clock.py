"""The jump detector (pure) and the monotonic job loop (the daemon rebasing its store after a
jump: tests/store/test_clock_store.py)."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

from watchdog.daemon.tick.clock import JumpDetector
from watchdog.daemon.process.loop import Periodic

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def test_clocks_that_agree_are_no_jump():
    d = JumpDetector(tolerance_s=5)
    assert d.observe(100.0, at(0)) is None  # the first reading has nothing to compare with
    assert d.observe(105.0, at(5)) is None
    assert d.observe(112.0, at(11)) is None  # a slow tick: 1 s of disagreement is not a jump
    assert d.observe(117.0, at(16)) is None


@pytest.mark.parametrize("skew_s", [3600, -3600, 6])
def test_a_step_of_the_clock_larger_than_a_tick_is_a_jump_once(skew_s):
    d = JumpDetector(tolerance_s=5)
    d.observe(100.0, at(0))
    jump = d.observe(105.0, at(5 + skew_s))
    assert jump is not None
    assert jump.skew_s == pytest.approx(skew_s)
    assert jump.monotonic_delta_s == pytest.approx(5) and jump.at == at(5 + skew_s)
    assert f"{skew_s:+.0f} s" in jump.describe()
    # The next tick compares with the reading after the jump: the jump is reported once.
    assert d.observe(110.0, at(10 + skew_s)) is None


def test_a_clock_that_stands_still_is_a_jump_backwards():
    d = JumpDetector(tolerance_s=1)
    d.observe(0.0, at(0))
    jump = d.observe(30.0, at(0))
    assert jump is not None and jump.skew_s == pytest.approx(-30)


def test_the_tolerance_must_be_positive():
    with pytest.raises(ValueError, match="tolerance_s"):
        JumpDetector(tolerance_s=0)


def test_the_loop_runs_one_at_a_time_and_skips_the_intervals_it_overran():
    stop = threading.Event()
    running = []
    overlap = []
    skips = []

    def job():
        if running:
            overlap.append(True)
        running.append(1)
        time.sleep(0.35 if len(skips) == 0 else 0)  # the first run overruns three intervals
        running.pop()

    loop = Periodic("t", job, 0.1, stop, on_skip=skips.append).start()
    deadline = time.monotonic() + 30
    while loop.runs < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    loop.join()
    assert loop.runs >= 4 and not overlap
    assert skips and skips[0] >= 3  # the runs it overlapped were skipped, not queued up to fire in a burst


def test_a_failing_job_does_not_end_the_loop():
    stop = threading.Event()
    calls = []

    def job():
        calls.append(1)
        raise RuntimeError("boom")

    loop = Periodic("t", job, 0.01, stop).start()
    deadline = time.monotonic() + 30
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    loop.join()
    assert len(calls) >= 3


# --- the active runs' times after a jump ---------------------------------------------------------


def jump_of(skew_s: float, before: dt.datetime, gap_s: float = 1.0):
    d = JumpDetector(tolerance_s=1)
    d.observe(0.0, before)
    return d.observe(gap_s, before + dt.timedelta(seconds=gap_s + skew_s))


def test_times_read_before_a_forward_jump_move_with_it_the_later_ones_stay():
    j = jump_of(3600, at(100))
    assert j.rebased(at(90)) == at(3690)  # started 10 s before the jump: still 10 s before it
    assert j.rebased(at(100)) == at(3700)
    assert j.rebased(at(3701)) == at(3701)  # read on the new clock
    assert j.rebased(None) is None


def test_times_read_before_a_backward_jump_move_back_except_the_ambiguous_window():
    j = jump_of(-3600, at(3700))  # the clock read 3700, then 101 one second later
    assert j.at == at(101)
    assert j.rebased(at(3690)) == at(90)  # 10 s before the jump
    assert j.rebased(at(3700)) == at(100)
    assert j.rebased(at(100.5)) == at(100.5)  # in [at - 1 s, at]: may be the new clock's, left alone
    assert j.rebased(at(50)) == at(50 - 3600)  # before the new clock's jump instant: the old clock's
