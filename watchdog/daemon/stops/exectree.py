"""The tick's part in exec'd runs: remember their trees, and take a tree down when exec is gone.

exec normally takes its own tree down on a stop. When exec itself is gone (SIGKILLed, OOM)
or does not act, its tree is the daemon's to end: a run whose process is gone while the tree
it attested is still alive is not `lost` but stopped (`process_gone`), and the ladder signals
each process of the tree itself (the cgroup of the sealed attestation, or the descendants the
daemon remembered of the attested root), SIGTERM then SIGKILL after term_grace_s.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets
from watchdog.core.messages import RunFacts
from watchdog.core.seal import Sealer
from watchdog.core.text import one_line
from watchdog.daemon.stops.attest import verified_cgroup, verified_leader
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.stops.runtree import directory, remaining
from watchdog.daemon.stops.treememory import TreeMemory
from watchdog.daemon.stops.stopping import stop_run
from watchdog.store.engine import Connection, Engine, read_connection, statement_reads
from watchdog.store.joined import active_exec_roots

log = logging.getLogger("watchdog.tick")


class ExecTrees:
    def __init__(self, engine: Engine, killer: Killer, *, by: str, sealer: Sealer | None):
        self.engine = engine
        self.killer = killer
        self.by = by
        self.sealer = sealer
        self.memory = TreeMemory(killer.host, killer.allowed_users)
        self._roots: list[Any] | None = None  # the roots the last read found

    def observe(self, *, reuse: bool = False) -> None:
        """Once a tick: the descendants of each tree-mode exec of this host (cheap when none).
        `reuse`: no run of this host was written since the last tick (the change feed): the roots
        read then are still the roots; only their descendants are looked at again."""
        try:
            if not reuse or self._roots is None:
                with statement_reads(self.engine) as conn:  # never the write lock the tick's batch may hold
                    self._roots = active_exec_roots(conn, self.killer.host, lc.TREE)
            self.memory.observe(self._roots)
        except Exception as exc:  # noqa: BLE001 — a memory, not a decision: next tick again
            self._roots = None  # read again next tick, whatever changed by then
            log.debug("exec trees not observed this tick (%s)", type(exc).__name__)

    def remembered(self, run_id: str) -> Callable[[Any], Any]:
        return lambda leader: self.memory.members(run_id, leader)

    def left(self, row: Any) -> bool:
        """The run's attested exec is gone and processes of its tree are still alive."""
        if row.kill_mode not in (lc.TREE, lc.CGROUP) or row.host != self.killer.host or self.sealer is None:
            return False
        with read_connection(self.engine) as conn:  # never the write lock the tick's batch may hold
            leader, _why = verified_leader(conn, row, self.sealer)
            if leader is None:
                return False
            cgroup_dir = directory(row.id, verified_cgroup(conn, row, self.sealer))
        found = self.memory.members(row.id, leader)
        return bool(remaining(self.killer, found, cgroup_dir if row.kill_mode == lc.CGROUP else None))

    def lost_detail(self, row: Any) -> str:
        """Why a run whose process is gone is lost; for a tree-mode exec, what may be left."""
        detail = f"process {row.pid} on {row.host} is gone without ending the run"
        if row.kill_mode == lc.TREE and getattr(row, "source", None) == lc.Source.EXEC:
            # The one gap of tree mode (watchdog.daemon.stops.treememory): said, since nothing else can be.
            detail += ("; exec ended without ending it and no process it pinned is left, but one born and "
                       "orphaned since its last look would not be seen (kill_mode tree; cgroup has no such gap)")
        return detail

    def stop_orphaned(self, conn: Connection, row: Any, *, budgets: Budgets, facts: RunFacts,
                      now: dt.datetime) -> bool:
        """Stop a run whose exec is gone and whose tree is not (process_gone); whether this did it
        (the caller records the decision: the daemon's own, so its ladder may signal)."""
        detail = f"exec (pid {row.pid} on {row.host}) is gone; its process tree is still running"
        if not stop_run(conn, row, reason=lc.PROCESS_GONE, detail=detail, now=now, by=self.by, budgets=budgets,
                         run_facts=facts, sealer=self.sealer):
            return False
        log.warning("stop requested: %s run %s — process_gone (%s)", one_line(row.agent, 64), one_line(row.id, 8),
                    one_line(detail))
        return True
