"""What one tick knows (issue 34, second step): the typed context the tick's parts are handed.

The tick's parts (watchdog.daemon.tick.tickread, pause, stopping_runs, backstop, believe) took the
whole Ticker as an untyped `tk`, and imported the ticker module to name it: five modules in
one import cycle. They now take a `TickContext`, the narrow view of the daemon they read (its
store, config, killer, key, memory, trust rules and the state kept between ticks), declared
here without importing the ticker. The Ticker is one (structurally, checked by mypy where it
hands itself over); a test or a later judge may hand another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

# A `runs` row as the tick reads it whole, and the columns the trust rules and the ladder read
# off it: declared in core, below every wing, so that naming them ties no two wings together.
from watchdog.core.rowviews import Row as Row, RunView as RunView

if TYPE_CHECKING:
    from watchdog.core.config import Config
    from watchdog.core.periods import PeriodState
    from watchdog.core.seal import Sealer
    from watchdog.daemon.tick.activeset import ActiveSet
    from watchdog.daemon.trust.authentic import OwnEvidence
    from watchdog.daemon.stops.exectree import ExecTrees
    from watchdog.daemon.stops.enforcer import Enforcer
    from watchdog.daemon.stops.killer import Killer
    from watchdog.daemon.trust.owned import OwnerEvidence
    from watchdog.daemon.tick.prefilter import PreFilter
    from watchdog.daemon.trust.scan import Scanner
    from watchdog.daemon.tick.tickstate import ThisTick, TickState
    from watchdog.daemon.trust.trust import Trust
    from watchdog.store.engine import Connection, Engine
    from watchdog.store.memory import Memory


class TickContext(Protocol):
    """The daemon as one tick sees it."""

    engine: Engine
    config: Config
    killer: Killer
    enforcer: Enforcer  # this host's hand for the judge's commands (over `killer` and `memory`)
    sealer: Sealer | None  # the daemon's key: without it nothing is signalled nor alerted
    by: str  # the actor of its audit rows
    state: TickState  # what it remembers between ticks
    scanner: Scanner
    trust: Trust
    active: ActiveSet
    prefilter: PreFilter
    shards: Any  # a ShardSet or None; issue 35: a sharded judge's shards (watchdog.daemon.leases.shards)
    toolwatch: Any  # a ToolWatch or None: a sharded leader's every-run tool calls (watchdog.daemon.tick.toolwatch)
    memory: Memory
    exec_trees: ExecTrees
    own_evidence: OwnEvidence | None  # SQLite's first-signal check
    owner_evidence: OwnerEvidence | None  # PostgreSQL's

    def gone(self, row: Row, this: ThisTick) -> bool:
        """The run's registered process on this host no longer exists."""

    def closing(self, row: Row, this: ThisTick) -> PeriodState | None:
        """The spent period budget covering the run, or None."""

    def read_snapshot(self) -> Connection:
        """One read snapshot for the active runs and their new events."""
