"""Whose evidence a stop rests on (issue 32): only the run's own may lead to a signal.

Pure: the daemon gathers the facts (watchdog.daemon.trust.owned), this says whether they are the run's
own and, if not, what was refused — in the daemon's own words, never a writer's text.

The run's own evidence: an operator's sealed `kill`; the kernel's (exec's tree, a pinned span
sender); its own counters (on PostgreSQL the row, which row-level security keeps its owner's,
and the events not marked with a gateway's source); a period budget spent by runs of its own
owner alone (the scope is the agent's, its profile names that one owner), or by the run alone.
Not its own: period spend other owners' runs fed (an open profile, a label budget, co-owners),
gateway events (source otlp / litellm / mcp: a gateway's login may append them to any run).
"""

from __future__ import annotations

from collections.abc import Collection

from watchdog.core import lifecycle as lc

# The sources a gateway's login may mark events with for runs it does not own (sql/postgres-roles.sql).
GATEWAY_SOURCES = frozenset({lc.Source.OTLP.value, lc.Source.LITELLM.value, lc.Source.MCP.value})
PERIOD_REASONS = frozenset({lc.DAILY_BUDGET, lc.MONTHLY_BUDGET})

OTHERS_SPEND = "the period spend includes other owners' runs"
GATEWAY_EVIDENCE = "the breach rests on gateway events (another login's), not the run's own counters"
NO_PERIOD = "no spent period budget of its own owner covers it now"


OWNER_PREFIX = "(owner "


def owner_key(owner: str | None) -> str:
    """The name a run is booked under when its profile refused its owner (its period budgets are
    [defaults]'): no agent's, so another owner's runs never add to it."""
    return f"{OWNER_PREFIX}{owner or 'not proven'})"


def period_own(scope_kind: str | None, owners: Collection[str], owner: str | None, run_cost_eur: float,
               budget_eur: float) -> bool:
    """A spent period budget is the run's own evidence when the run alone spent it, or when the
    scope is its agent's and the profile names exactly its owner (every run counted there is
    that owner's: watchdog.daemon.trust.trust books the others under their own)."""
    if scope_kind is None:
        return False
    if budget_eur > 0 and run_cost_eur >= budget_eur:
        return True
    return scope_kind == "agent" and owner is not None and set(owners) == {owner}


def refused(reason: str | None, *, sealed_kill: bool, kernel: bool, period_is_own: bool | None,
            own_breach: bool) -> str | None:
    """None when the stop rests on the run's own evidence (a signal may follow); else what was
    refused, for the 'not signalled' alert. `own_breach`: the run's own counters alone breach
    one of its budgets (any reason: a run over its own limit is its own evidence);
    `period_is_own`: period_own's answer, None when no spent period budget covers the run now."""
    if sealed_kill or kernel or own_breach:
        return None
    if reason in PERIOD_REASONS:
        if period_is_own is None:
            return NO_PERIOD
        return None if period_is_own else OTHERS_SPEND
    return GATEWAY_EVIDENCE
