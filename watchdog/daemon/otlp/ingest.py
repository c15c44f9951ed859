"""Mapped spans → the store: which run each group of spans counts for, and who may make it count.

Every request comes with its sender's identity (watchdog.daemon.otlp.auth: a bearer token's
owner, a run's own token, or an anonymous sender's socket uid) and the kernel's view of its
socket (watchdog.daemon.otlp.sender).

- A group naming exec's run (`agent_watchdog.run_id`) counts for it only when the kernel places
  the sender inside exec's attested tree; otherwise its spans are refused for that run
  (partial_success), whatever they claim. A run's own token reports for that run only.
- Any other group is a run of its own (`source = "otlp"`), found again by its key (conversation
  or trace) while it is active — among the runs of the same sender only: spans naming another
  sender's conversation start a run of their own sender. A token reports only for the agents it
  names. The run is booked under its sender (`runs.owner` on SQLite, a sealed record in its
  attestation everywhere: watchdog.daemon.otlp.senders). It is cooperative — stopped in the
  store and alerted, never signalled — unless `[otlp] kill_mode = "process"` and the kernel
  confirms the claimed `process.pid` sent the spans: that process is then attested by the
  daemon itself (sealed, pid + create time), only spans from that same process count for the
  run, and the receiver MACs their events, so a signal rests on what the daemon received and
  never on the row's counters.
- Limits: active runs per sender, new runs per sender per minute (`[otlp]
  max_new_runs_per_min`, 429 past it, alerted once a day), a bounded memory of keys and span ids.

The key → run cache is rebuilt from the store at start (the runs' labels name their key, their
sealed attestation their sender).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable

from watchdog.core import lifecycle as lc
from watchdog.core.config import Config
from watchdog.core.seal import Sealer
from watchdog.core.evidence_mac import RecordMac
from watchdog.daemon.otlp import rate, sender, senders
from watchdog.daemon.otlp.auth import Identity
from watchdog.daemon.otlp.mapping import Call, Group
from watchdog.daemon.otlp.outcome import Lru as _Lru, Outcome
from watchdog.store import witness
from watchdog.store.attestations import load as load_attestation
from watchdog.store.engine import Connection, Engine, bound_lock_waits
from watchdog.core.periods import utcnow

log = logging.getLogger("watchdog.otlp")

# (its identity, the socket's owner uid or the peer's host, the process the kernel confirmed sent
# it: pid + create time, under kill_mode "process" only): a key names runs of the same sender only.
SenderKey = tuple[str, int | str | None, tuple[int, float] | None]
MAX_RUNS_PER_SENDER = 256  # active span-only runs one sender (uid) may have open at once
MAX_KEYS = 100_000  # keys, traces and span ids remembered (oldest forgotten first)
# A run key's label (logs: a coding CLI's session, watchdog.daemon.otlp.logs)
KEY_LABELS = {"conversation": "gen_ai.conversation.id", "trace": "otel.trace_id", "session": "session"}


class Receiver:
    """The decision behind POST /v1/traces (the HTTP side is watchdog.daemon.otlp.server)."""

    def __init__(self, engine: Engine, config: Config, sealer: Sealer | None, host: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.config = config
        self.sealer = sealer
        self.host = host
        self.clock = clock
        self.lock = threading.Lock()  # one writer at a time: keys resolve to one run (the logs receiver too)
        # (sender, kind, value) -> run id: a key names a run of the same sender only
        self._runs: _Lru[tuple[SenderKey, str, str], str] = _Lru(MAX_KEYS)
        self._traces: _Lru[tuple[SenderKey, str], str] = _Lru(MAX_KEYS)  # (sender, trace id) -> run id
        # (run id, span id) already counted (an exporter's retry)
        self._spans: _Lru[tuple[str, str], bool] = _Lru(MAX_KEYS)
        self._owner: dict[str, SenderKey | None] = {}  # run id -> its sender
        self._pins: dict[str, tuple[RecordMac, int, float]] = {}  # run id -> its events' MAC, pinned pid, create time
        # (socket inode, claimed pid) -> the process the kernel confirms sent it, else why not
        self._confirmed: _Lru[tuple[int, int | None], tuple[sender.Pinned | None, str]] = _Lru(4096)
        # (socket inode, run id) -> why the sender is not inside exec's tree ("": it is)
        self._tree: _Lru[tuple[int | None, str], str] = _Lru(4096)
        self._starts = rate.Window(config.otlp.max_new_runs_per_min, 60.0)
        # Told of each anonymous run (the daemon's judge: [defaults] from its first tick).
        self.on_anonymous: Callable[[str], None] | None = None
        self.rebuild()

    def rebuild(self) -> None:
        self._anonymous: list[str] = []  # told to on_anonymous once it is set (watch)
        with self.engine.connect() as conn:
            for run_id, labels in witness.active_runs_of(conn, lc.Source.OTLP, self.host):
                rec = senders.recorded(conn, self.sealer, run_id)
                if rec is not None and rec.anonymous:
                    self._anonymous.append(run_id)
                proc = None if rec is None or rec.pinned is None else (rec.pinned[1], round(rec.pinned[2], 2))
                sk = None if rec is None else (rec.name, rec.uid, proc)
                self._owner[run_id] = sk
                if rec is not None and rec.pinned is not None:
                    self._pins[run_id] = rec.pinned
                if sk is None:
                    continue  # no sealed sender: no later span can be matched to it (it ends by silence)
                for kind, label in KEY_LABELS.items():
                    if labels and isinstance(labels.get(label), str):
                        self._runs.put((sk, kind, labels[label]), run_id)
                        if kind == "trace":
                            self._traces.put((sk, labels[label]), run_id)

    # -- one request -------------------------------------------------------------------

    def ingest(self, groups: list[Group], peer: sender.Peer, ident: Identity, admitted: bool = False) -> Outcome:
        """`admitted`: the groups' new runs passed `admit` already (logs held for a hook run)."""
        out = Outcome()
        exec_ok = {g.key: self._inside_exec_tree(g, peer, ident) for g in groups if g.key[0] == "run"}
        who = self.sender_of(peer, ident)
        with self.lock, self.engine.begin() as conn:
            # Bounded: a span's events lock their run's row (0017's seq-once trigger), which the
            # run's own login may hold locked; an unbounded wait here, under the receiver's lock,
            # would stall every sender's spans. Past it: 503, the exporter retries.
            bound_lock_waits(conn)
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
                pinned, why = self._confirm(peer, g.claimed_pid)
                sk: SenderKey = (*who, None if pinned is None else (pinned.pid, round(pinned.create_time, 2)))
                run_id = None if ident.run_id is not None else self._known(g, sk)
                if run_id is None and not g.genai:
                    out.accepted += g.spans  # a trace of no agent (HTTP, database spans): no run of its own
                    continue
                if ident.run_id is not None:
                    out.refuse(g.spans, f"a run's own token reports for run {ident.run_id[:32]} only")
                    continue
                if run_id is None or not witness.append(conn, run_id, self._fresh(run_id, g.calls),
                                                        source=lc.Source.OTLP, now=now, mac=self._mac(run_id)):
                    run_id = self._start(conn, g, peer, ident, sk, (pinned, why), now, out, admitted)
                    if run_id is None:
                        continue
                    witness.append(conn, run_id, self._fresh(run_id, g.calls), source=lc.Source.OTLP, now=now,
                                   new=True, mac=self._mac(run_id))
                out.accepted += g.spans
                for t in g.trace_ids:
                    self._traces.put((sk, t), run_id)
                self._runs.put((sk, *g.key), run_id)
                if g.root_ended and witness.complete(conn, run_id, now=now):
                    self._forget(run_id)
        return out

    def _mac(self, run_id: str) -> witness.MacFn | None:
        pin = self._pins.get(run_id)
        return None if pin is None else senders.event_mac(pin[0], run_id)

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

    @staticmethod
    def sender_of(peer: sender.Peer, ident: Identity) -> tuple[str, int | str | None]:
        """Who a request is from: its identity and the kernel's uid (else the peer's address)."""
        return ident.name, peer.uid if peer.uid is not None else peer.address[0]

    def knows(self, g: Group, peer: sender.Peer, ident: Identity) -> bool:
        """The sender has a run for the group's key already (it counts there)."""
        return self._known(g, (*self.sender_of(peer, ident), None)) is not None

    def _known(self, g: Group, sk: SenderKey) -> str | None:
        run_id = self._runs.get((sk, *g.key))
        if run_id is None:
            for t in g.trace_ids:
                if (run_id := self._traces.get((sk, t))) is not None:
                    break
        return run_id

    def _confirm(self, peer: sender.Peer, claimed_pid: int | None) -> tuple[sender.Pinned | None, str]:
        """Under kill_mode "process": the claimed process.pid, if the kernel confirms it sent this
        request (cached per socket: one connection, one process); else (None, why not)."""
        if self.config.otlp.kill_mode != lc.PROCESS or self.sealer is None:
            return None, "kill_mode is cooperative"
        if peer.inode is None:
            return sender.confirm_claim(peer, claimed_pid)
        key = (peer.inode, claimed_pid)
        got = self._confirmed.get(key)
        if got is None:
            got = sender.confirm_claim(peer, claimed_pid)
            self._confirmed.put(key, got)
        return got

    def _forget(self, run_id: str) -> None:
        self._owner.pop(run_id, None)
        self._pins.pop(run_id, None)

    def admit(self, conn: Connection, g: Group, ident: Identity, sk: SenderKey, now: dt.datetime,
              out: Outcome) -> bool:
        """Whether the sender may start a run for `g` (both routes' rules): the token's agents, the
        sender's active runs, its new runs a minute (429 past it, one alert); refused into `out`."""
        if ident.agents is not None and g.agent not in ident.agents:
            out.refuse(g.spans, f"this token may not report for agent {g.agent[:64]!r}")
            return False
        if self._open(sk) >= MAX_RUNS_PER_SENDER:
            self._prune(conn)
            if self._open(sk) >= MAX_RUNS_PER_SENDER:
                out.refuse(g.spans, f"more than {MAX_RUNS_PER_SENDER} active runs from this sender")
                return False
        if not self._starts.admit(sk[:2], self.clock()):
            out.throttled = True
            out.refuse(g.spans, f"more than {self.config.otlp.max_new_runs_per_min} new runs a minute from this "
                                "sender ([otlp] max_new_runs_per_min)")
            rate.alert_flood(conn, self.sealer, ident.name, self.config.otlp.max_new_runs_per_min, now)
            return False
        return True

    def _start(self, conn: Connection, g: Group, peer: sender.Peer, ident: Identity, sk: SenderKey,
               confirmed: tuple[sender.Pinned | None, str], now: dt.datetime, out: Outcome,
               admitted: bool = False) -> str | None:
        """A new span-only run for the group's key, or None (refused: the sender has too many)."""
        if not admitted and not self.admit(conn, g, ident, sk, now, out):
            return None
        run_id = uuid.uuid4().hex
        labels = {**g.labels, KEY_LABELS[g.key[0]]: g.key[1]}
        sealer = self.sealer
        pinned, why = confirmed
        if self.config.otlp.kill_mode == lc.PROCESS and pinned is None:
            log.info("otlp run %s: cooperative, %s", run_id[:8], why)
        if pinned is None or sealer is None:  # (a pinned sender implies a sealer)
            witness.create_run(conn, run_id=run_id, agent=g.agent, source=lc.Source.OTLP, host=self.host,
                               kill_mode=lc.COOPERATIVE, labels=labels, now=now, owner=ident.name)
        else:
            witness.create_run(conn, run_id=run_id, agent=g.agent, source=lc.Source.OTLP, host=self.host,
                               kill_mode=lc.PROCESS, labels=labels, pid=pinned.pid,
                               pid_create_time=pinned.create_time, now=now, owner=ident.name)
            log.info("otlp run %s: sender pid %d (uid %d) confirmed by the kernel", run_id[:8], pinned.pid,
                     pinned.uid)
        if sealer is not None:
            mac = senders.record(conn, sealer, run_id=run_id, host=self.host, name=ident.name,
                                 anonymous=ident.anonymous, uid=peer.uid, pinned=pinned, now=utcnow())
            if mac is not None and pinned is not None:
                self._pins[run_id] = (mac, pinned.pid, pinned.create_time)
        self._owner[run_id] = sk
        if ident.anonymous and self.on_anonymous is not None:
            self.on_anonymous(run_id)
        return run_id

    def watch(self, on_anonymous: Callable[[str], None]) -> None:
        """Tell `on_anonymous` of every anonymous run, those rebuilt at start first."""
        self.on_anonymous = on_anonymous
        for run_id in self._anonymous:
            on_anonymous(run_id)
        self._anonymous = []

    def _open(self, sk: SenderKey) -> int:
        """Active runs of the sender (whatever process of it sent them)."""
        return sum(1 for owner in self._owner.values() if owner is not None and owner[:2] == sk[:2])

    def _prune(self, conn: Connection) -> None:
        """Forget the owners of runs that ended (by silence, a stop, their root span)."""
        active = {rid for rid, _ in witness.active_runs_of(conn, lc.Source.OTLP, self.host)}
        for rid in [r for r in self._owner if r not in active]:
            self._forget(rid)

    # -- exec's runs ----------------------------------------------------------------------

    def _inside_exec_tree(self, g: Group, peer: sender.Peer, ident: Identity) -> str:
        """"" when the group may count for the exec'd run it names, else why not."""
        run_id = g.key[1]
        if ident.run_id is not None and ident.run_id != run_id:
            return f"a run's own token reports for run {ident.run_id[:32]} only"
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


def sender_counts(receiver: Receiver) -> Counter[int | str | None]:
    """Active span-only runs per sender uid (for tests and metrics)."""
    return Counter(None if sk is None else sk[1] for sk in receiver._owner.values())
