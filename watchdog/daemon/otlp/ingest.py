"""Mapped spans → the store: which run each group of spans counts for, and who may make it count.

- A group naming exec's run (`agent_watchdog.run_id`) counts for it only when the kernel places
  the sender inside exec's attested tree (watchdog.daemon.otlp.sender); otherwise its spans are
  refused for that run (partial_success), whatever they claim.
- Any other group is a run of its own (`source = "otlp"`), found again by its key (conversation
  or trace) while it is active. It is cooperative — stopped in the store and alerted, never
  signalled — unless `[otlp] kill_mode = "process"` and the kernel confirms the claimed
  `process.pid` sent the spans: that process is then attested by the daemon itself (sealed,
  pid + create time), as the Unix socket attests an SDK's.
- Limits: runs per sender (the socket owner's uid), a bounded memory of keys and span ids.

The key → run cache is rebuilt from the store at start (the runs' labels name their key).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import uuid
from collections import Counter, OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TypeVar

from watchdog.core import lifecycle as lc
from watchdog.core.config import Config
from watchdog.core.seal import Sealer
from watchdog.daemon.otlp import sender
from watchdog.daemon.otlp.mapping import Call, Group
from watchdog.store import witness
from watchdog.store.attestations import Attestation, load as load_attestation
from watchdog.store.engine import Connection, Engine
from watchdog.core.clock import utcnow

log = logging.getLogger("watchdog.otlp")

MAX_RUNS_PER_SENDER = 256  # active span-only runs one sender (uid) may have open at once
MAX_KEYS = 100_000  # keys, traces and span ids remembered (oldest forgotten first)
KEY_LABELS = {"conversation": "gen_ai.conversation.id", "trace": "otel.trace_id"}


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Lru(OrderedDict[K, V]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: K, value: V) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


@dataclass
class Outcome:
    accepted: int = 0
    rejected: int = 0
    reasons: list[str] | None = None

    def refuse(self, n: int, why: str) -> None:
        self.rejected += n
        self.reasons = (self.reasons or [])
        if why not in self.reasons:
            self.reasons.append(why)

    @property
    def message(self) -> str:
        return "; ".join(self.reasons or [])[:500]


class Receiver:
    """The decision behind POST /v1/traces (the HTTP side is watchdog.daemon.otlp.server)."""

    def __init__(self, engine: Engine, config: Config, sealer: Sealer | None, host: str) -> None:
        self.engine = engine
        self.config = config
        self.sealer = sealer
        self.host = host
        self._lock = threading.Lock()  # one writer at a time: keys resolve to one run
        self._runs: _Lru[tuple[str, str], str] = _Lru(MAX_KEYS)  # (kind, value) -> run id
        self._traces: _Lru[str, str] = _Lru(MAX_KEYS)  # trace id -> run id
        # (run id, span id) already counted (an exporter's retry)
        self._spans: _Lru[tuple[str, str], bool] = _Lru(MAX_KEYS)
        self._owner: dict[str, int | None] = {}  # run id -> sender uid
        # (socket inode, run id) -> why the sender is not inside exec's tree ("": it is)
        self._tree: _Lru[tuple[int | None, str], str] = _Lru(4096)
        self.rebuild()

    def rebuild(self) -> None:
        with self.engine.connect() as conn:
            for run_id, labels in witness.active_runs_of(conn, lc.Source.OTLP, self.host):
                for kind, label in KEY_LABELS.items():
                    if labels and isinstance(labels.get(label), str):
                        self._runs.put((kind, labels[label]), run_id)
                        if kind == "trace":
                            self._traces.put(labels[label], run_id)
                self._owner[run_id] = None

    # -- one request -------------------------------------------------------------------

    def ingest(self, groups: list[Group], peer: sender.Peer) -> Outcome:
        out = Outcome()
        exec_ok = {g.key: self._inside_exec_tree(g, peer) for g in groups if g.key[0] == "run"}
        with self._lock, self.engine.begin() as conn:
            now = witness.store_now(conn)
            run_id: str | None
            for g in groups:
                if g.key[0] == "run":
                    why = exec_ok[g.key]
                    if why:
                        out.refuse(g.spans, why)
                        continue
                    run_id = g.key[1]
                    if not witness.append(conn, run_id, self._fresh(run_id, g.calls), source=lc.Source.OTLP, now=now,
                                          joined=True):
                        out.refuse(g.spans, f"run {run_id[:32]} is not active")
                        continue
                    out.accepted += g.spans
                    continue
                run_id = self._known(g)
                if run_id is None and not g.genai:
                    out.accepted += g.spans  # a trace of no agent (HTTP, database spans): no run of its own
                    continue
                calls = self._fresh(run_id, g.calls) if run_id else g.calls
                if run_id is None or not witness.append(conn, run_id, calls, source=lc.Source.OTLP, now=now):
                    run_id = self._start(conn, g, peer, now, out)
                    if run_id is None:
                        continue
                    witness.append(conn, run_id, self._fresh(run_id, g.calls), source=lc.Source.OTLP, now=now,
                                   new=True)
                out.accepted += g.spans
                for t in g.trace_ids:
                    self._traces.put(t, run_id)
                self._runs.put(g.key, run_id)
                if g.root_ended and witness.complete(conn, run_id, now=now):
                    self._forget(run_id)
        return out

    def _fresh(self, run_id: str, calls: list[Call]) -> list[Call]:
        """The calls not counted yet (an exporter that retries resends the same spans). A Call has
        the fields of witness.WitnessedCall: it is written as it is."""
        out = []
        seen = self._spans
        for c in calls:
            if c.span_id:
                key = (run_id, c.span_id)
                if key in seen:
                    continue
                seen.put(key, True)
            if c.error_msg is not None and self.config.store.record_errors == "class":
                c = dataclasses.replace(c, error_msg=None)
            out.append(c)
        return out

    def _known(self, g: Group) -> str | None:
        run_id = self._runs.get(g.key)
        if run_id is None:
            for t in g.trace_ids:
                if (run_id := self._traces.get(t)) is not None:
                    break
        return run_id

    def _forget(self, run_id: str) -> None:
        self._owner.pop(run_id, None)

    def _start(self, conn: Connection, g: Group, peer: sender.Peer, now: dt.datetime, out: Outcome) -> str | None:
        """A new span-only run for the group's key, or None (refused: the sender has too many)."""
        uid = peer.uid
        if uid is not None or peer.address:
            mine = sum(1 for owner in self._owner.values() if owner == uid)
            if mine >= MAX_RUNS_PER_SENDER:
                self._prune(conn)
                if sum(1 for owner in self._owner.values() if owner == uid) >= MAX_RUNS_PER_SENDER:
                    out.refuse(g.spans, f"more than {MAX_RUNS_PER_SENDER} active runs from this sender")
                    return None
        run_id = uuid.uuid4().hex
        labels = {KEY_LABELS[g.key[0]]: g.key[1]}
        pinned, why = None, ""
        sealer = self.sealer
        if self.config.otlp.kill_mode == lc.PROCESS and sealer is not None:
            pinned, why = sender.confirm_claim(peer, g.claimed_pid)
            if pinned is None:
                log.info("otlp run %s: cooperative, %s", run_id[:8], why)
        if pinned is None or sealer is None:  # (a pinned sender implies a sealer)
            witness.create_run(conn, run_id=run_id, agent=g.agent, source=lc.Source.OTLP, host=self.host,
                               kill_mode=lc.COOPERATIVE, labels=labels, now=now)
        else:
            witness.create_run(conn, run_id=run_id, agent=g.agent, source=lc.Source.OTLP, host=self.host,
                               kill_mode=lc.PROCESS, labels=labels, pid=pinned.pid,
                               pid_create_time=pinned.create_time, now=now)
            mac = sealer.identity(run_id, self.host, pinned.pid, pinned.create_time, pinned.uid, lc.PROCESS)
            witness.pin_process(conn, Attestation(run_id, self.host, pinned.pid, pinned.create_time, pinned.uid,
                                                  lc.PROCESS, utcnow(), mac))
            log.info("otlp run %s: sender pid %d (uid %d) confirmed by the kernel", run_id[:8], pinned.pid,
                     pinned.uid)
        self._owner[run_id] = uid
        return run_id

    def _prune(self, conn: Connection) -> None:
        """Forget the owners of runs that ended (by silence, a stop, their root span)."""
        active = {rid for rid, _ in witness.active_runs_of(conn, lc.Source.OTLP, self.host)}
        for rid in [r for r in self._owner if r not in active]:
            del self._owner[rid]

    # -- exec's runs ----------------------------------------------------------------------

    def _inside_exec_tree(self, g: Group, peer: sender.Peer) -> str:
        """"" when the group may count for the exec'd run it names, else why not."""
        run_id = g.key[1]
        cache_key = (peer.inode, run_id)
        if peer.inode is not None and cache_key in self._tree:
            return self._tree[cache_key]
        with self.engine.connect() as conn:
            ref = witness.run_ref(conn, run_id)
            a = load_attestation(conn, run_id) if ref is not None else None
        why = ""
        if ref is None or ref.source != lc.Source.EXEC:
            why = f"agent_watchdog.run_id {run_id[:32]} names no run of agent-watchdog exec"
        elif ref.host != self.host or a is None or self.sealer is None or not self.sealer.identity_ok(
                a.mac, a.run_id, a.host, a.pid, a.pid_create_time, a.uid, a.kill_mode, a.cgroup):
            why = f"run {run_id[:32]} has no attested process on this host"
        elif not sender.inside_tree(peer, g.claimed_pid, a.pid, a.pid_create_time):
            why = f"the sender is not inside the process tree of run {run_id[:32]}"
            log.warning("otlp: refused %d span(s) naming run %s from %s:%s (uid %s): not inside its tree",
                        g.spans, run_id[:8], peer.address[0], peer.address[1], peer.uid)
        if peer.inode is not None:
            self._tree.put(cache_key, why)
        return why


def sender_counts(receiver: Receiver) -> Counter[int | None]:
    """Active span-only runs per sender uid (for tests and metrics)."""
    return Counter(receiver._owner.values())
