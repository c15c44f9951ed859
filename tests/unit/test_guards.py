"""The in-process Guard and `oscillates`, pure: no database, no clock (elapsed time is passed in)."""

from __future__ import annotations

import pytest

from watchdog.core import lifecycle as lc
from watchdog.errors import RunKilled
from watchdog.sdk.guards import Guard, oscillates

A, B, C, D = ("a", "h1"), ("b", "h2"), ("c", "h3"), ("d", "h4")


def call(g: Guard, sig, elapsed_s: float = 0.0, *, cached: bool = False):
    """One logical tool call that ran (or was served from the cache)."""
    g.before_tool(sig[0], sig[1], elapsed_s, cached=cached)
    if not cached:
        g.count_tool_call()


def stop_reason(fn, *args, **kw) -> str:
    with pytest.raises(RunKilled) as info:
        fn(*args, **kw)
    assert info.value.reason in lc.STOP_REASONS
    return info.value.reason


# -- steps, money, wall-clock ----------------------------------------------------


def test_before_model_refuses_the_step_that_would_exceed_max_steps():
    g = Guard({"max_steps": 3})
    for _ in range(3):
        g.before_model(0.0, 0.0)
        g.after_step(0.0)
    assert stop_reason(g.before_model, 0.0, 0.0) == lc.MAX_STEPS
    assert g.steps == 3


def test_cost_preflight_overshoots_by_at_most_one_call():
    # Estimates say 0.10, each call really costs 0.25: the pre-flight cannot know,
    # but it refuses the first call it can see would exceed the budget.
    g = Guard({"max_cost_eur": 1.0})
    actual = 0.25
    with pytest.raises(RunKilled) as info:
        while True:
            g.before_model(0.10, 0.0)
            g.after_step(actual)
            g.check_totals(0.0)
    assert info.value.reason == lc.MAX_COST
    assert g.cost_eur < 1.0 + actual


def test_cost_exactly_at_the_cap_is_allowed_over_it_is_not():
    g = Guard({"max_cost_eur": 1.0})
    g.before_model(0.5, 0.0)
    g.after_step(0.5)
    g.before_model(0.5, 0.0)  # 0.5 + 0.5 == 1.0: allowed
    g.after_step(0.5)
    g.check_totals(0.0)
    assert stop_reason(g.before_model, 0.01, 0.0) == lc.MAX_COST


def test_check_totals_stops_a_run_that_is_already_over_steps_or_cost():
    g = Guard({"max_steps": 1})
    g.after_step(0.0)
    g.check_totals(0.0)
    g.after_step(0.0)  # a second step without pre-flight: recorded, then stopped
    assert stop_reason(g.check_totals, 0.0) == lc.MAX_STEPS

    g = Guard({"max_cost_eur": 0.5})
    g.after_step(0.6)
    assert stop_reason(g.check_totals, 0.0) == lc.MAX_COST


def test_wall_clock_is_checked_before_model_and_tool_calls():
    g = Guard({"max_wall_s": 10})
    g.before_model(0.0, 10.0)
    call(g, A, 10.0)
    assert stop_reason(g.before_model, 0.0, 10.5) == lc.WALL_CLOCK
    assert stop_reason(g.before_tool, "b", "h2", 10.5) == lc.WALL_CLOCK
    assert stop_reason(g.before_retry, 10.5) == lc.WALL_CLOCK
    assert stop_reason(g.check_totals, 10.5) == lc.WALL_CLOCK


def test_no_budgets_means_no_in_process_limits():
    g = Guard({})
    for i in range(100):
        g.before_model(1e6, 1e9)
        g.after_step(1e6)
        g.check_totals(1e9)
        call(g, ("t", str(i)), 1e9)
    assert (g.steps, g.tool_calls) == (100, 100)


# -- tool calls --------------------------------------------------------------------


def test_max_tool_calls_refuses_the_call_that_would_exceed():
    g = Guard({"max_tool_calls": 3})
    for sig in (A, B, C):
        call(g, sig)
    assert stop_reason(g.before_tool, "d", "h4", 0.0) == lc.MAX_TOOL_CALLS
    assert g.tool_calls == 3


def test_retry_attempts_use_the_tool_call_budget():
    g = Guard({"max_tool_calls": 2})
    g.before_tool("a", "h1", 0.0)
    g.count_tool_call()  # attempt 1 failed
    g.before_retry(0.0)
    g.count_tool_call()  # attempt 2 failed
    assert stop_reason(g.before_retry, 0.0) == lc.MAX_TOOL_CALLS


def test_a_cached_repeat_uses_no_tool_call_but_counts_as_a_repeat():
    g = Guard({"max_tool_calls": 1, "max_identical_calls": 3})
    call(g, A)
    call(g, A, cached=True)  # at the tool-call cap, but a cache hit calls nothing
    assert g.tool_calls == 1
    assert g.signatures[A] == 2
    assert stop_reason(g.before_tool, "a", "h1", 0.0, cached=True) == lc.LOOP_DETECTED


def test_counting_an_attempt_does_not_count_a_second_signature():
    # The choke point's flow: before_tool → the tool runs → count_tool_call.
    g = Guard({"max_identical_calls": 3})
    g.before_tool("a", "h1", 0.0)
    g.count_tool_call()
    assert (g.tool_calls, g.signatures[A]) == (1, 1)


# -- loops --------------------------------------------------------------------------


def test_identical_calls_trip_loop_detected_on_the_nth_before_it_runs():
    g = Guard({"max_identical_calls": 3})
    call(g, A)
    call(g, A)
    with pytest.raises(RunKilled) as info:
        g.before_tool("a", "h1", 0.0)
    assert info.value.reason == lc.LOOP_DETECTED
    assert "identical arguments" in info.value.detail
    assert g.signatures[A] == 2  # the refused call was not counted


def test_identical_calls_are_per_signature():
    g = Guard({"max_identical_calls": 2})
    for i in range(20):
        call(g, ("search", f"h{i}"))  # same tool, other arguments: not a loop
    call(g, ("other", "h0"))  # other tool, same hash: not the same signature
    assert stop_reason(g.before_tool, "search", "h0", 0.0) == lc.LOOP_DETECTED


def test_oscillation_abab_trips_loop_detected():
    g = Guard({})
    call(g, A)
    call(g, B)
    call(g, A)
    with pytest.raises(RunKilled) as info:
        g.before_tool(B[0], B[1], 0.0)
    assert info.value.reason == lc.LOOP_DETECTED
    assert "oscillation" in info.value.detail


def test_abcd_does_not_trip():
    g = Guard({"max_identical_calls": 3})
    for sig in (A, B, C, D, A, B, C, D):
        call(g, sig)
    assert g.tool_calls == 8


def test_oscillation_counts_cached_repeats():
    g = Guard({})
    call(g, A)
    call(g, B)
    call(g, A, cached=True)
    assert stop_reason(g.before_tool, B[0], B[1], 0.0, cached=True) == lc.LOOP_DETECTED


@pytest.mark.parametrize(
    "seq, expected",
    [
        ([A, B, A, B], True),
        ([C, D, A, B, A, B], True),
        ([A, B, C, D], False),
        ([A, A, A, A], False),  # identical calls: max_identical_calls' business
        ([A, B, A, C], False),
        ([A, B, B, A], False),
        ([A, B, A], False),
        ([], False),
        ([A, B, A, B, C], False),  # only the last four count
    ],
)
def test_oscillates(seq, expected):
    assert oscillates(seq) is expected
