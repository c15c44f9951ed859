"""Per-tool circuit breakers across runs, on the daemon's side.

Errors are counted in a rolling window over all runs (a success never resets
the count: a tool failing 5 times in a minute among successes is still broken).
closed → open (errors over the threshold) → half_open (after open_s: one probe,
claimed by the SDK) → closed (probe ok) or open again (probe failed). Every
transition is an intervention and an alert.

The probe is claimed by the SDK in `circuit_probes` (agents may insert there,
never change `tool_circuits`); this module judges it and mirrors the claim on
the circuit's row. Error texts copied from events are scrubbed again here (an
agent in another language may have stored them raw), and only the error's
class, checked to look like one, is what other runs' models are told.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from watchdog.core import circuit_rules as rules
from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.interventions import Action
from watchdog.core.lifecycle import CIRCUIT_STATES, Circuit
from watchdog.core.text import scrub
from watchdog.store import circuits as store
from watchdog.store.alerts import Audit, announce, actor, record
from watchdog.core.config import Config
from watchdog.store.circuits import REFUSAL_CLASS as REFUSAL_CLASS
from watchdog.store.engine import Connection, Engine
from watchdog.store.rows import CircuitRow

if TYPE_CHECKING:
    from watchdog.core.seal import Sealer
    from watchdog.daemon.trust.scan import NewEvent, Scanner

log = logging.getLogger("watchdog.circuits")

TOOL_RATE_WINDOW_S = 60.0
_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}")


def error_class_name(value: object) -> str | None:
    """An exception class name as another run's model may read it; anything else is 'Error'."""
    if not value:
        return None
    return value if isinstance(value, str) and _CLASS_NAME.fullmatch(value) else "Error"


class CircuitBreakers:
    def __init__(self, config: Config, by: str | None = None, sealer: Sealer | None = None) -> None:
        self.config = config
        self.by = by or actor()
        self.sealer = sealer
        self._rate_alarmed: dict[str, dt.datetime] = {}

    def update(self, engine: Engine, new_events: Iterable[NewEvent], now: dt.datetime,
               scanner: Scanner | None = None) -> list[tuple[str, str]]:
        """Apply this tick's new events; return the transitions [(tool, new state)]."""
        changes: list[tuple[str, str]] = []
        with engine.connect() as conn:
            circuits = {r.tool: r for r in store.all_circuits(conn)}
        failing = {e.tool for e in new_events if e.ok is False}
        for tool in sorted(failing):
            row = circuits.get(tool)
            if row is None or row.state == Circuit.CLOSED:
                if self._maybe_open(engine, tool, row, now):
                    changes.append((tool, Circuit.OPEN))
        for tool, row in circuits.items():
            if row.state in (Circuit.OPEN, Circuit.HALF_OPEN):
                state = self._follow(engine, row, now)
                if state:
                    changes.append((tool, state))
        if scanner is not None:
            self._tool_rate(engine, scanner, now)
        return changes

    def _window_errors(self, conn: Connection, tool: str, since: dt.datetime
                       ) -> tuple[int, int, str | None, str | None]:
        """(errors, runs, the most common error as shown, its class) in the window since `since`."""
        errors, runs, common = store.error_window(conn, tool, since)
        if common is None:
            return errors, runs, None, None
        cls = error_class_name(common.error_class)
        if self.config.store.record_errors == "class":  # no message text anywhere the daemon writes
            return errors, runs, cls, cls
        return errors, runs, scrub(common.error_msg), cls

    def _maybe_open(self, engine: Engine, tool: str, row: CircuitRow | None, now: dt.datetime) -> bool:
        pol = self.config.circuit.for_tool(tool)
        since = rules.window_start(now, pol.window_s, None if row is None else row.updated_at)
        with engine.begin() as conn:
            errors, runs, common, cls = self._window_errors(conn, tool, since)
            if not rules.opens(errors, pol.errors):
                return False
            until = now + dt.timedelta(seconds=pol.open_s)
            if not store.open_circuit(conn, tool, None if row is None else row.state, now=now, until=until,
                                      errors=errors, window_s=pol.window_s, last_error=(common or "")[:500] or None,
                                      last_error_class=cls):
                return False
            detail = f"{errors} errors in {pol.window_s:g} s across {runs} runs; most common: {common or '-'}"
            self._transition(conn, tool, Action.CIRCUIT_OPEN, detail, f"open until {until:%H:%M:%S} UTC", now,
                             Say.CIRCUIT_OPEN, tool=tool, errors=errors, window_s=pol.window_s, threshold=pol.errors,
                             common=common, runs=runs, until=until)
            log.warning("circuit open: %s (%s)", tool, detail)
            return True

    def _claimed_probe(self, conn: Connection, row: CircuitRow, now: dt.datetime) -> store.ProbeClaim | None:
        """This open period's probe claim: the circuit's own record of it, else the SDK's
        claim in circuit_probes, mirrored onto the circuit's row (which is then half-open)."""
        if row.probe_run_id and row.probe_at:
            return store.ProbeClaim(row.probe_run_id, row.probe_at)
        if row.opened_at is None or not rules.probe_claimable(row.state, row.open_until, now):  # a claim inserted early by hand is not one
            return None
        claim = store.probe_claim(conn, row.tool, row.opened_at)
        if claim is None:
            return None
        store.mirror_claim(conn, row.tool, row.state, claim, now)
        return claim

    def _follow(self, engine: Engine, row: CircuitRow, now: dt.datetime) -> str | None:
        pol = self.config.circuit.for_tool(row.tool)
        with engine.begin() as conn:
            claim = self._claimed_probe(conn, row, now)
            if claim is not None and claim.run_id and claim.claimed_at:
                probe_run_id, probe_at = claim
                # A claimed probe: the row is half-open now, whatever it said when read.
                state = Circuit.HALF_OPEN if row.state == Circuit.OPEN else row.state
                probe = store.probe_result(conn, row.tool, claim)
                if probe is None:
                    if rules.probe_lost(probe_at, now, pol.open_s):  # the probe never reported: free the slot
                        store.free_probe(conn, row.tool, now)
                    return None
                if probe.ok:
                    self._close(conn, row.tool, state, now, f"probe call succeeded (run {probe_run_id[:8]})")
                    return Circuit.CLOSED
                until = now + dt.timedelta(seconds=pol.open_s)
                msg = (error_class_name(probe.error_class) if self.config.store.record_errors == "class"
                       else scrub(probe.error_msg))
                store.reopen(conn, row.tool, state, now=now, until=until,
                             last_error=((msg or row.last_error or "")[:500] or None),
                             last_error_class=error_class_name(probe.error_class) or row.last_error_class)
                self._transition(conn, row.tool, Action.CIRCUIT_OPEN, f"probe failed: {msg}",
                                 f"open again until {until:%H:%M:%S} UTC", now,
                                 Say.CIRCUIT_REOPEN, tool=row.tool, error=msg, until=until)
                return Circuit.OPEN
            if rules.half_opens(row.state, row.open_until, now):
                if store.half_open(conn, row.tool, now):
                    record(conn, at=now, action=Action.CIRCUIT_HALF_OPEN, by=self.by, tool=row.tool,
                           outcome="one probe call will be let through")
                    return Circuit.HALF_OPEN
        return None

    def _close(self, conn: Connection, tool: str, state: str, now: dt.datetime, why: str) -> None:
        store.close(conn, tool, state, now)
        self._transition(conn, tool, Action.CIRCUIT_CLOSED, why, "closed", now, Say.CIRCUIT_CLOSED, tool=tool, why=why)

    def close(self, engine: Engine, tool: str, now: dt.datetime, by: str) -> bool:
        """Close a circuit by hand (`agent-watchdog circuits close TOOL`)."""
        with engine.begin() as conn:
            row = store.circuit(conn, tool)
            if row is None or row.state == Circuit.CLOSED:
                return False
            self.by = by
            # A state outside the vocabulary (written by hand on SQLite) is closed as an open one:
            # closing by hand is the operator's way out of such a row.
            state = row.state if row.state in CIRCUIT_STATES else Circuit.OPEN
            self._close(conn, tool, state, now, f"closed by hand ({by})")
            return True

    def _transition(self, conn: Connection, tool: str, action: str, detail: str, outcome: str, now: dt.datetime,
                    say: Say, /, **numbers: Any) -> None:
        announce(conn, Outcome.of(say, f"{action}:{tool}:{now.isoformat()}", **numbers), now=now, sealer=self.sealer,
                 audit=Audit(action, self.by, tool=tool, detail=detail, outcome=outcome))

    def _tool_rate(self, engine: Engine, scanner: Scanner, now: dt.datetime) -> None:
        """Many runs hammering one tool: the per-run rate figure, aggregated over all runs."""
        for tool, calls in scanner.tool_rates(now).items():
            limit = self.config.circuit.for_tool(tool).max_calls_per_min
            if not limit or calls <= limit:
                continue
            last = self._rate_alarmed.get(tool)
            if last and (now - last).total_seconds() < TOOL_RATE_WINDOW_S:
                continue
            self._rate_alarmed[tool] = now
            window = int(now.timestamp() // TOOL_RATE_WINDOW_S)
            with engine.begin() as conn:
                announce(conn, Outcome.of(Say.TOOL_RATE, AlertKind.TOOL_RATE.key(tool, window), tool=tool, calls=calls,
                                          limit=limit),
                         now=now, sealer=self.sealer, audit=Audit(
                             Action.RATE_ALARM, self.by, tool=tool, reason="tool_rate",
                             detail=f"{calls} calls/min over all runs > {limit}", outcome="alert only"))
