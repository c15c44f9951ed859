"""Which run a coding CLI's log events (`POST /v1/logs`, watchdog.daemon.otlp.logs) count for,
and who may make them count: the traces' rules (watchdog.daemon.otlp.ingest, applied by the same
code), plus the hook's run.

- The sender is who the receiver's gate says (a bearer token's owner, a run's own token, or an
  anonymous sender's uid) and the kernel's uid of its socket: the same as for spans.
- A run's own token (exec's): its events count for that run only, when the kernel places the
  sender inside exec's tree (as spans naming it).
- A session the sender's hook runs (`agent-watchdog hook`): its events count on the hook's run,
  found, never created: an active hook run of the same CLI and session whose owner is the
  token's (on PostgreSQL the hook's login, written by the database; on SQLite `uid N`) and whose
  hook ran as the sender's Unix user, and whose agent the token may report for; a stopped one
  refuses them (as it refuses its calls). The receiver never writes a row the hook would have to
  own (on PostgreSQL it could not see one).
- Any other session is a run of its sender's own (`source = "otlp"`), with every rule spans
  have: the token's agents, booked under the sender (sealed sender record), anonymous runs judged
  by [defaults], `[otlp] max_new_runs_per_min` (429 and one alert), keyed by sender. An
  anonymous sender's events never count on a hook's run (it did not start it).

A token sender's first events often arrive before the session's first hook call (the CLI exports
its first API request before it calls a tool): they are held, in memory, for up to HOLD_S for the
hook's run to appear (counted there then), else they start the sender's own run. The hold is
admitted as a new run when it begins (the rate's 429 is answered to the request that asked).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from watchdog.core import lifecycle as lc
from watchdog.daemon.otlp import sender
from watchdog.daemon.otlp.auth import Identity
from watchdog.daemon.otlp.ingest import Receiver
from watchdog.daemon.otlp.logs import Session
from watchdog.daemon.otlp.mapping import Group
from watchdog.daemon.otlp.outcome import Outcome
from watchdog.store import witness
from watchdog.store.engine import Connection, Engine
from watchdog.store.hooks import held_run

HOLD_S = 5.0  # how long a session's first events wait for its hook's run
MAX_HELD = 1000  # sessions held at once (past it: their own run at once)
MAX_HELD_CALLS = 10_000  # calls one held session keeps (past it: its own run at once)


@dataclass
class _Held:
    since_s: float
    session: Session
    group: Group
    peer: sender.Peer
    ident: Identity


def group(s: Session, ident: Identity) -> Group:
    """The session as the traces' receiver takes it: exec's run for a run's own token, else a run
    keyed by the session (no process is claimed: a logs run is cooperative)."""
    key = ("run", ident.run_id) if ident.run_id is not None else ("session", s.session_id)
    return Group(key=key, agent=s.agent, claimed_pid=None, calls=list(s.calls), spans=s.records, genai=True,
                 labels={"cli": s.cli})


class LogsReceiver:
    def __init__(self, engine: Engine, receiver: Receiver, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.receiver = receiver
        self.clock = clock
        self._held: dict[tuple[object, ...], _Held] = {}
        self._flush_lock = threading.Lock()

    @property
    def held(self) -> int:
        return len(self._held)

    def ingest(self, found: list[Session], peer: sender.Peer, ident: Identity) -> Outcome:
        self.flush()
        out = Outcome()
        own: list[Group] = []
        full: list[Group] = []  # held sessions past MAX_HELD_CALLS: their own run now (admitted already)
        who = Receiver.sender_of(peer, ident)
        with self.receiver.lock, self.engine.begin() as conn:
            now = witness.store_now(conn)
            for s in found:
                g = group(s, ident)
                if ident.run_id is not None or ident.anonymous:
                    own.append(g)
                    continue
                if self._to_hook_run(conn, s, g, peer, ident, now, out):
                    continue
                key = (*who, s.cli, s.session_id)
                h = self._held.get(key)
                if h is not None:
                    h.group.calls.extend(g.calls)
                    h.group.spans += g.spans
                    out.accepted += g.spans
                    if len(h.group.calls) > MAX_HELD_CALLS:
                        full.append(self._held.pop(key).group)
                elif self.receiver.knows(g, peer, ident) or len(self._held) >= MAX_HELD:
                    own.append(g)
                elif self.receiver.admit(conn, g, ident, (*who, None), now, out):
                    self._held[key] = _Held(self.clock(), s, g, peer, ident)
                    out.accepted += g.spans
        if full:
            self.receiver.ingest(full, peer, ident, admitted=True)
        if own:
            got = self.receiver.ingest(own, peer, ident)
            out.accepted += got.accepted
            out.rejected += got.rejected
            for why in got.reasons or []:
                out.refuse(0, why)
            out.throttled = out.throttled or got.throttled
        return out

    def _to_hook_run(self, conn: Connection, s: Session, g: Group, peer: sender.Peer, ident: Identity,
                     now: object, out: Outcome) -> bool:
        """Counted on the sender's hook run of the session, if it has one (True: done with)."""
        if peer.uid is None:
            return False  # no Unix user: no hook's run is this sender's
        found = held_run(conn, cli=s.cli, session_id=s.session_id, owner=ident.name, uid=peer.uid)
        if found is None:
            return False
        run_id, agent, active = found
        if ident.agents is not None and agent not in ident.agents:
            out.refuse(g.spans, f"this token may not report for agent {agent[:64]!r}")
            return True
        if active and witness.append(conn, run_id, g.calls, source=lc.Source.OTLP, now=now):  # type: ignore[arg-type]
            out.accepted += g.spans
        else:
            out.refuse(g.spans, f"session {s.session_id[:40]}: its run is not active")
        return True

    def flush(self) -> None:
        """Held sessions whose hook run appeared are counted there; those held HOLD_S start their own."""
        if not self._held:
            return
        due: list[_Held] = []
        with self._flush_lock:
            with self.receiver.lock, self.engine.begin() as conn:
                now = witness.store_now(conn)
                for key, h in list(self._held.items()):
                    if self._to_hook_run(conn, h.session, h.group, h.peer, h.ident, now, Outcome()):
                        del self._held[key]
                    elif self.clock() - h.since_s >= HOLD_S:
                        due.append(self._held.pop(key))
            for h in due:
                self.receiver.ingest([h.group], h.peer, h.ident, admitted=True)
