"""Read verbs for what people look at: the web view, `postmortem`, `budgets`, `top`, and the demo's narration.

Read verbs for the views people look at: the web view, `postmortem`, `budgets` and `top`.

Reads only (every caller holds a read connection): the facts of a postmortem, a run's
tool-call timeline, its alerts with their per-target delivery, the daemon's published period
state, the active runs `top` shows with their calls of the last minute, the circuit breakers.
Rows cross as typed rows (watchdog.store.rows). Rendering is elsewhere (watchdog.core.postmortem,
watchdog.core.timeline_svg, watchdog.cli).

What `agent-watchdog demo` reads to narrate: its runs, the interventions and alerts new since
its last look, whether its daemon is ready, what is left in the outbox.

Reads only, each verb on a connection of its own: the demo decides nothing and writes nothing
(its daemon and its agents do, through their own verbs).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence, Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import and_, func, or_, select
from sqlalchemy.engine import Connection

from watchdog.core import lifecycle as lc
from watchdog.core.timeline_svg import MAX_MARKS, Call, Spend
from watchdog.store.engine import Engine
from watchdog.store.rows import AlertRow, CircuitRow, EventRow, InterventionRow, OtherRun, RunRow, ToolIntervention
from watchdog.store.schema import alerts, events, interventions, runs, tool_circuits, WHOLE_RUN, daemons
from watchdog.store.settings import get_with_time, CONFIG_KEY, get as published_value
from watchdog.store.views import load_run, ToolStat, tool_stats


MAX_SPEND_ROWS = 50_000  # the cost line of a huge run: its first priced steps (the chart is ~700 px wide)
STALE_S = 120.0  # an older published period state (a stopped daemon) gives no burn rates


def published_state(conn: Connection, now: dt.datetime) -> dict[str, Any] | None:
    """The daemon's last published period state (its burn rates), unless stale."""
    from watchdog.core.periods import STATE_KEY

    row = get_with_time(conn, STATE_KEY)
    if row is None or not isinstance(row.value, dict) or row.updated_at is None:
        return None
    return row.value if 0 <= (now - row.updated_at).total_seconds() < STALE_S else None


@dataclass(frozen=True)
class PostmortemFacts:
    row: RunRow
    events: list[EventRow]
    interventions: list[InterventionRow]
    circuit: list[ToolIntervention]  # circuit-breaker interventions (no run) on this run's tools while it ran
    others: list[OtherRun]  # the runs that overlapped it
    alerts: list[AlertRow]


_EVENT_COLUMNS = [events.c[k] for k in EventRow.__dataclass_fields__]
_ALERT_COLUMNS = [alerts.c[k] for k in AlertRow.__dataclass_fields__]


def postmortem_facts(conn: Connection, run_id: str, now: dt.datetime, *, owner: str | None = None) -> PostmortemFacts:
    """What a postmortem says of a run; with `owner`, the overlapping runs are only that owner's."""
    row = load_run(conn, run_id)
    evs = [EventRow.from_mapping(e._mapping) for e in conn.execute(
        select(*_EVENT_COLUMNS).where(events.c.run_id == row.id).order_by(events.c.seq))]
    ivs = [InterventionRow.from_mapping(i._mapping) for i in conn.execute(
        select(interventions).where(interventions.c.run_id == row.id).order_by(interventions.c.id))]
    end = row.ended_at or now
    tools = sorted({e.tool for e in evs if e.kind == lc.EV_TOOL and e.tool is not None})
    circ = [ToolIntervention.from_mapping(i._mapping) for i in conn.execute(select(interventions).where(and_(
        interventions.c.tool.in_(tools or [""]), interventions.c.run_id.is_(None),
        interventions.c.at >= row.started_at, interventions.c.at <= end)).order_by(interventions.c.id))]
    others = [OtherRun(r.id, r.agent, r.status, r.stop_reason) for r in conn.execute(
        select(runs.c.id, runs.c.agent, runs.c.status, runs.c.stop_reason).where(and_(
            runs.c.id != row.id, runs.c.started_at <= end,
            or_(runs.c.ended_at.is_(None), runs.c.ended_at >= row.started_at),
            runs.c.owner == owner if owner is not None else runs.c.id.is_not(None))))]
    sent = [AlertRow.from_mapping(a._mapping) for a in conn.execute(
        select(*_ALERT_COLUMNS).where(alerts.c.run_id == row.id).order_by(alerts.c.id))]
    return PostmortemFacts(row, evs, ivs, circ, others, sent)


def timeline(conn: Connection, run_id: str) -> tuple[list[Call], list[Spend]]:
    """A run's tool calls (the first MAX_MARKS + 1: the chart says when it cut) and priced steps, in order."""
    calls = [Call(r.at, r.tool or "?", r.ok, r.args_hash) for r in conn.execute(
        select(events.c.at, events.c.tool, events.c.ok, events.c.args_hash)
        .where(and_(events.c.run_id == run_id, events.c.kind == lc.EV_TOOL))
        .order_by(events.c.seq).limit(MAX_MARKS + 1))]
    spend = [Spend(r.at, float(r.cost_eur)) for r in conn.execute(
        select(events.c.at, events.c.cost_eur)
        .where(and_(events.c.run_id == run_id, events.c.cost_eur.is_not(None), events.c.cost_eur > 0))
        .order_by(events.c.seq).limit(MAX_SPEND_ROWS))]
    return calls, spend


def _iso(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.timezone.utc).isoformat() if value else None


def run_alerts(conn: Connection, run_id: str) -> list[dict[str, Any]]:
    """The run's alerts (composed by a daemon) and how far each got: per target, dead letter, error."""
    out = []
    for a in conn.execute(select(alerts).where(alerts.c.run_id == run_id).order_by(alerts.c.id)):
        targets = a.delivered_targets if isinstance(a.delivered_targets, list) else []
        state = ("dead letter" if a.dead_at else "delivered" if a.delivered_at else
                 "pending" if not a.attempts else "retrying")
        out.append({"id": a.id, "created_at": _iso(a.created_at), "title": a.title, "state": state,
                    "attempts": a.attempts, "delivered_targets": [str(t) for t in targets],
                    "delivered_at": _iso(a.delivered_at), "dead_at": _iso(a.dead_at), "last_error": a.last_error})
    return out


def circuit_counts(conn: Connection) -> dict[str, int]:
    """Tool circuit breakers per state (one row per tool that ever failed: a small table)."""
    return {str(state): int(n) for state, n in
            conn.execute(select(tool_circuits.c.state, func.count()).group_by(tool_circuits.c.state))}


def circuits(conn: Connection) -> list[CircuitRow]:
    """Every tool's circuit breaker, by tool name (`agent-watchdog circuits`)."""
    return [CircuitRow.from_mapping(r._mapping)
            for r in conn.execute(select(tool_circuits).order_by(tool_circuits.c.tool))]


def active_runs(conn: Connection) -> list[RunRow]:
    """Every active run (running, paused, stopping): what `top` shows."""
    return [RunRow.from_mapping(r._mapping)
            for r in conn.execute(select(*WHOLE_RUN).where(runs.c.status.in_(lc.ACTIVE_STATUSES)))]


def tool_calls_since(conn: Connection, run_ids: Sequence[str], since: dt.datetime) -> dict[str, int]:
    """Per run, its tool calls recorded after `since` (runs without any are left out)."""
    out: dict[str, int] = {}
    for i in range(0, len(run_ids), 500):
        q = (select(events.c.run_id, func.count()).where(and_(
            events.c.run_id.in_(run_ids[i : i + 500]), events.c.kind == lc.EV_TOOL, events.c.at > since))
             .group_by(events.c.run_id))
        out.update({str(rid): int(n) for rid, n in conn.execute(q)})
    return out


# -- What `agent-watchdog demo` reads to narrate: its runs, the interventions and alerts new since -------

_demo_ALERT_COLUMNS = [alerts.c[k] for k in AlertRow.__dataclass_fields__]


class News(NamedTuple):
    """One look at the store: the demo's runs by id, and what happened since the last look."""

    runs: dict[str, RunRow]
    interventions: list[InterventionRow]  # after the cursor, in id order
    alerts: list[AlertRow]  # after the cursor, in id order


def news(engine: Engine, run_ids: Collection[str], *, interventions_after: int, alerts_after: int) -> News:
    """The runs `run_ids` and the interventions and alerts whose ids are above the cursors, read
    on one connection."""
    with engine.connect() as conn:
        found = {r.id: RunRow.from_mapping(r._mapping)
                 for r in conn.execute(select(*WHOLE_RUN).where(runs.c.id.in_(list(run_ids))))}
        ivs = [InterventionRow.from_mapping(i._mapping) for i in conn.execute(
            select(interventions).where(interventions.c.id > interventions_after).order_by(interventions.c.id))]
        als = [AlertRow.from_mapping(a._mapping) for a in conn.execute(
            select(*_demo_ALERT_COLUMNS).where(alerts.c.id > alerts_after).order_by(alerts.c.id))]
    return News(found, ivs, als)


class Action(NamedTuple):
    """What an intervention did, to whom: the demo's final table tells the defenses apart by it."""

    run_id: str | None
    action: str
    tool: str | None
    outcome: str | None


class Ending(NamedTuple):
    """How the demo's runs ended: their rows, their tools, every intervention's action."""

    runs: dict[str, RunRow]
    tools: dict[str, list[ToolStat]]  # per run found, by calls
    actions: list[Action]  # every intervention (the demo's store holds only its own few runs)


def ending(engine: Engine, run_ids: Collection[str]) -> Ending:
    with engine.connect() as conn:
        found = {r.id: RunRow.from_mapping(r._mapping)
                 for r in conn.execute(select(*WHOLE_RUN).where(runs.c.id.in_(list(run_ids))))}
        tools = tool_stats(conn, list(found))
        acts = [Action(r.run_id, r.action, r.tool, r.outcome) for r in conn.execute(
            select(interventions.c.run_id, interventions.c.action, interventions.c.tool, interventions.c.outcome))]
    return Ending(found, tools, acts)


def daemon_ready(engine: Engine, pid: int) -> bool:
    """The daemon `pid` published its settings (the agents price their steps with them) and
    finished a tick (its scan cursor is set, so every later error counts for the circuits)."""
    with engine.connect() as conn:
        published = published_value(conn, CONFIG_KEY) is not None
        ticked: dt.datetime | None = conn.execute(
            select(daemons.c.last_tick_at).where(daemons.c.pid == pid)).scalar()
    return published and ticked is not None


def untried_alerts(engine: Engine) -> int:
    """The alerts no delivery has tried yet."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(alerts).where(alerts.c.attempts == 0)).scalar_one())
