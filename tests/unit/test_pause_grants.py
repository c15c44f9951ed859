"""The pure side of pause and approve: the config keys, which breaches pause, what resume grants."""

from __future__ import annotations

import pytest

from watchdog.core import policies as ap, lifecycle as lc
from watchdog.core.budgets import Budgets, Totals, profile
from watchdog.core.config import parse
from watchdog.core.policies import Verdict
from watchdog.errors import ConfigError


def v(reason):
    return Verdict(reason, 13, 12, f"{reason} detail")


def test_on_breach_and_approval_timeout_are_profile_keys_with_loud_errors():
    cfg = parse({"defaults": {"on_breach": "pause", "approval_timeout_s": 60},
                 "agents": {"bot": {"on_breach": {"max_steps": "pause", "max_cost_eur": "stop"}}, "plain": {}}})
    assert (cfg.defaults.on_breach, cfg.defaults.approval_timeout_s) == ("pause", 60.0)
    assert cfg.profile("bot").on_breach == {"max_steps": "pause", "max_cost_eur": "stop"}
    assert Budgets().on_breach == "stop" and Budgets().approval_timeout_s == 900.0
    with pytest.raises(ConfigError, match=r"agents.bot.on_breach: expected \"stop\", \"pause\""):
        parse({"agents": {"bot": {"on_breach": "ask"}}})
    with pytest.raises(ConfigError, match="'max_identical_calls' cannot pause"):
        parse({"defaults": {"on_breach": {"max_identical_calls": "pause"}}})
    with pytest.raises(ConfigError, match="defaults.approval_timeout_s: expected a number > 0"):
        parse({"defaults": {"approval_timeout_s": 0}})
    # What the daemon publishes, the SDK reads back the same.
    assert cfg.with_published(cfg.published()).profile("bot").on_breach == {"max_steps": "pause",
                                                                           "max_cost_eur": "stop"}


def test_only_budgets_resume_can_raise_pause_and_a_breach_that_stops_wins():
    everything = profile({"on_breach": "pause"})
    some = profile({"on_breach": {"max_steps": "pause"}})
    for reason in (lc.MAX_STEPS, lc.MAX_TOOL_CALLS, lc.MAX_COST, lc.WALL_CLOCK):
        assert ap.pauses(everything, reason)
        assert not ap.pauses(Budgets(), reason)
    for reason in (lc.LOOP_DETECTED, lc.HEARTBEAT_TIMEOUT, lc.PROCESS_GONE, lc.TOOL_RATE, lc.MANUAL):
        assert not ap.pauses(everything, reason)
    assert ap.pauses(some, lc.MAX_STEPS) and not ap.pauses(some, lc.MAX_COST)
    assert ap.decide([v(lc.MAX_COST), v(lc.MAX_STEPS)], everything) == ("pause", v(lc.MAX_COST))
    assert ap.decide([v(lc.MAX_STEPS), v(lc.HEARTBEAT_TIMEOUT)], everything) == ("stop", v(lc.HEARTBEAT_TIMEOUT))
    assert ap.decide([v(lc.MAX_COST), v(lc.MAX_STEPS)], some) == ("stop", v(lc.MAX_COST))
    assert ap.stops_while_paused([v(lc.WALL_CLOCK), v(lc.HEARTBEAT_TIMEOUT)]) == [v(lc.HEARTBEAT_TIMEOUT)]


def test_a_grant_pins_the_runs_budgets_and_the_time_paused_does_not_count():
    grant = ap.Grant.from_options(add_steps=5, add_eur=0.5, add_tool_calls=None, add_s=None)
    assert grant.adds == {"max_steps": 5, "max_cost_eur": 0.5}
    cols = grant.columns(Budgets(), paused_s=120.0)
    assert grant.columns(Budgets(), paused_s=0.4)["max_wall_s"] == 300.0  # under a second: not worth a change
    assert cols == {"max_wall_s": 420.0, "max_steps": 17, "max_tool_calls": 40, "max_cost_eur": 2.5,
                    "max_tokens": 2_000_000, "max_identical_calls": 3, "heartbeat_timeout_s": 120.0}
    assert grant.describe(Budgets(), cols) == "max_steps 12 → 17, max_cost_eur 2 → 2.5, max_wall_s 300 → 420"
    with pytest.raises(ValueError, match="--add-steps: expected an integer > 0"):
        ap.Grant.from_options(add_steps=0)
    used = Totals(steps=20)
    assert "give --add-steps 8 or more" in ap.still_over(lc.MAX_STEPS, used, cols, grant)
    assert ap.still_over(lc.MAX_STEPS, Totals(steps=17), cols, grant) is None
    assert ap.still_over(lc.LOOP_DETECTED, used, cols, grant) is None
    assert ap.suggestion(lc.MAX_STEPS, Totals(steps=13), Budgets()) == "--add-steps 6"
    assert ap.suggestion(lc.MAX_COST, Totals(cost_eur=2.4), Budgets()) == "--add-eur 1"
