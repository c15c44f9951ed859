"""The rule of issue 32, pure: a signal rests only on the run's own evidence (watchdog.core.whose)."""

from __future__ import annotations

import pytest

from watchdog.core import lifecycle as lc
from watchdog.core import whose


def test_gateway_sources_are_the_roles_scripts():
    assert whose.GATEWAY_SOURCES == {"otlp", "litellm", "mcp"}


@pytest.mark.parametrize("reason", [lc.MAX_TOOL_CALLS, lc.MAX_STEPS, lc.LOOP_DETECTED, lc.MAX_COST])
def test_a_run_breach_rests_on_its_own_counters_or_it_is_refused(reason):
    assert whose.refused(reason, sealed_kill=False, kernel=False, period_is_own=None, own_breach=True) is None
    assert whose.refused(reason, sealed_kill=False, kernel=False, period_is_own=None,
                         own_breach=False) == whose.GATEWAY_EVIDENCE


@pytest.mark.parametrize("kw", [dict(sealed_kill=True, kernel=False), dict(sealed_kill=False, kernel=True)])
def test_an_operator_kill_or_the_kernel_needs_no_counter(kw):
    for reason in (lc.MANUAL, lc.MAX_TOOL_CALLS, lc.DAILY_BUDGET):
        assert whose.refused(reason, period_is_own=False, own_breach=False, **kw) is None


def test_a_period_stop_is_signalled_only_on_its_owners_spend():
    args = dict(sealed_kill=False, kernel=False, own_breach=False)
    assert whose.refused(lc.DAILY_BUDGET, period_is_own=True, **args) is None
    assert whose.refused(lc.MONTHLY_BUDGET, period_is_own=False, **args) == whose.OTHERS_SPEND
    assert whose.refused(lc.DAILY_BUDGET, period_is_own=None, **args) == whose.NO_PERIOD


def test_period_own_one_owner_profile_or_the_run_alone():
    # The agent's scope, its profile names exactly the run's owner: every run counted is that owner's.
    assert whose.period_own("agent", ["alice"], "alice", 1.0, 50.0)
    # Co-owners, an open profile, a label budget, an owner not proven: others' spend may be in it...
    assert not whose.period_own("agent", ["alice", "bob"], "alice", 1.0, 50.0)
    assert not whose.period_own("agent", [], "alice", 1.0, 50.0)
    assert not whose.period_own("labels", ["alice"], "alice", 1.0, 50.0)
    assert not whose.period_own("agent", ["alice"], None, 1.0, 50.0)
    # ...unless the run alone spent the whole budget.
    assert whose.period_own("labels", [], None, 50.0, 50.0)
    assert not whose.period_own(None, ["alice"], "alice", 99.0, 50.0)


def test_owner_key_is_no_agents_and_names_the_owner():
    assert whose.owner_key("aw_b") == "(owner aw_b)"
    assert whose.owner_key(None).startswith(whose.OWNER_PREFIX)
