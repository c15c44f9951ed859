"""The SDK's view of the tool circuits the daemon opened: cached, so it costs no query per call.

The daemon opens and closes circuits; the SDK only reads them and, once an open
circuit's time is up, competes for the single half-open probe with one
conditional UPDATE, so across every process exactly one call gets through.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from .store import utcnow

CIRCUIT_CACHE_MAX_S = 5.0  # never staler than a default tick


@dataclass
class CircuitState:
    tool: str
    state: str  # open | half_open
    open_until: dt.datetime | None
    errors: int
    window_s: float | None
    last_error: str | None


class CircuitView:
    def __init__(self, writer, cache_s: float = CIRCUIT_CACHE_MAX_S):
        self.writer = writer
        self.cache_s = cache_s
        self._states: dict[str, CircuitState] = {}
        self._loaded_at = float("-inf")

    def refresh(self, force: bool = False):
        now = time.monotonic()
        if not force and now - self._loaded_at < self.cache_s:
            return
        d = self.writer.dialect
        try:
            rows = self.writer.query(d.select_circuits)
        except Exception:  # store down: keep what we knew, never block the agent
            return
        self._states = {r[0]: CircuitState(r[0], r[1], d.parse_ts(r[2]), r[3], r[4], r[5]) for r in rows}
        self._loaded_at = now

    def get(self, tool: str) -> "CircuitGate | None":
        self.refresh()
        st = self._states.get(tool)
        return CircuitGate(self, st) if st else None

    def claim_probe(self, tool: str, run_id: str) -> bool:
        """Become the one half-open probe for `tool`; False if someone else is (or it closed)."""
        d = self.writer.dialect
        ph = "?" if d.sqlite else "%s"
        now = utcnow()
        sql = (
            f"UPDATE tool_circuits SET state = 'half_open', probe_run_id = {ph}, probe_at = {ph}, updated_at = {ph} "
            f"WHERE tool = {ph} AND ((state = 'open' AND open_until <= {ph}) "
            f"OR (state = 'half_open' AND probe_run_id IS NULL))"
        )
        try:
            conn_row = self.writer.transaction([(sql, (run_id, d.ts(now), d.ts(now), tool, d.ts(now))),
                                                (f"SELECT state, probe_run_id FROM tool_circuits WHERE tool = {ph}", (tool,))])
        except Exception:
            return False
        # Closed (or deleted) meanwhile: the call may go ahead like any other.
        won = not conn_row or conn_row[0] == "closed" or conn_row[1] == run_id
        self.refresh(force=True)
        return won


class CircuitGate:
    def __init__(self, view: CircuitView, st: CircuitState):
        self.view = view
        self.st = st

    def refuses(self, run_id: str) -> bool:
        """True when the call must fail fast; False lets it run (closed, or this call is the probe)."""
        if self.st.state == "open" and self.st.open_until and utcnow() < self.st.open_until:
            return True
        return not self.view.claim_probe(self.st.tool, run_id)

    def message(self, tool: str) -> str:
        # Worded for the model reading it: what, until when, why, and what not to do.
        st = self.st
        until = st.open_until.astimezone().strftime("%H:%M:%S") if st.open_until else "further notice"
        why = f"{st.errors} errors in {st.window_s:g} s" if st.window_s else f"{st.errors} errors"
        if st.last_error:
            why += f": {st.last_error}"
        if st.state == "half_open":
            return f"ToolUnavailable: {tool} is being probed after failures ({why}); do not retry it now"
        return f"ToolUnavailable: {tool} is unavailable until {until} ({why}); do not retry it"
