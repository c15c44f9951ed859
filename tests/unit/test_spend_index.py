"""The incremental tick's bookkeeping (issue 25), pure: each run's live cost by agent and label
budget (spendindex.SpendIndex), and the due-queue loaded in one go (DueQueue.load)."""

from __future__ import annotations

import math

import pytest

from watchdog.core.deadlines import Deadline, Why
from watchdog.daemon.money.spendindex import SpendIndex
from watchdog.daemon.tick.duequeue import DueQueue
from watchdog.daemon.money.money import LiveSpend


def _sums(index: SpendIndex) -> tuple[dict[str, float], dict[str, float]]:
    spend = LiveSpend({})
    index.fill(spend)
    return dict(spend.per_agent), dict(spend.labelled)


def test_a_run_counts_once_for_its_agent_and_each_of_its_label_budgets():
    covered = {"a": ("tenant=x",), "b": ("tenant=x", "team=y"), "c": ()}
    index = SpendIndex()
    index.put("a", "bot", 1.0, covered)
    index.put("b", "bot", 2.0, covered)
    index.put("c", "other", 4.0, covered)
    assert _sums(index) == ({"bot": 3.0, "other": 4.0}, {"tenant=x": 3.0, "team=y": 2.0})
    index.put("b", "bot", 5.0, covered)  # its cost grew: replaced, never added twice
    assert _sums(index) == ({"bot": 6.0, "other": 4.0}, {"tenant=x": 6.0, "team=y": 5.0})
    index.drop("a")
    index.drop("a")  # an unknown run is fine
    assert _sums(index) == ({"bot": 5.0, "other": 4.0}, {"tenant=x": 5.0, "team=y": 5.0})
    assert len(index) == 2


def test_a_run_whose_labels_are_not_known_yet_counts_for_its_label_budgets_once_they_are():
    index = SpendIndex()
    covered: dict[str, tuple[str, ...]] = {}
    index.put("new", "bot", 1.5, covered)  # its labels are read this tick (LiveSpend.new)
    assert _sums(index) == ({"bot": 1.5}, {})
    covered["new"] = ("tenant=x",)
    index.learn(covered)
    assert _sums(index) == ({"bot": 1.5}, {"tenant=x": 1.5})
    index.drop("new")
    assert _sums(index) == ({}, {})


def test_without_label_budgets_runs_count_per_agent_only():
    index = SpendIndex()
    index.put("a", "bot", 1.0, None)
    index.learn(None)
    assert _sums(index) == ({"bot": 1.0}, {})


def test_a_cost_of_infinity_that_came_and_went_leaves_the_exact_sum():
    covered = {"a": ("tenant=x",), "b": ("tenant=x",)}
    index = SpendIndex()
    index.put("a", "bot", 1.25, covered)
    index.put("b", "bot", math.inf, covered)  # a hand-written row: the pre-filter lets inf through
    assert _sums(index) == ({"bot": math.inf}, {"tenant=x": math.inf})
    index.put("b", "bot", 2.5, covered)  # inf - inf would leave NaN in a running total
    assert _sums(index) == ({"bot": 3.75}, {"tenant=x": 3.75})
    index.drop("b")
    assert _sums(index) == ({"bot": 1.25}, {"tenant=x": 1.25})


def test_a_huge_cost_that_came_and_went_leaves_the_others_counted():
    """45 + 1.2e18 - 1.2e18 == 0 by difference: a key that held a huge cost is summed exactly."""
    covered = {"a": ("tenant=x",), "x": ("tenant=x",)}
    index = SpendIndex()
    index.put("a", "bot", 45.0, covered)
    index.put("x", "bot", 1.2e18, covered)
    assert _sums(index) == ({"bot": 1.2e18}, {"tenant=x": 1.2e18})  # (judge() re-sums a total this big)
    index.put("x", "bot", 3.0e18, covered)  # it grew: moved, still exact
    index.put("x", "bot", 2.0, covered)  # ...and shrank back
    assert _sums(index) == ({"bot": 47.0}, {"tenant=x": 47.0})
    index.put("x", "bot", 1.2e18, covered)
    index.drop("x")  # the run ended
    assert _sums(index) == ({"bot": 45.0}, {"tenant=x": 45.0})


def test_running_totals_stay_at_the_exact_sum_and_forget_an_agent_without_runs():
    import random

    from watchdog.daemon.money.spendindex import RESUM_EVERY

    rng = random.Random(7)
    covered = {f"r{i}": ("tenant=x",) if i % 2 else () for i in range(200)}
    index = SpendIndex()
    truth: dict[str, float] = {}
    for tick in range(3 * RESUM_EVERY):
        for _ in range(50):
            rid = f"r{rng.randrange(200)}"
            if rng.random() < 0.1:
                index.drop(rid)
                truth.pop(rid, None)
            else:
                truth[rid] = rng.random() * 10 ** rng.randrange(-6, 4)
                index.put(rid, "bot", truth[rid], covered)
        per_agent, labelled = _sums(index)
        exact = math.fsum(truth.values())
        assert per_agent["bot"] == pytest.approx(exact, rel=1e-12, abs=1e-12)
        labelled_exact = math.fsum(c for r, c in truth.items() if covered[r])
        assert labelled.get("tenant=x", 0.0) == pytest.approx(labelled_exact, rel=1e-12, abs=1e-12)
    for rid in list(truth):
        index.drop(rid)
    assert _sums(index) == ({}, {}) and len(index) == 0


def test_a_loaded_queue_pops_what_a_pushed_one_would():
    deadlines = [("a", Deadline(30.0, Why.WALL_CLOCK)), ("b", Deadline(10.0, Why.SILENCE)),
                 ("c", Deadline(math.inf, Why.SILENCE)), ("d", Deadline(20.0, Why.SILENCE))]
    loaded = DueQueue()
    loaded.push("stale", 1.0, Why.SILENCE)
    loaded.shift(100.0)
    loaded.load(deadlines)
    assert "stale" not in loaded and "c" not in loaded and len(loaded) == 3
    assert loaded.peek() == 10.0
    assert [d.run_id for d in loaded.pop_due(25.0)] == ["b", "d"]
    loaded.reschedule("a", [Deadline(40.0, Why.SILENCE)])
    assert loaded.pop_due(35.0) == [] and [d.run_id for d in loaded.pop_due(40.0)] == ["a"]
    with pytest.raises(ValueError):
        loaded.push("e", math.nan, Why.SILENCE)


def test_a_run_its_profile_refused_counts_under_its_owner_and_for_no_label_budget():
    """issue 32: Trust.spend_as names where a run's spend counts; None while its owner is unchecked."""
    covered = {"mine": ("tenant=x",), "theirs": ("tenant=x",), "unchecked": ("tenant=x",)}
    whose = {"mine": "bot", "theirs": "(owner b)"}
    index = SpendIndex()
    index.spend_as = lambda rid, agent: whose.get(rid)
    for rid in covered:
        index.put(rid, "bot", 10.0, covered)
    assert _sums(index) == ({"bot": 10.0, "(owner b)": 10.0}, {"tenant=x": 10.0})
    whose["unchecked"] = "bot"  # checked since: it joins its agent and its label budget
    index.put("unchecked", "bot", 10.0, covered)
    assert _sums(index) == ({"bot": 20.0, "(owner b)": 10.0}, {"tenant=x": 20.0})
