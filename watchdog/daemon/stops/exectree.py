"""Exec'd runs' trees: the descendants the daemon has seen, pinned in its memory, and the tree taken down when
exec is gone.

Tree mode's memory: the descendants of each exec'd run the daemon has seen, pinned.

Without a cgroup, a run's process tree is only what the kernel's parent links say now. exec is
its command's child subreaper, so while exec lives nothing leaves the tree; once exec is gone
(SIGKILLed, by its own command or the OOM killer) orphans reparent to init and the links are
lost. So at each tick the daemon pins (pid + create time) every descendant it sees of the
attested root and, root gone or not, of every process it pinned before: a worker double-forked
after exec's death is pinned as soon as a tick finds it under a pinned process, and stays
attributable to the run once it is reparented away.

The window left: a descendant born and orphaned between two ticks (its parent chain cut before
any tick saw it) is never pinned. docs/howto/exec.md and `exec -v` say so; cgroup mode has no
such window and is recommended wherever it is available.

Only what the killer could signal for the run is pinned: processes of the root's own Unix user
(real and effective uid; a setuid program the command ran is not the run's), that user being
one of allowed_users (so root and system users only when named there), never pid 1, the daemon
or its parent. The killer checks each again, pinned by pidfd, before any signal.

What is pinned is kept in the daemon's state file too (a mark per run), so a daemon restarted
after exec's death still knows the tree exec left.

The tick's part in exec'd runs: remember their trees, and take a tree down when exec is gone.

exec normally takes its own tree down on a stop. When exec itself is gone (SIGKILLed, OOM)
or does not act, its tree is the daemon's to end: a run whose process is gone while the tree
it attested is still alive is not `lost` but stopped (`process_gone`), and the ladder signals
each process of the tree itself (the cgroup of the sealed attestation, or the descendants the
daemon remembered of the attested root), SIGTERM then SIGKILL after term_grace_s.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import pwd
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

import psutil

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets
from watchdog.core.messages import RunFacts
from watchdog.core.procid import CREATE_TIME_TOLERANCE_S, ProcessIdentity
from watchdog.core.seal import Sealer
from watchdog.core.text import one_line
from watchdog.daemon.stops.attest import verified_cgroup, verified_leader
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.stops.runtree import directory, remaining
from watchdog.daemon.stops.stopping import stop_run
from watchdog.store.engine import Connection, Engine, read_connection, statement_reads
from watchdog.store.joined import active_exec_roots

if TYPE_CHECKING:
    from watchdog.store.memory import Memory


MARK = "exec_tree"  # the state file's mark kind: a run's pinned tree, as JSON
MAX_REMEMBERED = 10_000  # processes per run: a fork bomb must not grow the daemon without bound

Key = tuple[int, float]  # pid, create time


@dataclass
class _Tree:
    root: Key
    uid: int  # the root's real uid, read when the daemon first saw it alive
    may_pin: bool  # that user is one the killer may signal
    pinned: dict[int, float] = field(default_factory=dict)


def _children_map() -> dict[int, list[int]]:
    """Parent pid → child pids, from one read of the process table."""
    kids: dict[int, list[int]] = {}
    fast = getattr(psutil, "_ppid_map", None)  # what Process.children() itself reads (no Process objects)
    links = fast() if callable(fast) else {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"])}
    for pid, ppid in links.items():
        if ppid is not None:
            kids.setdefault(ppid, []).append(pid)
    return kids


def _live(key: Key) -> tuple[int, int] | None:
    """(real, effective uid) of the process `key` names if it still runs as itself (no zombie)."""
    try:
        proc = psutil.Process(key[0])
        with proc.oneshot():
            if abs(proc.create_time() - key[1]) > CREATE_TIME_TOLERANCE_S or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            uids = proc.uids()
            return uids.real, uids.effective
    except psutil.Error:
        return None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)  # as the killer names an unknown uid


class TreeMemory:
    """Per exec'd run: the descendants seen of its root, keyed by that root's identity."""

    def __init__(self, host: str, allowed_users: Iterable[str] = (), state: Memory | None = None):
        self.host = host
        self.allowed_users = frozenset(allowed_users)
        self.state = state  # the daemon's state file (None: this process's memory only)
        self._trees: dict[str, _Tree] = {}
        self._saved: dict[str, frozenset[int]] = {}  # what the state file holds of each run, by pid

    def observe(self, roots: Iterable[tuple[str, int | None, float | None]]) -> None:
        """`roots`: (run id, pid, create time) of the active tree-mode exec runs of this host
        (candidates from the store: what is signalled is checked against the attestation)."""
        keep: set[str] = set()
        links: dict[int, list[int]] | None = None
        for run_id, pid, create_time in roots:
            keep.add(run_id)
            if pid is None or create_time is None:
                continue
            key = (int(pid), float(create_time))
            tree = self._trees.get(run_id)
            if tree is None or tree.root != key:
                tree = self._restore(run_id, key)
            if tree is None:
                uids = _live(key)
                if uids is None:
                    continue  # never seen alive as itself: nothing to attribute to it
                tree = _Tree(key, uids[0], _user(uids[0]) in self.allowed_users)
            self._trees[run_id] = tree
            if links is None:
                links = _children_map()  # once a tick, for every run
            self._pin(tree, links)
            self._save(run_id, tree)
        for run_id in [r for r in self._trees if r not in keep]:
            del self._trees[run_id]
            if self._saved.pop(run_id, None) is not None:
                self._write(run_id, None)

    # -- the state file ----------------------------------------------------------------------

    def _restore(self, run_id: str, key: Key) -> _Tree | None:
        """The tree a previous daemon pinned for this run and root, from the state file."""
        if self.state is None:
            return None
        try:
            raw = self.state.marked(MARK, run_id)
            if not raw:
                return None
            d = json.loads(raw)
            if (int(d["root"][0]), float(d["root"][1])) != key:
                return None
            uid = int(d["uid"])
            tree = _Tree(key, uid, _user(uid) in self.allowed_users,
                         {int(p): float(ct) for p, ct in d["pinned"].items()})
        except Exception as exc:  # noqa: BLE001 — a mark it cannot read: the tree is rebuilt from the kernel
            log.debug("exec tree of run %s not restored (%s)", run_id[:8], type(exc).__name__)
            return None
        self._saved[run_id] = frozenset(tree.pinned)
        return tree

    def _save(self, run_id: str, tree: _Tree) -> None:
        now = frozenset(tree.pinned)
        if self._saved.get(run_id) == now:
            return  # unchanged: no write
        value = json.dumps({"root": list(tree.root), "uid": tree.uid,
                            "pinned": {str(p): ct for p, ct in tree.pinned.items()}})
        if self._write(run_id, value):
            self._saved[run_id] = now

    def _write(self, run_id: str, value: str | None) -> bool:
        if self.state is None:
            return False
        try:
            if value is None:
                self.state.unmark(MARK, run_id)
            else:
                self.state.mark(MARK, run_id, value)
            return True
        except Exception:  # noqa: BLE001 — kept in this process's memory; written again next tick
            log.warning("could not write the daemon's state file (exec tree of run %s)", run_id[:8], exc_info=True)
            return False

    def _pin(self, tree: _Tree, links: dict[int, list[int]]) -> None:
        """Pin the descendants of the root and of what is pinned; forget the dead."""
        if not tree.may_pin:
            return
        starts = [tree.root[0]] if _live(tree.root) is not None else []
        for pid, ct in list(tree.pinned.items()):
            if _live((pid, ct)) != (tree.uid, tree.uid):
                del tree.pinned[pid]  # gone, its pid recycled, or now another user's (setuid): not ours
            else:
                starts.append(pid)
        seen = set(starts)
        queue = deque(starts)
        while queue:
            parent = queue.popleft()
            for kid in links.get(parent, ()):
                if kid in seen:
                    continue
                seen.add(kid)
                found = self._child(kid, parent)
                if found is None:
                    continue  # not (or no longer) under `parent`: not the tree's
                born, uids = found
                if kid not in tree.pinned and len(tree.pinned) < MAX_REMEMBERED and uids == (tree.uid, tree.uid):
                    tree.pinned[kid] = born
                queue.append(kid)  # walked through even when not pinned (a setuid helper): its children are the tree's

    @staticmethod
    def _child(pid: int, parent: int) -> tuple[float, tuple[int, int]] | None:
        """(create time, (real, effective uid)) of `pid` if it is a child of `parent` now and may be
        pinned at all; else None."""
        if pid in (1, os.getpid(), os.getppid()):
            return None
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():  # one read of /proc/PID/stat: parent and create time of one process
                if proc.ppid() != parent:
                    return None  # exited and its pid reused since the table was read: not the tree's
                uids = proc.uids()
                return proc.create_time(), (uids.real, uids.effective)
        except psutil.Error:
            return None

    def members(self, run_id: str, root: ProcessIdentity) -> list[ProcessIdentity]:
        """What is pinned under `root` (the attested identity, nothing else) and what is under
        those now, each named with the attested uid, which the killer then requires."""
        tree = self._trees.get(run_id)
        if (tree is None or tree.root[0] != root.pid or abs(tree.root[1] - root.create_time) > CREATE_TIME_TOLERANCE_S
                or (root.uid is not None and root.uid != tree.uid)):
            return []
        try:
            self._pin(tree, _children_map())  # born since the tick's look
        except (psutil.Error, OSError):
            pass  # what the tick pinned still holds
        return [ProcessIdentity(self.host, pid, ct, tree.uid) for pid, ct in tree.pinned.items()]

    def pinned(self, run_id: str) -> int:
        """How many processes are pinned for the run (logs, tests)."""
        tree = self._trees.get(run_id)
        return len(tree.pinned) if tree else 0


# -- The tick's part in exec'd runs: remember their trees, and take a tree down when exec is gone ------------------

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
            # The one gap of tree mode (watchdog.daemon.stops.exectree): said, since nothing else can be.
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
