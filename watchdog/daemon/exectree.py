"""The tick's part in exec'd runs: remember their trees, and take a tree down when exec is gone.

exec normally takes its own tree down on a stop. When exec itself is gone (SIGKILLed, OOM)
or does not act, its tree is the daemon's to end: a run whose process is gone while the tree
it attested is still alive is not `lost` but stopped (`process_gone`), and the ladder signals
each process of the tree itself (the cgroup of the sealed attestation, or the descendants the
daemon remembered of the attested root), SIGTERM then SIGKILL after term_grace_s.
"""

from __future__ import annotations

import logging

from watchdog.core import lifecycle as lc
from watchdog.daemon.attest import verified_cgroup, verified_leader
from watchdog.daemon.runtree import TreeMemory, directory, remaining
from watchdog.daemon.stopping import stop_run
from watchdog.store.engine import read_connection
from watchdog.store.execrun import active_exec_roots

log = logging.getLogger("watchdog.tick")


class ExecTrees:
    def __init__(self, ticker):
        self.tk = ticker
        self.memory = TreeMemory(ticker.killer.host)

    def observe(self) -> None:
        """Once a tick: the descendants of each tree-mode exec of this host (cheap when none)."""
        try:
            with read_connection(self.tk.engine) as conn:  # never the write lock the tick's batch may hold
                roots = active_exec_roots(conn, self.tk.killer.host, lc.TREE)
            self.memory.observe(roots)
        except Exception as exc:  # noqa: BLE001 — a memory, not a decision: next tick again
            log.debug("exec trees not observed this tick (%s)", type(exc).__name__)

    def remembered(self, run_id: str):
        return lambda leader: self.memory.members(run_id, leader)

    def left(self, row) -> bool:
        """The run's attested exec is gone and processes of its tree are still alive."""
        if row.kill_mode not in (lc.TREE, lc.CGROUP) or row.host != self.tk.killer.host or self.tk.sealer is None:
            return False
        with read_connection(self.tk.engine) as conn:  # never the write lock the tick's batch may hold
            leader, _why = verified_leader(conn, row, self.tk.sealer)
            if leader is None:
                return False
            cgroup_dir = directory(row.id, verified_cgroup(conn, row, self.tk.sealer))
        found = self.memory.members(row.id, leader)
        return bool(remaining(self.tk.killer, found, cgroup_dir if row.kill_mode == lc.CGROUP else None))

    def stop_orphaned(self, conn, row, *, budgets, facts, now, rep) -> None:
        detail = f"exec (pid {row.pid} on {row.host}) is gone; its process tree is still running"
        if stop_run(conn, row, reason=lc.PROCESS_GONE, detail=detail, now=now, by=self.tk.by, budgets=budgets,
                        run_facts=facts, sealer=self.tk.sealer):
            self.tk._decided.add(row.id)  # the daemon's own decision: its ladder may signal
            rep.stops.append((row.id, lc.PROCESS_GONE))
            log.warning("stop requested: %s run %s — process_gone (%s)", row.agent, row.id[:8], detail)
