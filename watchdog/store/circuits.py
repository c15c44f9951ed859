"""The daemon's side of the tool circuits: the error window it judges, and every state move.

Only the daemon writes `tool_circuits` (the SDK's side, the probe claim, is
watchdog.store.probes). Each verb that moves a circuit's state checks the move against
`lifecycle.CIRCUIT_MOVES` first and raises IllegalCircuitMove for one the table does not
list: a bug in the caller, found before anything is written. The transaction is the
caller's (a move, its intervention and its alert commit together).
"""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.engine import Connection

from watchdog.core.lifecycle import Circuit, check_circuit_move
from watchdog.store.rows import CircuitRow
from watchdog.store.schema import circuit_probes, events, tool_circuits
from watchdog.store.viewer import circuits as all_circuits

__all__ = ["REFUSAL_CLASS", "CommonError", "ErrorWindow", "ProbeClaim", "ProbeResult", "all_circuits", "circuit",
           "close", "error_window", "free_probe", "half_open", "mirror_claim", "open_circuit", "probe_claim",
           "probe_result", "reopen"]

# Fail-fast refusals are written as failed tool events: they are not the tool's errors.
REFUSAL_CLASS = "ToolUnavailable"


class CommonError(NamedTuple):
    """The most frequent (class, message) among a window's errors, as stored (unscrubbed)."""

    error_class: str | None
    error_msg: str | None


class ErrorWindow(NamedTuple):
    errors: int
    runs: int  # distinct runs among them
    common: CommonError | None


class ProbeClaim(NamedTuple):
    run_id: str
    claimed_at: dt.datetime


class ProbeResult(NamedTuple):
    """The probe run's first own call of the tool after its claim."""

    ok: bool | None
    error_class: str | None
    error_msg: str | None


def error_window(conn: Connection, tool: str, since: dt.datetime) -> ErrorWindow:
    """The tool's errors after `since` over all runs (refusals of an open circuit excluded)."""
    cond = and_(events.c.tool == tool, events.c.at > since, events.c.ok.is_(False),
                func.coalesce(events.c.error_class, "") != REFUSAL_CLASS)
    errors, runs = conn.execute(select(func.count(), func.count(func.distinct(events.c.run_id))).where(cond)).one()
    common = conn.execute(
        select(events.c.error_class, events.c.error_msg).where(cond)
        .group_by(events.c.error_class, events.c.error_msg).order_by(func.count().desc()).limit(1)).first()
    return ErrorWindow(errors, runs, None if common is None else CommonError(common.error_class, common.error_msg))


def circuit(conn: Connection, tool: str) -> CircuitRow | None:
    row = conn.execute(select(tool_circuits).where(tool_circuits.c.tool == tool)).first()
    return None if row is None else CircuitRow.from_mapping(row._mapping)


def open_circuit(conn: Connection, tool: str, current: str | None, *, now: dt.datetime, until: dt.datetime,
                 errors: int, window_s: float, last_error: str | None, last_error_class: str | None) -> bool:
    """Open the tool's circuit: a new row when `current` is None (no row yet), else the closed row,
    only if it is still closed (False: another daemon moved it first)."""
    check_circuit_move(current, Circuit.OPEN)
    values = dict(state=Circuit.OPEN, opened_at=now, open_until=until, errors_in_window=errors, window_s=window_s,
                  last_error=last_error, last_error_class=last_error_class, probe_run_id=None, probe_at=None,
                  updated_at=now)
    if current is None:
        conn.execute(insert(tool_circuits).values(tool=tool, **values))
        return True
    done = conn.execute(update(tool_circuits).where(
        and_(tool_circuits.c.tool == tool, tool_circuits.c.state == Circuit.CLOSED)).values(**values))
    return bool(done.rowcount == 1)


def probe_claim(conn: Connection, tool: str, opened_at: dt.datetime) -> ProbeClaim | None:
    """The SDK's claim of this open period's probe (circuit_probes), if one was made."""
    claim = conn.execute(select(circuit_probes.c.run_id, circuit_probes.c.claimed_at).where(and_(
        circuit_probes.c.tool == tool, circuit_probes.c.opened_at == opened_at))).first()
    return None if claim is None else ProbeClaim(claim.run_id, claim.claimed_at)


def mirror_claim(conn: Connection, tool: str, current: str, claim: ProbeClaim, now: dt.datetime) -> None:
    """Record the SDK's claim on the circuit's row: it is half-open, its probe is that run's."""
    if current != Circuit.HALF_OPEN:  # a half-open row that takes its claim stays where it is
        check_circuit_move(current, Circuit.HALF_OPEN)
    conn.execute(update(tool_circuits).where(tool_circuits.c.tool == tool).values(
        state=Circuit.HALF_OPEN, probe_run_id=claim.run_id, probe_at=claim.claimed_at, updated_at=now))


def probe_result(conn: Connection, tool: str, claim: ProbeClaim) -> ProbeResult | None:
    """The outcome of the probe: the claiming run's first call of the tool since its claim
    (None: it has not reported one yet)."""
    probe = conn.execute(
        select(events.c.ok, events.c.error_class, events.c.error_msg).where(and_(
            events.c.tool == tool, events.c.run_id == claim.run_id, events.c.at >= claim.claimed_at,
            func.coalesce(events.c.error_class, "") != REFUSAL_CLASS))
        .order_by(events.c.id).limit(1)).first()
    return None if probe is None else ProbeResult(probe.ok, probe.error_class, probe.error_msg)


def _forget_probes(conn: Connection, tool: str) -> None:
    conn.execute(delete(circuit_probes).where(circuit_probes.c.tool == tool))


def free_probe(conn: Connection, tool: str, now: dt.datetime) -> None:
    """The probe never reported: free the slot for another claim (the state does not move)."""
    conn.execute(update(tool_circuits).where(tool_circuits.c.tool == tool)
                 .values(probe_run_id=None, probe_at=None, updated_at=now))
    _forget_probes(conn, tool)


def reopen(conn: Connection, tool: str, current: str, *, now: dt.datetime, until: dt.datetime,
           last_error: str | None, last_error_class: str | None) -> None:
    """The probe failed: open for another period, probe slot freed."""
    check_circuit_move(current, Circuit.OPEN)
    conn.execute(update(tool_circuits).where(tool_circuits.c.tool == tool).values(
        state=Circuit.OPEN, opened_at=now, open_until=until, probe_run_id=None, probe_at=None,
        last_error=last_error, last_error_class=last_error_class, updated_at=now))
    _forget_probes(conn, tool)


def half_open(conn: Connection, tool: str, now: dt.datetime) -> bool:
    """An open circuit whose period is over lets one probe through; False: it was not open."""
    check_circuit_move(Circuit.OPEN, Circuit.HALF_OPEN)
    done = conn.execute(update(tool_circuits).where(and_(
        tool_circuits.c.tool == tool, tool_circuits.c.state == Circuit.OPEN)).values(
        state=Circuit.HALF_OPEN, updated_at=now))
    return bool(done.rowcount == 1)


def close(conn: Connection, tool: str, current: str, now: dt.datetime) -> None:
    """Close the circuit (the probe succeeded, or by hand); its probes are forgotten."""
    check_circuit_move(current, Circuit.CLOSED)
    conn.execute(update(tool_circuits).where(tool_circuits.c.tool == tool).values(
        state=Circuit.CLOSED, open_until=None, probe_run_id=None, probe_at=None, errors_in_window=0, updated_at=now))
    _forget_probes(conn, tool)
