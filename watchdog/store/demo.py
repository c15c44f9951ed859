"""What `agent-watchdog demo` reads to narrate: its runs, the interventions and alerts new since
its last look, whether its daemon is ready, what is left in the outbox.

Reads only, each verb on a connection of its own: the demo decides nothing and writes nothing
(its daemon and its agents do, through their own verbs).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import NamedTuple

from sqlalchemy import func, select

from watchdog.store.engine import Engine
from watchdog.store.rows import AlertRow, InterventionRow, RunRow
from watchdog.store.schema import alerts, daemons, interventions, runs, WHOLE_RUN
from watchdog.store.settings import CONFIG_KEY, get as published_value
from watchdog.store.views import ToolStat, tool_stats

_ALERT_COLUMNS = [alerts.c[k] for k in AlertRow.__dataclass_fields__]


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
            select(*_ALERT_COLUMNS).where(alerts.c.id > alerts_after).order_by(alerts.c.id))]
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
