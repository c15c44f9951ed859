"""The SDK's side of the tool circuits: its read of the circuits that are not closed, and its
two writes, both in `circuit_probes` (agents may insert there and mark their own claim; they
never write `tool_circuits`, whose state only the daemon changes): claim the half-open probe,
and mark that probe as succeeded. The claim is an INSERT keyed by (tool, open period), so of
any number of callers in any number of processes exactly one wins each open period (the rest
of the circuits' SQL is the daemon's)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import String, and_, literal, or_, select, update
from sqlalchemy.engine import Engine

from watchdog.core.lifecycle import Circuit
from watchdog.store import dialects
from watchdog.store.lineage import Writer
from watchdog.store.schema import UTCDateTime, circuit_probes as p, tool_circuits as t


@dataclass(frozen=True)
class CircuitState:
    """A circuit that is not closed, as the SDK decides a call by it."""

    tool: str
    state: str  # open | half_open
    open_until: dt.datetime | None
    errors: int
    window_s: float | None
    error_class: str | None  # the most common error's class: all another run is told
    probe_run_id: str | None = None


def open_circuits(writer: Writer) -> dict[str, CircuitState]:
    """The circuits that are not closed, by tool: open or half-open, a probe marked ok counting
    as closed (the SDK's pre-rendered statement, AgentSQL.select_circuits: no query per call)."""
    parse = writer.dialect.parse_ts
    return {tool: CircuitState(tool, state, parse(open_until), errors or 0, window_s, error_class, probe_run_id)
            for tool, state, open_until, errors, window_s, error_class, probe_run_id
            in writer.query(writer.sql.select_circuits)}


def claim_probe(engine: Engine, tool: str, run_id: str, now: dt.datetime) -> tuple[bool, str | None]:
    """(won, the circuit's state when lost: None if the row is gone)."""
    # The open period is copied from the circuit's row, and only while the row is claimable.
    claim = dialects.of(engine).insert(p).from_select(
        ["tool", "opened_at", "run_id", "claimed_at"],
        select(t.c.tool, t.c.opened_at, literal(run_id, String(32)), literal(now, UTCDateTime()))
        .where(t.c.tool == tool, t.c.opened_at.is_not(None), t.c.probe_run_id.is_(None),
               or_(and_(t.c.state == Circuit.OPEN, t.c.open_until <= now), t.c.state == Circuit.HALF_OPEN)),
    ).on_conflict_do_nothing()
    with engine.begin() as conn:
        conn.execute(claim)
        # Who holds this open period's claim now (an INSERT ... SELECT's rowcount is not reported
        # by every driver). Ours only if claimed just now: this run's earlier probe is no new turn.
        row = conn.execute(select(t.c.state, p.c.run_id, p.c.claimed_at).select_from(
            t.outerjoin(p, and_(p.c.tool == t.c.tool, p.c.opened_at == t.c.opened_at)))
            .where(t.c.tool == tool)).first()
    if row is None:
        return False, None
    return (row.run_id == run_id and row.claimed_at == now), row.state


def mark_probe_ok(engine: Engine, tool: str, run_id: str) -> bool:
    """This run's unjudged claim on `tool` succeeded: every SDK then treats the circuit as closed
    (see Dialect.select_circuits) until the daemon closes the row, audits and alerts."""
    with engine.begin() as conn:
        return conn.execute(update(p).where(p.c.tool == tool, p.c.run_id == run_id, p.c.ok.is_(None))
                            .values(ok=True)).rowcount >= 1
