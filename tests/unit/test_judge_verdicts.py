"""The judge's verdicts, each just under and at/over its threshold, with the clock passed in.

Every rule here is the real function the daemon (or the SDK's guard) calls: the budgets'
policies, the period budgets with warn_at, [[budgets]] label budgets, pause with a resume
grant, and the circuit's moves. No socket, process or database (tests/purity.py guards it).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from watchdog.core import circuit_rules as cr, lifecycle as lc, policies, policies as p
from watchdog.core.budgets import Budgets
from watchdog.core.lifecycle import Circuit
from watchdog.core.periods import DAY, MONTH, LabelBudget, PeriodState, build_states, closed_entry, refusal
from watchdog.sdk.guards import oscillates

UTC = dt.timezone.utc
T0 = dt.datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)
B = Budgets()  # defaults: 300 s, 12 steps, 40 calls, 2.00 EUR, 2M tokens, 3 identical, 120 s silence


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def snap(**kw: Any) -> p.RunSnapshot:
    base: dict[str, Any] = dict(id="r" * 32, agent="bot", started_at=T0, last_seen_at=T0, steps=0, tool_calls=0,
                                tool_errors=0, cost_eur=0.0)
    base.update(kw)
    return p.RunSnapshot(**base)


def reasons(s: p.RunSnapshot, now: dt.datetime, b: Budgets = B) -> list[str]:
    return [v.reason for v in p.evaluate(s, b, now)]


# -- per-run budgets: (snapshot fields under, at/over, now under, now over) --------------------------------------
# The silent run is kept fresh for the wall clock (last_seen_at moves with now) and young for silence.
RUN_CASES = {
    lc.WALL_CLOCK: (dict(last_seen_at=at(300)), dict(last_seen_at=at(300.5)), at(300), at(300.5)),
    lc.MAX_STEPS: (dict(steps=12), dict(steps=13), T0, T0),
    lc.MAX_TOOL_CALLS: (dict(tool_calls=40), dict(tool_calls=41), T0, T0),
    lc.MAX_TOKENS: (dict(tokens=2_000_000), dict(tokens=2_000_001), T0, T0),
    lc.MAX_COST: (dict(cost_eur=2.0), dict(cost_eur=2.001), T0, T0),
    lc.LOOP_DETECTED: (dict(top_signature=("verify_iban", 2)), dict(top_signature=("verify_iban", 3)), T0, T0),
    lc.HEARTBEAT_TIMEOUT: (dict(started_at=at(60)), dict(started_at=at(60)), at(120), at(120.5)),
}


@pytest.mark.parametrize("reason", list(RUN_CASES))
def test_run_budget_verdict_under_and_over(reason: str) -> None:
    under, over, now_under, now_over = RUN_CASES[reason]
    assert reasons(snap(**under), now_under) == []
    verdicts = p.evaluate(snap(**over), B, now_over)
    assert [v.reason for v in verdicts] == [reason]
    assert verdicts[0].value > verdicts[0].limit or reason == lc.LOOP_DETECTED  # a loop trips at its limit


def test_identical_calls_verdict_names_the_repeated_tool() -> None:
    (v,) = p.evaluate(snap(top_signature=("verify_iban", 3)), B, T0)
    assert (v.reason, v.value, v.limit) == (lc.LOOP_DETECTED, 3, 3)
    assert v.detail.startswith("«verify_iban» ")


def test_a_b_a_b_oscillation_under_and_at_the_window() -> None:
    a, b = ("search", "h1"), ("open", "h2")
    assert not oscillates([a, b, a])  # three calls: not yet a pattern
    assert not oscillates([a, b, a, a])  # a break in the turn-taking
    assert not oscillates([a, a, a, a])  # identical calls are the other rule's
    assert oscillates([a, b, a, b])
    assert oscillates([a, a, b, a, b])  # the last four count


def test_silence_is_not_judged_across_a_clock_jump() -> None:
    silent = snap(started_at=at(60))
    assert reasons(silent, at(121)) == [lc.HEARTBEAT_TIMEOUT]
    assert p.evaluate(silent, B, at(121), skip_clock=True) == []


def test_the_most_specific_verdict_comes_first() -> None:
    s = snap(steps=13, cost_eur=2.5, top_signature=("t", 3), last_seen_at=at(400))
    assert reasons(s, at(400)) == [lc.LOOP_DETECTED, lc.MAX_COST, lc.MAX_STEPS, lc.WALL_CLOCK]


# -- period budgets: daily/monthly per agent and [[budgets]] label budgets, with warn_at --------------------------


def _states(spent: dict[tuple[str, str], float], prof: Budgets, labels: tuple[LabelBudget, ...] = ()
            ) -> dict[tuple[str, str], PeriodState]:
    out = build_states(spent, ["bot"], lambda _agent: prof, labels, T0, UTC)
    return {(s.scope.key, s.period): s for s in out}


@pytest.mark.parametrize("period,reason", [(DAY, lc.DAILY_BUDGET), (MONTH, lc.MONTHLY_BUDGET)])
def test_agent_period_budget_warns_then_closes(period: str, reason: str) -> None:
    prof = Budgets(max_cost_eur_per_day=10.0, max_cost_eur_per_month=10.0, warn_at=0.5)
    key = ("agent:bot", period)
    quiet = _states({key: 4.99}, prof)[key]
    assert not quiet.warned and not quiet.closed
    warned = _states({key: 5.0}, prof)[key]
    assert warned.warned and not warned.closed
    under = _states({key: 9.99}, prof)[key]
    assert under.warned and not under.closed
    spent = _states({key: 10.0}, prof)[key]
    assert spent.closed and spent.reason == reason
    v = p.period_budget(spent)
    assert (v.reason, v.value, v.limit) == (reason, 10.0, 10.0)
    # the period verdict joins the run's own, the most specific first
    assert [x.reason for x in p.with_period(p.evaluate(snap(steps=13), B, T0), spent)] == [lc.MAX_STEPS, reason]
    assert p.with_period([], None) == []


def test_label_budget_warns_then_closes_and_refuses_matching_new_runs() -> None:
    acme = LabelBudget({"tenant": "acme"}, max_cost_eur_per_day=4.0, warn_at=0.75)
    prof = Budgets(max_cost_eur_per_day=0.0, max_cost_eur_per_month=0.0)
    key = (acme.scope, DAY)
    under = _states({key: 2.99}, prof, (acme,))[key]
    assert (under.scope.kind, under.warned, under.closed) == ("labels", False, False)
    warned = _states({key: 3.0}, prof, (acme,))[key]
    assert warned.warned and not warned.closed
    spent = _states({key: 4.0}, prof, (acme,))[key]
    assert spent.closed and p.period_budget(spent).reason == lc.DAILY_BUDGET
    entries = [closed_entry(spent)]
    refused = refusal(entries, "bot", {"tenant": "acme", "env": "prod"}, T0)
    assert refused is not None and refused[0] == lc.DAILY_BUDGET
    assert refusal(entries, "bot", {"tenant": "other"}, T0) is None
    assert refusal(entries, "bot", {"tenant": "acme"}, spent.end) is None  # the next day opens again


def test_a_zero_period_budget_never_closes() -> None:
    prof = Budgets(max_cost_eur_per_day=0.0, max_cost_eur_per_month=0.0)
    states = _states({("agent:bot", DAY): 1000.0}, prof)
    assert not states[("agent:bot", DAY)].closed and not states[("agent:bot", DAY)].warned


# -- pause on a budget, and the resume grant ----------------------------------------------------------------------


def test_a_pausing_budget_pauses_and_a_grant_lifts_it() -> None:
    prof = Budgets(on_breach={"max_steps": "pause"})
    used_at = snap(steps=12)
    assert p.evaluate(used_at, prof, T0) == []  # at the budget: nothing to decide
    over = p.evaluate(snap(steps=13), prof, T0)
    assert policies.decide(over, prof) == ("pause", over[0])
    assert policies.stops_while_paused(over) == []  # a paused budget is not judged again
    # the run took two more steps before it was held: 15 used against 12
    used = p.totals(snap(steps=15), T0)
    short = policies.Grant.from_options(add_steps=2)
    cols = short.columns(prof, paused_s=0)
    assert cols["max_steps"] == 14
    hint = policies.still_over(lc.MAX_STEPS, used, cols, short)  # 15 > 14: it would pause again at once
    assert hint is not None and "--add-steps 3 or more" in hint
    enough = policies.Grant.from_options(add_steps=3)
    cols = enough.columns(prof, paused_s=612.4)
    assert (cols["max_steps"], cols["max_wall_s"]) == (15, 300 + 613)  # paused time is given back too
    assert policies.still_over(lc.MAX_STEPS, used, cols, enough) is None


def test_a_loop_stops_even_when_budgets_pause() -> None:
    prof = Budgets(on_breach="pause")
    verdicts = p.evaluate(snap(steps=13, top_signature=("t", 3)), prof, T0)
    assert policies.decide(verdicts, prof)[0] == "stop"
    assert [v.reason for v in policies.stops_while_paused(verdicts)] == [lc.LOOP_DETECTED]
    assert policies.decide(p.evaluate(snap(steps=13), prof, T0), prof)[0] == "pause"
    assert policies.decide(p.evaluate(snap(steps=13), B, T0), B)[0] == "stop"  # the default profile stops


# -- the circuit: closed -> open -> half_open -> closed (or open again) --------------------------------------------


def test_circuit_opens_at_the_error_threshold() -> None:
    assert not cr.opens(4, 5)
    assert cr.opens(5, 5)
    # the window reaches back window_s, never before the circuit's last move
    assert cr.window_start(at(120), 60.0, None) == at(60)
    assert cr.window_start(at(120), 60.0, at(30)) == at(60)
    assert cr.window_start(at(120), 60.0, at(90)) == at(90)


def test_circuit_half_opens_when_its_open_period_ends() -> None:
    until = at(120)
    assert not cr.half_opens(Circuit.OPEN, until, at(119.9))
    assert cr.half_opens(Circuit.OPEN, until, at(120))
    assert not cr.half_opens(Circuit.HALF_OPEN, until, at(500))  # already half-open: no second move
    assert not cr.half_opens(Circuit.OPEN, None, at(500))
    assert not cr.probe_claimable(Circuit.OPEN, until, at(119.9))  # a claim inserted early is not one
    assert cr.probe_claimable(Circuit.OPEN, until, at(120))
    assert cr.probe_claimable(Circuit.HALF_OPEN, None, T0)


def test_a_probe_that_never_reports_frees_its_slot_after_open_s() -> None:
    assert not cr.probe_lost(T0, at(120), 120.0)
    assert cr.probe_lost(T0, at(120.5), 120.0)


def test_a_paused_run_nobody_answers_is_stopped_at_approval_timeout() -> None:
    prof = Budgets(on_breach="pause", approval_timeout_s=600.0)
    # waited since the daemon's own pause mark (epoch seconds), not the row's paused_at
    assert policies.waited_s(at(599), T0.timestamp(), at(-3600)) == pytest.approx(599)
    assert policies.waited_s(at(599), None, T0) == pytest.approx(599)
    assert policies.waited_s(at(599), None, None) is None
    assert not policies.approval_expired(T0, lc.MAX_STEPS, 599.0, prof.approval_timeout_s)
    assert policies.approval_expired(T0, lc.MAX_STEPS, 600.0, prof.approval_timeout_s)
    # nobody could answer: no pause time, or a reason no resume option raises
    assert policies.approval_expired(None, lc.MAX_STEPS, None, prof.approval_timeout_s)
    assert policies.approval_expired(T0, lc.LOOP_DETECTED, 0.0, prof.approval_timeout_s)
    assert not policies.approval_expired(T0, lc.MAX_STEPS, None, prof.approval_timeout_s)
