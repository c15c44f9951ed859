"""PostgreSQL: a signal rests only on the run's own evidence (issue 32; the rule: watchdog.core.whose).

Row-level security makes a run's row its owner's: its counters are the owner's word. Events are
not all: a gateway's login appends events marked with its source to any run (sql/postgres-roles.sql),
and period budgets add up every run that names the agent. So before a first signal the ladder asks
`OwnerEvidence.justifies`:

- an operator's sealed `kill`, or the kernel's word (an exec'd run whose supervisor is gone, a
  pinned span sender: watchdog.daemon.trust.authentic) — signalled;
- the run's own counters (the row, and its events but the gateways') over one of its budgets;
- a spent period budget that only runs of its own owner fed (trust books the others under theirs);
- a child stopped with its parent (a link the daemon recorded at first sight): its parent's.

Anything else stays a cooperative stop, recorded and alerted once with what was refused; the
gateways refuse its next call like any stopping run's. (SQLite: watchdog.daemon.trust.authentic.)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from watchdog.core import lifecycle as lc
from watchdog.core import whose
from watchdog.core.budgets import Budgets, for_run
from watchdog.core.policies import RunSnapshot, evaluate
from watchdog.daemon.trust.scan import RATE_WINDOW_S
from watchdog.daemon.trust.authentic import OwnEvidence, operator_stop
from watchdog.store.engine import Connection
from watchdog.store.event_rows import own_events
from watchdog.store.run_rows import whole_run

MAX_PARENTS = 8  # a child is judged by its parent's evidence this many levels up at most
RECHECK_S = 5.0  # a held run's evidence is read again at most this often
_HELD_MAX = 10_000

if TYPE_CHECKING:
    from watchdog.core.config import Config
    from watchdog.core.periods import PeriodState
    from watchdog.core.seal import Sealer
    from watchdog.daemon.trust.trust import Trust


def own_snapshot(row: Any, started_at: dt.datetime, conn: Connection, now: dt.datetime) -> RunSnapshot:
    """The run as its own evidence shows it: the row's counters, each raised to what its events
    but the gateways' show."""
    mine = own_events(conn, row.id, sorted(whose.GATEWAY_SOURCES), now - dt.timedelta(seconds=RATE_WINDOW_S))
    t = mine.totals

    def at_least(v: object, shown: float) -> float:
        return max(v, shown) if isinstance(v, (int, float)) and v >= 0 else shown

    tokens = (row.tokens_in or 0) + (row.tokens_out or 0) if isinstance(row.tokens_in, int) else 0
    return RunSnapshot(
        id=row.id, agent=row.agent, started_at=started_at, last_seen_at=row.last_seen_at,
        steps=int(at_least(row.steps, t.steps)), tool_calls=int(at_least(row.tool_calls, t.tool_calls)),
        tool_errors=int(at_least(row.tool_errors, t.tool_errors)), cost_eur=float(at_least(row.cost_eur, t.cost_eur)),
        tokens=int(max(tokens, t.tokens)), top_signature=mine.top_signature, calls_last_min=mine.calls_since)


class OwnerEvidence:
    """The check the ladder makes before a first signal on PostgreSQL (see the module docstring)."""

    def __init__(self, config: Config, sealer: Sealer | None, trust: Trust):
        self.config = config
        self.sealer = sealer
        self.trust = trust
        self._kernel = OwnEvidence(config, sealer)  # its kernel checks (exec gone, pinned sender)
        self._held: dict[str, tuple[float, str]] = {}  # run id -> (when, what was refused), for RECHECK_S

    def justifies(self, conn: Connection, row: Any, now: dt.datetime, budgets: Budgets,
                  closing: Callable[[Any], PeriodState | None], *, skip_clock: bool = False,
                  depth: int = 0) -> bool | str:
        """True, or what was refused (the daemon's words, for the 'not signalled' alert).
        `closing(row)`: the spent period budget covering a run now (the tick's money work).
        A refusal is kept RECHECK_S: the ladder asks every tick, and a run flooded with others'
        events costs one aggregate of them per RECHECK_S, not per tick."""
        held = self._held.get(row.id) if depth == 0 else None
        if held is not None and 0 <= now.timestamp() - held[0] < RECHECK_S:
            return held[1]
        out = self._justifies(conn, row, now, budgets, closing, skip_clock=skip_clock, depth=depth)
        if depth == 0:
            if out is True:
                self._held.pop(row.id, None)
            else:
                if len(self._held) >= _HELD_MAX:
                    self._held.clear()
                self._held[row.id] = (now.timestamp(), str(out))
        return out

    def _justifies(self, conn: Connection, row: Any, now: dt.datetime, budgets: Budgets,
                   closing: Callable[[Any], PeriodState | None], *, skip_clock: bool, depth: int) -> bool | str:
        why = self._refused(conn, row, now, budgets, closing(row), skip_clock)
        if why is None:
            return True
        parent = self._stopped_with(conn, row) if depth < MAX_PARENTS else None
        if parent is not None:  # stopped with its parent: the parent's evidence, the same owner's
            up = self.justifies(conn, parent, now, for_run(self.config.profile(parent.agent), parent), closing,
                                skip_clock=skip_clock, depth=depth + 1)
            if up is True:
                return True
        return why

    def _stopped_with(self, conn: Connection, row: Any) -> Any:
        """The parent a child run was stopped with, when the link is the daemon's own record
        (first sight) and row-level security made the parent its owner's too; else None."""
        if not (getattr(row, "parent_id", None) and self.trust.parent_ok(row)):
            return None
        parent = whole_run(conn, row.parent_id)
        if parent is None or parent.stop_reason != row.stop_reason or parent.owner != row.owner:
            return None
        return parent if parent.status in (lc.STOPPING, lc.KILLED) else None

    def _published(self, conn: Connection, row: Any, now: dt.datetime) -> Any:
        """A daemon that does not do the money work (a cluster's other hosts: the leader does)
        reads the spent budgets the leader published (settings: only the daemon's role writes
        them on PostgreSQL): the agent's scope the run counts under, if spent (budget unknown)."""
        from types import SimpleNamespace

        from watchdog.core.periods import Scope
        from watchdog.store.settings import CLOSED_KEY, get

        key = self.trust.spend_as(row.id, row.agent) if isinstance(row.agent, str) else None
        if key is None:
            return None
        try:
            entries = get(conn, CLOSED_KEY) or []
            for e in entries if isinstance(entries, list) else []:
                if (isinstance(e, dict) and e.get("scope") == "agent" and e.get("name") == key
                        and e.get("reason") == row.stop_reason
                        and dt.datetime.fromisoformat(str(e.get("until"))) > now):
                    return SimpleNamespace(scope=Scope(f"agent:{key}", key, "agent"), budget_eur=0.0)
        except (TypeError, ValueError):  # a malformed entry: no period of its own proven
            return None
        return None

    def _refused(self, conn: Connection, row: Any, now: dt.datetime, budgets: Budgets,
                 closing: PeriodState | None, skip_clock: bool) -> str | None:
        k = self._kernel
        sealed = operator_stop(conn, row, self.sealer)
        # The kernel's word: exec's attested supervisor gone, or a span run whose pinned sender's
        # spans the receiver MAC'd as it received them show the breach (never the row's counters).
        kernel = not sealed and (k._exec_gone(conn, row) or (
            getattr(row, "source", None) == lc.Source.OTLP and k.breach(conn, row, now, skip_clock=skip_clock) is not None))
        own_breach = False
        if not (sealed or kernel):
            snap = own_snapshot(row, self.trust.started_at(row), conn, now)
            own_breach = bool(evaluate(snap, budgets, now, skip_clock=skip_clock))
        period: bool | None = None
        if closing is None and row.stop_reason in whose.PERIOD_REASONS:
            closing = self._published(conn, row, now)
        if closing is not None:
            owner = self.trust.owner_of(conn, row)
            # Booked under its own owner (its profile refused it): that scope holds its owner's runs only.
            owners: tuple[str, ...] = ((owner,) if owner is not None and closing.scope.name == whose.owner_key(owner)
                      else getattr(self.config.profile(row.agent), "owners", ()))
            cost = row.cost_eur if isinstance(row.cost_eur, (int, float)) else 0.0
            period = whose.period_own(closing.scope.kind, owners, owner, cost, closing.budget_eur)
        return whose.refused(row.stop_reason if row.stop_reason in lc.STOP_REASONS else None, sealed_kill=sealed,
                             kernel=kernel, period_is_own=period, own_breach=own_breach)

