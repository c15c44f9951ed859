"""The SDK's view of the tool circuits the daemon opened: cached, so it costs no query per call.

The daemon opens and closes circuits (rows of `tool_circuits`); the SDK only
reads them and, once an open circuit's time is up, competes for the single
half-open probe with one conditional INSERT into `circuit_probes` (keyed by the
tool and the open period), so across every process exactly one call gets
through, and an agent never writes `tool_circuits` itself (on PostgreSQL the
agents' role cannot). The state is cached for at most `cache_s` (one daemon
tick by default); `refresh(force=True)` reloads it at once.

Decisions, per call of a tool whose row is not 'closed':

- open, open_until in the future (or NULL)   → fail fast;
- open, open_until passed, or half_open with no probe yet → claim the probe:
  the one caller whose INSERT claimed it runs the tool (one attempt);
  everybody else fails fast;
- a probe already claimed (by anyone, this run included) → fail fast until the
  daemon closes or re-opens the circuit from the probe's outcome;
- a probe that succeeded (marked on its claim by the run that made it) → the
  circuit counts as closed at once, for every process, before the daemon's tick
  closes its row and alerts.

What a refused call is told names the tool, the error class and the count:
never the text of another run's error (it may carry that run's secrets, or
words written to steer whichever model reads them).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from watchdog.core.lifecycle import Circuit
from watchdog.store import probes
from watchdog.store.probes import CircuitState
from watchdog.core.periods import utcnow

if TYPE_CHECKING:
    from watchdog.store.agent_writes import Writer

CIRCUIT_CACHE_MAX_S = 5.0  # never staler than a default tick

ALLOW = "allow"  # closed (or the row vanished): call the tool as usual
PROBE = "probe"  # this call is the one half-open probe: one attempt, no retries


class Circuits:
    """The circuits the daemon opened, as this process sees them: cached for `cache_s`."""

    def __init__(self, writer: Writer, cache_s: float = CIRCUIT_CACHE_MAX_S) -> None:
        if isinstance(cache_s, bool) or not isinstance(cache_s, (int, float)) or cache_s < 0:
            raise ValueError(f"circuit_cache_s: expected a number of seconds >= 0, got {cache_s!r}")
        self.writer = writer
        self.cache_s = float(cache_s)
        self._states: dict[str, CircuitState] = {}
        self._loaded_at = float("-inf")
        self._lock = threading.Lock()

    def refresh(self, force: bool = False) -> None:
        """Reload the non-closed circuits when the cache is older than `cache_s` (or `force`)."""
        now = time.monotonic()
        if not force and now - self._loaded_at < self.cache_s:
            return
        with self._lock:
            if not force and now - self._loaded_at < self.cache_s:  # another thread just did
                return
            try:
                states = probes.open_circuits(self.writer)
            except Exception:
                # Store down: keep what we knew and do not ask again before the cache
                # expires, so an outage costs one failed query per `cache_s`, not one per call.
                self._loaded_at = now
                return
            self._states = states
            self._loaded_at = now

    def get(self, tool: str) -> "CircuitGate | None":
        """The gate of `tool`'s open or half-open circuit, or None when it is closed."""
        self.refresh()
        st = self._states.get(tool)
        return CircuitGate(self, st) if st else None

    def state(self, tool: str) -> CircuitState | None:
        """The cached state of `tool`'s circuit (None = closed), without refreshing."""
        return self._states.get(tool)

    def claim_probe(self, tool: str, run_id: str) -> str | None:
        """Try to become the one half-open probe of `tool`.

        Returns PROBE when this call won, ALLOW when the circuit closed (or its
        row vanished) meanwhile, None when the call must fail fast (someone else
        probes, or the daemon re-opened it). The claim is an INSERT keyed by the
        circuit's open period, so of any number of concurrent callers in any number
        of processes one wins, once per open period.
        """
        try:
            won, state = probes.claim_probe(self.writer.engine, tool, run_id, utcnow())
        except Exception:  # noqa: BLE001 — store down: an open circuit stays open for us
            return None
        self.refresh(force=True)
        if won:
            return PROBE
        return ALLOW if state in (None, Circuit.CLOSED) else None

    def probe_succeeded(self, tool: str, run_id: str) -> bool:
        """Mark this run's claimed probe of `tool` as succeeded: the circuit counts as
        closed at once (for every process, on its next refresh), and the daemon closes
        its row, audits and alerts on its next tick (the SDK writes no circuit state,
        audit or alert text). Conditional on this run's own unjudged claim."""
        try:
            done = probes.mark_probe_ok(self.writer.engine, tool, run_id)
        except Exception:  # noqa: BLE001 — store down: the daemon closes it from the probe's event
            return False
        self.refresh(force=True)
        return done


class CircuitGate:
    """One call's look at a non-closed circuit."""

    def __init__(self, circuits: Circuits, st: CircuitState) -> None:
        self.circuits = circuits
        self.st = st

    def admit(self, run_id: str) -> str | None:
        """ALLOW, PROBE (run it, once) or None (fail fast; see `message`)."""
        st = self.st
        if st.state == Circuit.OPEN and (st.open_until is None or utcnow() < st.open_until):
            return None
        if st.probe_run_id is not None:  # claimed (maybe by this run): until the daemon judges it
            return None
        verdict = self.circuits.claim_probe(st.tool, run_id)
        if verdict is None:
            # Lost the race: word the refusal from what the circuit is now.
            self.st = self.circuits.state(st.tool) or st
        return verdict

    def message(self, tool: str | None = None) -> str:
        # Worded for the model reading it: what, until when, why, and what not to do.
        st = self.st
        tool = tool or st.tool
        why = f"{st.errors} errors in {st.window_s:g} s" if st.window_s else f"{st.errors} errors"
        if st.error_class:
            why += f", {st.error_class}"
        if st.state == Circuit.HALF_OPEN or (st.open_until is not None and st.open_until <= utcnow()):
            return f"ToolUnavailable: {tool} is being probed after failures ({why}); do not retry it now"
        until = st.open_until.astimezone().strftime("%H:%M:%S") if st.open_until else "further notice"
        return f"ToolUnavailable: {tool} is unavailable until {until} ({why}); do not retry it"
