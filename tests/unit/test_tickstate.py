"""The Ticker's memory between ticks (TickState) and one tick's (ThisTick), and the order a
MoneyTick enforces: pure, no store, no processes."""

from __future__ import annotations

import datetime as dt

import pytest

from watchdog.core.config import parse
from watchdog.daemon.money.money import Money
from watchdog.daemon.money.moneytick import MoneyOrderError, Phase
from watchdog.daemon.tick.tickstate import MAX_PAUSE_KEYS, PeriodStop, ThisTick, TickReport, TickState

T0 = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)


def test_a_new_state_holds_nothing():
    assert not TickState().holds_runs()


def test_forget_keeps_only_the_active_runs():
    s = TickState(acked={"a", "b"}, decided={"b", "c"}, rate_alarmed={"a": T0, "d": T0}, backstopped={"c", "e"},
                  pause_seen={"pause:a:1.0"}, resume_seen={("a", 1)})
    assert s.holds_runs()
    s.forget({"a", "c"})
    assert (s.acked, s.decided, s.rate_alarmed, s.backstopped) == ({"a"}, {"c"}, {"a": T0}, {"c"})
    # The pause keys are alert keys, bounded by their number, not by the active runs.
    assert (s.pause_seen, s.resume_seen) == ({"pause:a:1.0"}, {("a", 1)})


def test_forget_of_every_run_empties_the_state():
    s = TickState(acked={"a"}, decided={"a"}, rate_alarmed={"a": T0}, backstopped={"a"})
    s.forget(set())
    assert not s.holds_runs()


def test_past_their_bound_the_pause_keys_are_forgotten_at_once():
    s = TickState(pause_seen={f"pause:{i}:0" for i in range(MAX_PAUSE_KEYS + 1)}, resume_seen={("r", 1)})
    assert s.holds_runs()  # a bound to enforce, even with no run to forget
    s.forget({"r"})
    assert not s.pause_seen and not s.resume_seen
    s = TickState(pause_seen={f"pause:{i}:0" for i in range(MAX_PAUSE_KEYS)})
    s.forget(set())
    assert len(s.pause_seen) == MAX_PAUSE_KEYS


def test_states_do_not_share_their_sets():
    a, b = TickState(), TickState()
    a.acked.add("x")
    assert not b.acked


def test_this_tick_starts_empty():
    this = ThisTick(now=T0, rep=TickReport(at=T0))
    assert (this.skip_clock, this.judged, this.live, this.money) == (False, None, None, None)
    assert this.sharing[("h", 1)] == 0 and this.period_stops == []
    this.period_stops.append(PeriodStop("r1", "daily_budget", "agent:bot"))
    assert ThisTick(now=T0, rep=TickReport(at=T0)).period_stops == []


# -- the money's order: each step checks the one before it, before any I/O ---------------------


def _money() -> Money:
    return Money(parse({}), "test")


def test_judge_before_read_is_refused():
    mt = _money().begin(T0)
    assert mt.phase is Phase.BEGUN
    with pytest.raises(MoneyOrderError):
        mt.judge(None, [], [])
    assert mt.phase is Phase.BEGUN


def test_closing_and_finish_before_judge_are_refused():
    mt = _money().begin(T0)
    with pytest.raises(MoneyOrderError):
        mt.closing("r1", "bot")
    with pytest.raises(MoneyOrderError):
        mt.finish(None, {})


def test_each_tick_begins_its_own_money_tick():
    m = _money()
    a, b = m.begin(T0), m.begin(T0 + dt.timedelta(seconds=5))
    assert a is not b and a.spend is not b.spend and b.phase is Phase.BEGUN
