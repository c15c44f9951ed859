"""The policies are pure: a snapshot, budgets and a clock in, verdicts out.

Each policy trips just above its budget and not at it; when several trip, the
most specific cause is named first; a run can lower its budgets, never raise
them (unless its profile allows it); the tool rate alarms first and stops only
with on_rate = "stop".
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from watchdog.core import lifecycle as lc
from watchdog.core import policies as p
from watchdog.core.config import Budgets, parse
from watchdog.core.budgets import effective_budgets

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
B = Budgets()  # the documented defaults: 300 s, 12 steps, 40 calls, 2.00 EUR, 3 identical, 120 s, 15/min


def snap(**kw) -> p.RunSnapshot:
    base = dict(id="r" * 32, agent="bot", started_at=T0, last_seen_at=T0, steps=0, tool_calls=0, tool_errors=0,
                cost_eur=0.0)
    base.update(kw)
    return p.RunSnapshot(**base)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def reasons(s, b=B, now=T0) -> list[str]:
    return [v.reason for v in p.evaluate(s, b, now)]


def test_defaults_are_the_documented_ones():
    assert (B.max_wall_s, B.max_steps, B.max_tool_calls, B.max_cost_eur, B.max_identical_calls,
            B.heartbeat_timeout_s, B.max_tool_calls_per_min, B.on_rate) == (300, 12, 40, 2.0, 3, 120, 15, "alert")


# -- each policy: trips just over its budget, not at it -------------------------------------------

# (policy, snapshot at the budget, snapshot just over it, now)
CASES = {
    lc.WALL_CLOCK: (p.wall_clock, dict(last_seen_at=at(299)), dict(last_seen_at=at(300)), None),
    lc.MAX_STEPS: (p.max_steps, dict(steps=12), dict(steps=13), T0),
    lc.MAX_TOOL_CALLS: (p.max_tool_calls, dict(tool_calls=40), dict(tool_calls=41), T0),
    lc.MAX_COST: (p.max_cost, dict(cost_eur=2.0), dict(cost_eur=2.01), T0),
    lc.LOOP_DETECTED: (p.loop_detected, dict(top_signature=("verify_iban", 2)),
                       dict(top_signature=("verify_iban", 3)), T0),
}


@pytest.mark.parametrize("reason", list(CASES))
def test_policy_trips_over_its_budget_only(reason):
    policy, below, over, now = CASES[reason]
    if reason == lc.WALL_CLOCK:
        assert policy(snap(**below), B, at(300)) is None  # exactly 300 s: not over
        v = policy(snap(**over), B, at(300.5))
    else:
        assert policy(snap(**below), B, now) is None
        v = policy(snap(**over), B, now)
    assert v is not None and v.reason == reason
    assert reasons(snap(**below), B, at(300) if reason == lc.WALL_CLOCK else now) == []
    assert reasons(snap(**over), B, at(300.5) if reason == lc.WALL_CLOCK else now) == [reason]


def test_wall_clock_counts_from_the_start():
    assert p.wall_clock(snap(), B, at(300)) is None
    v = p.wall_clock(snap(), B, at(301))
    assert (v.reason, v.value, v.limit) == (lc.WALL_CLOCK, 301, 300)
    assert "301 s > max_wall_s 300 s" in v.detail


def test_heartbeat_timeout_counts_from_the_last_write():
    s = snap(last_seen_at=at(100))
    assert p.heartbeat_timeout(s, B, at(220)) is None  # silent exactly 120 s
    v = p.heartbeat_timeout(s, B, at(221))
    assert (v.reason, v.value) == (lc.HEARTBEAT_TIMEOUT, 121)
    assert reasons(s, B, at(221)) == [lc.HEARTBEAT_TIMEOUT]


def test_details_read_like_the_alerts():
    assert p.max_steps(snap(steps=13), B, T0).detail == "steps 13/12"
    assert p.max_tool_calls(snap(tool_calls=41), B, T0).detail == "tool calls 41/40"
    assert p.max_cost(snap(cost_eur=2.04), B, T0).detail == "cost 2.04/2.00 EUR"
    assert p.loop_detected(snap(top_signature=("verify_iban", 40)), B, T0).detail.startswith("«verify_iban» called 40×")  # the tool: the writer's text, marked


def test_a_healthy_snapshot_has_no_verdict():
    s = snap(steps=5, tool_calls=20, cost_eur=1.5, top_signature=("search", 2), calls_last_min=15,
             top_tool_last_min=("search", 9), last_seen_at=at(200))
    assert p.evaluate(s, B, at(290)) == []
    assert p.rate_alarm(s, B, at(290)) is None


# -- priority: the most specific cause first --------------------------------------------------------


def test_priority_names_the_most_specific_cause_first():
    everything = snap(steps=13, tool_calls=41, cost_eur=2.5, top_signature=("verify_iban", 30), last_seen_at=T0,
                      calls_last_min=30, top_tool_last_min=("verify_iban", 30))
    stop_rate = dataclasses.replace(B, on_rate="stop")
    assert reasons(everything, stop_rate, at(400)) == [
        lc.LOOP_DETECTED, lc.MAX_COST, lc.MAX_TOOL_CALLS, lc.MAX_STEPS, lc.TOOL_RATE, lc.WALL_CLOCK,
        lc.HEARTBEAT_TIMEOUT]
    assert reasons(snap(steps=13, cost_eur=3.0))[0] == lc.MAX_COST
    assert reasons(snap(steps=13, top_signature=("x", 3)))[0] == lc.LOOP_DETECTED
    assert reasons(snap(last_seen_at=T0), B, at(301)) == [lc.WALL_CLOCK, lc.HEARTBEAT_TIMEOUT]  # silent too
    assert reasons(snap(last_seen_at=at(200)), B, at(301)) == [lc.WALL_CLOCK]


# -- the tool rate: alarm vs stop -------------------------------------------------------------------


def test_rate_alarms_but_does_not_stop_with_on_rate_alert():
    s = snap(tool_calls=16, calls_last_min=16, top_tool_last_min=("verify_iban", 14))
    assert p.evaluate(s, B, T0) == []
    alarm = p.rate_alarm(s, B, T0)
    assert alarm is not None and alarm.reason == lc.TOOL_RATE
    assert alarm.detail == "16 tool calls/min > 15, top «verify_iban» ×14"
    assert p.rate_alarm(dataclasses.replace(s, calls_last_min=15), B, T0) is None


def test_rate_stops_with_on_rate_stop():
    b = dataclasses.replace(B, on_rate="stop")
    s = snap(tool_calls=16, calls_last_min=16, top_tool_last_min=("verify_iban", 14))
    assert reasons(s, b) == [lc.TOOL_RATE]
    assert reasons(dataclasses.replace(s, calls_last_min=15), b) == []


# -- effective budgets: lowered, never raised ------------------------------------------------------


def _row(**asked):
    return {k: None for k in ("max_wall_s", "max_steps", "max_tool_calls", "max_cost_eur", "max_identical_calls",
                              "heartbeat_timeout_s")} | asked


def test_effective_budgets_are_the_profile_when_the_run_asks_nothing():
    cfg = parse({"defaults": {"max_steps": 20}, "agents": {"support-bot": {"max_steps": 8}}})
    assert effective_budgets(cfg.profile("support-bot"), _row()) == cfg.profile("support-bot")
    assert effective_budgets(cfg.profile("support-bot"), _row()).max_steps == 8
    assert effective_budgets(cfg.profile("other"), _row()).max_steps == 20
    assert cfg.profile("support-bot").max_tool_calls == 40  # the profile starts from [defaults]


def test_a_run_lowers_its_budgets():
    cfg = parse({"agents": {"support-bot": {"max_steps": 8, "max_cost_eur": 1.0}}})
    eff = effective_budgets(cfg.profile("support-bot"),
                            _row(max_steps=3, max_cost_eur=0.25, max_wall_s=30.0, heartbeat_timeout_s=10.0,
                                 max_identical_calls=2, max_tool_calls=5))
    assert (eff.max_steps, eff.max_cost_eur, eff.max_wall_s, eff.heartbeat_timeout_s, eff.max_identical_calls,
            eff.max_tool_calls) == (3, 0.25, 30.0, 10.0, 2, 5)
    assert p.max_steps(snap(steps=4), eff, T0).reason == lc.MAX_STEPS
    assert p.max_steps(snap(steps=4), cfg.profile("support-bot"), T0) is None


def test_a_run_never_raises_its_budgets():
    cfg = parse({"agents": {"support-bot": {"max_steps": 8}}})
    eff = effective_budgets(cfg.profile("support-bot"), _row(max_steps=100, max_cost_eur=50.0, max_wall_s=3600.0))
    assert (eff.max_steps, eff.max_cost_eur, eff.max_wall_s) == (8, 2.0, 300.0)
    assert p.max_steps(snap(steps=9), eff, T0).detail == "steps 9/8"


def test_a_profile_may_allow_raising():
    cfg = parse({"agents": {"batch": {"max_steps": 8, "runs_may_raise": True}}})
    eff = effective_budgets(cfg.profile("batch"), _row(max_steps=100, max_cost_eur=0.5))
    assert (eff.max_steps, eff.max_cost_eur) == (100, 0.5)


def test_effective_budgets_accept_a_store_row_object():
    class Row:  # what SQLAlchemy hands the tick: attributes, not a dict
        max_steps = 4
        max_cost_eur = None

    assert effective_budgets(B, Row()).max_steps == 4
    assert effective_budgets(B, Row()).max_cost_eur == 2.0
