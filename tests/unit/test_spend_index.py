"""The incremental tick's bookkeeping (issue 25), pure: each run's live cost by agent and label
budget (activeset.SpendIndex), and the due-queue loaded in one go (DueQueue.load)."""

from __future__ import annotations

import math

import pytest

from watchdog.core.deadlines import Deadline, Why
from watchdog.daemon.activeset import SpendIndex
from watchdog.daemon.duequeue import DueQueue
from watchdog.daemon.money import LiveSpend


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
