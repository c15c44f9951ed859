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
  own (on PostgreSQL it could not see one). On SQLite any writer can add a row that looks like
  it (same labels and owner): an active one is preferred to stopped look-alikes (a `failed` copy
  cannot blind the session), and when several active (or several stopped) rows claim the session
  none of them gets its events: they count on a run of the sender's own (nothing is lost, no
  look-alike captures them) and the daemon alerts once per session.
- Any other session is a run of its sender's own (`source = "otlp"`), with every rule spans
  have: the token's agents, booked under the sender (sealed sender record), anonymous runs judged
  by [defaults], `[otlp] max_new_runs_per_min` (429 and one alert), keyed by sender. An
  anonymous sender's events never count on a hook's run (it did not start it).

A token sender's first events often arrive before the session's first hook call (the CLI exports
its first API request before it calls a tool): they are held, in memory, for up to HOLD_S for the
hook's run to appear (counted there then), else they start the sender's own run. The hold is
admitted as a new run when it begins (the rate's 429 is answered to the request that asked);
each sender (its identity and Unix user) holds at most MAX_HELD_PER_SENDER sessions, so one
sender cannot crowd out another's. Held sessions are looked at by the server's idle timer
(`flush`), never by a request, and the store is read without the traces' lock.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from watchdog.core import lifecycle as lc
from watchdog.core.outcomes import AlertKind, Outcome as Said, Say
from watchdog.core.text import one_line
from watchdog.daemon.money.prices import PriceBook
from watchdog.daemon.otlp import sender
from watchdog.daemon.otlp.auth import Identity
from watchdog.daemon.otlp.ingest import Receiver
from watchdog.daemon.otlp.logs import Session
from watchdog.daemon.otlp.mapping import Group
from watchdog.daemon.otlp.outcome import Outcome
from watchdog.store import witness
from watchdog.store.alerts import announce
from watchdog.store.engine import Connection, Engine, bound_lock_waits
from watchdog.store.hooks import HookRun, held_runs

log = logging.getLogger("watchdog.otlp")

HOLD_S = 5.0  # how long a session's first events wait for its hook's run
MAX_HELD_PER_SENDER = 32  # sessions one sender holds at once (past it: its own run at once)
MAX_HELD = 1000  # sessions held at once, all senders (a memory bound; past it: their own run at once)
MAX_HELD_CALLS = 10_000  # calls one held session keeps (past it: its own run at once)
SESSION_SHOWN_CHARS = 40

SEVERAL = "several"  # more than one hook run claims the session: none of them is its run
Found = HookRun | str | None

SenderKey = tuple[str, int | str | None]
HeldKey = tuple[str, int | str | None, str, str]  # (sender, its uid, cli, session id)


@dataclass
class _Held:
    since_s: float
    session: Session
    group: Group
    peer: sender.Peer
    ident: Identity
    uid: int  # the peer's (a sender without one holds nothing: no hook run is its)


def group(s: Session, ident: Identity) -> Group:
    """The session as the traces' receiver takes it: exec's run for a run's own token, else a run
    keyed by the session (no process is claimed: a logs run is cooperative)."""
    key = ("run", ident.run_id) if ident.run_id is not None else ("session", s.session_id)
    return Group(key=key, agent=s.agent, claimed_pid=None, calls=list(s.calls), spans=s.records, genai=True,
                 labels={"cli": s.cli})


def pick(found: list[HookRun]) -> Found:
    """The session's run among the rows that claim it (held_runs: active first, at most two): the
    only one; the active one of an active and a stopped look-alike; SEVERAL for two of a kind."""
    if not found:
        return None
    if len(found) == 1 or (found[0].active and not found[1].active):
        return found[0]
    return SEVERAL


def claimed(found: list[Session], book: PriceBook) -> None:
    """The steps that claim a cost (Claude Code's `cost_usd`) for a model no price table knows
    ([prices], genai-prices) are written with that cost, in EUR at `[pricing] eur_per_usd`: a
    claim only raises its own run's cost (a claim of 0 is no different from unpriced). A step
    whose model the daemon prices keeps the daemon's price (the tick's backfill), whatever it
    claims."""
    for s in found:
        for c in s.calls:
            if c.claimed_cost_usd is None or c.kind != lc.EventKind.STEP or book.known(c.model):
                continue
            eur = c.claimed_cost_usd * book.eur_per_usd
            if math.isfinite(eur) and eur > 0:
                c.cost_eur = eur


class LogsReceiver:
    def __init__(self, engine: Engine, receiver: Receiver, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.receiver = receiver
        self.clock = clock
        self._held: dict[HeldKey, _Held] = {}
        self._per_sender: Counter[SenderKey] = Counter()
        self._lock = threading.Lock()  # the hold (never held over a store query)
        self._flush_lock = threading.Lock()
        cfg = receiver.config
        self.prices = PriceBook(cfg.prices, cfg.pricing.eur_per_usd)  # the receiver's own (its thread's caches)
        self._prices_lock = threading.Lock()

    @property
    def held(self) -> int:
        return len(self._held)

    def held_by(self, who: SenderKey) -> int:
        return self._per_sender[who]

    def ingest(self, found: list[Session], peer: sender.Peer, ident: Identity) -> Outcome:
        out = Outcome()
        with self._prices_lock:
            claimed(found, self.prices)
        who = Receiver.sender_of(peer, ident)
        if ident.run_id is None and not ident.anonymous and peer.uid is not None:
            rest, own = self._to_hook_runs(found, peer, ident, who, out)
        else:
            rest, own = [], [group(s, ident) for s in found]
        full: list[Group] = []  # held sessions past MAX_HELD_CALLS: their own run now (admitted already)
        if rest:
            with self.receiver.lock, self.engine.begin() as conn:
                bound_lock_waits(conn)  # as the receiver's ingest: a locked run row fails this request only
                now = witness.store_now(conn)
                for s, g in rest:
                    self._hold(conn, s, g, peer, ident, who, now, out, own, full)
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

    def _to_hook_runs(self, found: list[Session], peer: sender.Peer, ident: Identity, who: SenderKey,
                      out: Outcome) -> tuple[list[tuple[Session, Group]], list[Group]]:
        """The sessions' events counted on their hook runs (one statement looks them all up; the
        store only, no receiver state: without the traces' lock); (those with none yet, those
        claimed by several: their own)."""
        rest: list[tuple[Session, Group]] = []
        own: list[Group] = []
        uid = peer.uid
        assert uid is not None
        with self.engine.begin() as conn:
            now = witness.store_now(conn)
            claims = held_runs(conn, [(s.cli, s.session_id, ident.name, uid) for s in found])
            for s in found:
                g = group(s, ident)
                these = claims[(s.cli, s.session_id, ident.name, uid)]
                run = pick(these)
                if run is None:
                    rest.append((s, g))
                elif isinstance(run, HookRun):
                    self._count_on(conn, run, s, g, ident, now, out)
                else:
                    self._alert_several(conn, s, uid, who, these, now)
                    own.append(g)
        return rest, own

    def _hold(self, conn: Connection, s: Session, g: Group, peer: sender.Peer, ident: Identity, who: SenderKey,
              now: dt.datetime, out: Outcome, own: list[Group], full: list[Group]) -> None:
        """(Under the traces' lock: admit.) Held for its hook run, or its own run (into `own`)."""
        key: HeldKey = (*who, s.cli, s.session_id)
        uid = peer.uid
        assert uid is not None  # (ingest holds only senders with a Unix user)
        with self._lock:
            h = self._held.get(key)
            if h is not None:
                h.group.calls.extend(g.calls)
                h.group.spans += g.spans
                out.accepted += g.spans
                if len(h.group.calls) > MAX_HELD_CALLS:
                    full.append(self._pop(key).group)
                return
            room = self._per_sender[who] < MAX_HELD_PER_SENDER and len(self._held) < MAX_HELD
        if not room or self.receiver.knows(g, peer, ident):
            own.append(g)
        elif self.receiver.admit(conn, g, ident, (*who, None), now, out):
            with self._lock:
                self._held[key] = _Held(self.clock(), s, g, peer, ident, uid)
                self._per_sender[who] += 1
            out.accepted += g.spans

    def _pop(self, key: HeldKey) -> _Held:
        """(Under self._lock.)"""
        h = self._held.pop(key)
        who: SenderKey = (key[0], key[1])
        self._per_sender[who] -= 1
        if self._per_sender[who] <= 0:
            del self._per_sender[who]
        return h

    def _count_on(self, conn: Connection, run: HookRun, s: Session, g: Group, ident: Identity, now: dt.datetime,
                  out: Outcome) -> None:
        # The hook counted each of the session's tool calls before it ran (its matcher is every
        # tool): the events' tool calls are those, once (Claude Code's and Codex's share its call
        # ids; Gemini CLI's hook input names none, so its calls would count twice). Steps are theirs.
        calls = [c for c in g.calls if c.kind != lc.EventKind.TOOL]
        if ident.agents is not None and run.agent not in ident.agents:
            out.refuse(g.spans, f"this token may not report for agent {run.agent[:64]!r}")
        elif run.active and witness.append(conn, run.id, calls, source=lc.Source.OTLP, now=now):
            out.accepted += g.spans
        else:
            out.refuse(g.spans, f"session {s.session_id[:40]}: its run is not active")

    def _alert_several(self, conn: Connection, s: Session, uid: int, who: SenderKey, found: list[HookRun],
                       now: dt.datetime) -> None:
        """Once per (CLI, Unix user, session): a writer of the store made a look-alike of the hook's run."""
        digest = hashlib.sha256(f"{s.cli}\x00{uid}\x00{s.session_id}".encode("utf-8", "surrogateescape"))
        key = AlertKind.FORGED.key(f"session-{digest.hexdigest()[:16]}", "hook-runs")
        shown = one_line(s.session_id)[:SESSION_SHOWN_CHARS]
        said = Said.of(Say.SESSION_CLAIMED, key, cli=s.cli, uid=uid, session=s.session_id,
                     runs=[r.id for r in found], sender=str(who[0]))
        if announce(conn, said, now=now, sealer=self.receiver.sealer).queued:
            log.warning("otlp logs: several hook runs claim %s session %s of uid %d: its events count apart",
                        s.cli, shown, uid)

    def flush(self) -> None:
        """(The server's idle timer.) Held sessions whose hook run appeared are counted there;
        those claimed by several runs, or held HOLD_S, start their own. One statement looks up
        every held session (SESSIONS_A_QUERY a statement), outside the traces' lock."""
        if not self._held:
            return
        due: list[_Held] = []
        with self._flush_lock:
            with self._lock:
                items = list(self._held.items())
            with self.engine.begin() as conn:
                now = witness.store_now(conn)
                found = held_runs(conn, [(k[2], k[3], h.ident.name, h.uid) for k, h in items])
                for key, h in items:
                    claims = found[(key[2], key[3], h.ident.name, h.uid)]
                    got = pick(claims)
                    if got is None and self.clock() - h.since_s < HOLD_S:
                        continue
                    with self._lock:
                        if self._held.get(key) is not h:
                            continue
                        self._pop(key)
                    if isinstance(got, HookRun):
                        self._count_on(conn, got, h.session, h.group, h.ident, now, Outcome())
                        continue
                    if got == SEVERAL:
                        self._alert_several(conn, h.session, h.uid, (key[0], key[1]), claims,
                                            now)
                    due.append(h)
            for h in due:
                self.receiver.ingest([h.group], h.peer, h.ident, admitted=True)
