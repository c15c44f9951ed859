"""The tick's evidence rules (issue 20): what a run's row may claim and what the daemon believes.

- first sight: the wall clock runs from when the daemon first saw a run at the latest
  (its state file, watchdog.store.memory), so a future-dated `started_at` buys nothing;
- budgets above the profile only with `runs_may_raise` or a sealed operator resume
  (`resumes` on the row is a claim);
- a profile's `owners` bind who may use it: a run whose owner (PostgreSQL's `runs.owner`,
  or the Unix user of its sealed attestation) may not use it is judged by [defaults], alerted once;
- a `paused` the daemon did not write or confirm is judged as running;
- a run whose row cannot be read whole is still stopped at its wall clock from first sight,
  and marked lost when its process is gone (`Backstop`).
"""

from __future__ import annotations

import datetime as dt
import logging
import pwd
from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from watchdog.core.rowviews import Row, RunView
from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.interventions import Action
from watchdog.core import policies as ap
from watchdog.core.budgets import BY_KEY, Budgets, effective, asked
from watchdog.core.config import Config
from watchdog.core.lifecycle import Source
from watchdog.core.text import one_line
from watchdog.daemon.otlp.senders import sender_of
from watchdog.daemon.trust.lightrow import LightRow, agent_of, run_id
from watchdog.core.whose import OWNER_PREFIX, owner_key
from watchdog.store.pause import deny_pause
from watchdog.store.alerts import Audit, announce, attested_uid, grant_ok
from watchdog.store.engine import Connection
from watchdog.store.memory import Memory

if TYPE_CHECKING:
    from watchdog.core.seal import Sealer

log = logging.getLogger("watchdog.trust")

_MEMO_MAX = 50_000
OTLP = Source.OTLP


def agent_shown(name: object) -> str:
    """An agent or tool name as alerts show it: bounded, scrubbed, one line, marked as the agent's."""
    from watchdog.core.text import scrub

    return f"«{one_line(scrub(str(name)) or '', 60)}» (as the agent names it)"


class Trust:
    def __init__(self, config: Config, memory: Memory, *, sealer: Sealer | None = None, by: str = "") -> None:
        self.config = config
        self.memory = memory
        self.sealer = sealer
        self.by = by
        self.new_seen: list[tuple[str, float, object]] = []  # (run id, first sight, the parent it names)
        self._raised: dict[tuple[object, ...], bool] = {}  # (run id, resumes, its budgets) -> grant verified
        self._owner_ok: dict[str, bool] = {}
        self._owners: dict[str, str | None] = {}  # run id -> its owner, as _owner proved it (checked runs)
        self._spend_key: dict[str, str] = {}  # run id -> the name its spend is booked under (bound agents)
        self._bound_for: Config | None = None
        self._bound: frozenset[str] = frozenset()

    # -- first sight ------------------------------------------------------------------

    @property
    def first(self) -> dict[str, float]:
        return self.memory.first

    def flush(self, active: Collection[str]) -> None:
        """Remember this tick's first sights (run id, when, the parent it names then: the daemon's
        own record of the link); forget the runs no longer active."""
        seen, self.new_seen = self.new_seen, []
        new = [(rid, at) for rid, at, _parent in seen]
        try:
            self.memory.see(new, [(rid, p) for rid, _at, p in seen if isinstance(p, str) and p])
            if len(self.memory.first) > len(active) + 1000:
                self.memory.forget([r for r in self.memory.first if r not in active])
        except Exception:  # noqa: BLE001 — kept in this process's memory; written again next tick
            log.warning("could not write the daemon's state file", exc_info=True)
            for rid, at in new:
                self.memory.first.setdefault(rid, at)

    def parent_ok(self, child: RunView) -> bool:
        """The child's parent link is the one the daemon recorded when it first saw the child."""
        parent = getattr(child, "parent_id", None)
        return bool(parent) and self.memory.marked("parent", child.id) == parent

    def started_at(self, row: RunView) -> dt.datetime:
        """The run's start as the wall clock counts it: its own, or the daemon's first sight if earlier."""
        seen = self.memory.first.get(row.id)
        if seen is None:
            return row.started_at
        first = dt.datetime.fromtimestamp(seen, dt.timezone.utc)
        return first if (row.started_at is None or first < row.started_at) else row.started_at

    # -- budgets -------------------------------------------------------------------------

    def raised_key(self, rid: str, r_resumes: object, own_budgets: Iterable[object]) -> bool:
        """For the pre-filter: a sealed resume was verified for these exact budgets."""
        return self._raised.get((rid, r_resumes, tuple(own_budgets)), False)

    def budgets(self, connect: Callable[[], AbstractContextManager[Connection]], row: RunView) -> Budgets:
        """What the run is held to: its profile (or [defaults] for an owner it does not bind),
        lowered by its own request, raised only by a sealed operator resume. `connect()`: a
        transaction, opened only when a cache misses (once per run, resume and budgets)."""
        prof = self.config.profile(row.agent)
        if getattr(prof, "owners", ()) or getattr(row, "source", None) == OTLP:  # (spans: whose, below)
            ok = self._owner_ok.get(row.id)
            if ok is None:
                with connect() as conn:
                    prof = self.profile_of(conn, row)
            elif not ok:
                prof = self.config.defaults
        raised = False
        if row.resumes:
            from watchdog.store.alerts import budget_columns

            key = (row.id, row.resumes, budget_columns(row))
            granted = self._raised.get(key)
            if granted is None:
                with connect() as conn:
                    granted = grant_ok(conn, row, self.sealer)
                if len(self._raised) > _MEMO_MAX:
                    self._raised.clear()
                self._raised[key] = granted
            raised = granted
        return effective(prof, asked(row), raised=raised)

    def owner_ok(self, rid: str) -> bool | None:
        return self._owner_ok.get(rid)

    def owner_lookup(self) -> Callable[[str], bool | None]:
        """`owner_ok` for the pre-filter's pass over every run: the memo's own lookup (a C call,
        not a Python frame per run; the memo is only ever cleared, never replaced, so the lookup
        answers exactly what `owner_ok` would, at the moment it is called)."""
        return self._owner_ok.get

    def not_owner(self, rid: str) -> None:
        """A run its sender may not book under its profile, known from the start (the OTLP
        receiver's anonymous runs): judged by [defaults] from its first tick."""
        if len(self._owner_ok) > _MEMO_MAX:
            self._owner_ok.clear()
        self._owner_ok[rid] = False

    def profile_of(self, conn: Connection, row: RunView) -> Budgets:
        prof = self.config.profile(row.agent)
        owners = getattr(prof, "owners", ())
        otlp = getattr(row, "source", None) == OTLP
        if not owners and not otlp:
            return prof
        ok = self._owner_ok.get(row.id)
        if ok is None:
            # A run the OTLP receiver started is its sender's (sealed); an anonymous sender's
            # never counts toward a named agent's profile, whatever agent its spans claim.
            sent = sender_of(conn, self.sealer, row.id) if otlp else None
            anonymous = sent is not None and sent[1]
            owner = sent[0] if sent is not None else self._owner(conn, row)
            ok = not anonymous and (not owners or (owner is not None and owner in owners))
            if len(self._owner_ok) > _MEMO_MAX:
                self._owner_ok.clear()
                self._owners.clear()
                self._spend_key.clear()
            self._owner_ok[row.id] = ok
            self._owners[row.id] = owner
            self._spend_key[row.id] = row.agent if ok else owner_key(owner)
            if not ok and not anonymous:
                self._alert_owner(conn, row, owner)
        return prof if ok else self.config.defaults

    # -- whose spend (issue 32): a run counts toward its agent's period budgets only if its
    # owner may use that agent; otherwise it is booked under its own owner (whose.owner_key) ------

    @property
    def bound(self) -> frozenset[str]:
        """The agents whose profile names its `owners` (recomputed when the config is reloaded)."""
        if self._bound_for is not self.config:
            self._bound = frozenset(a for a, p in self.config.agents.items() if getattr(p, "owners", ()))
            self._bound_for = self.config
        return self._bound

    def spend_as(self, rid: str, agent: str) -> str | None:
        """The name the run's live spend counts under: its agent's, its own owner's, or None while
        its owner is not checked yet (it is, when the tick judges it: counted from the next tick).
        A name that looks like an owner's booking name is kept apart from it."""
        if agent in self._bound:  # (refreshed by `bound`, which the tick reads before it sums)
            return self._spend_key.get(rid)
        # An open profile: a run judged by [defaults] all the same (an anonymous OTLP sender's,
        # issue 32) is booked under its own sender, never toward the agent it names.
        key = self._spend_key.get(rid) if self._spend_key else None
        if key is not None:
            return key
        if agent.startswith(OWNER_PREFIX):  # not an owner's booking name: its own, apart
            return "(named " + agent[len(OWNER_PREFIX):]
        return agent

    def spend_as_row(self, conn: Connection, rid: str, agent: str, owner: object, source: object = None) -> str:
        """As spend_as, for an ended run (`owner`: its row's column): checked now if need be,
        without the alert (a run ended before it was judged is booked, not judged)."""
        if not isinstance(agent, str):
            return str(agent)
        key = self.spend_as(rid, agent)
        if key is not None:
            return key
        who = self._owner(conn, _Ended(rid, agent, owner, source))
        ok = who is not None and who in getattr(self.config.profile(agent), "owners", ())
        key = agent if ok else owner_key(who)
        if len(self._spend_key) > _MEMO_MAX:
            self._spend_key.clear()
        self._spend_key[rid] = key
        return key

    def check_spend(self, conn: Connection, rows: Iterable[LightRow]) -> None:
        """Before the tick sums the live spend: the owner of every run of a bound agent not
        checked yet (a few per tick: each run once), so its spend counts where it belongs at once.
        `rows`: light rows (watchdog.daemon.trust.lightrow)."""
        bound, known = self.bound, self._spend_key
        if not bound:
            return
        todo = [(rid, agent) for r in rows if (agent := agent_of(r)) in bound and (rid := run_id(r)) not in known]
        if not todo:
            return
        from watchdog.store.run_rows import owners_of

        owners = owners_of(conn, [rid for rid, _a in todo if isinstance(rid, str)])
        for rid, agent in todo:
            if isinstance(rid, str):
                owner, source = owners.get(rid, (None, None))
                self.spend_as_row(conn, rid, agent, owner, source)

    def owner_of(self, conn: Connection, row: Row) -> str | None:
        """The run's owner as the daemon can prove it (None: it cannot)."""
        if row.id in self._owners:
            return self._owners[row.id]
        return self._owner(conn, row)

    def _owner(self, conn: Connection, row: Row) -> str | None:
        if getattr(row, "source", None) == OTLP:  # the receiver's sealed record of its sender
            sent = sender_of(conn, self.sealer, row.id)
            if sent is not None:
                return sent[0]
        owner = getattr(row, "owner", None)  # PostgreSQL: session_user, set by the database (0010)
        if isinstance(owner, str) and owner:
            return owner
        uid = attested_uid(conn, row.id, self.sealer)
        if uid is None:
            return None
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return f"uid {uid}"

    def _alert_owner(self, conn: Connection, row: Row, owner: str | None) -> None:
        said = Outcome.of(Say.OWNER, AlertKind.OWNER.key(row.id), row.id, run_id=row.id,
                          agent=row.agent, owner=owner)
        if announce(conn, said, now=row.last_seen_at, sealer=self.sealer, once=True, audit=Audit(
                Action.PROFILE_REFUSED, self.by, detail={"owner": owner}, outcome="judged by [defaults]")
                ).intervention_id is not None:
            who = f"owner {owner}" if owner else "an owner that cannot be proven"
            log.warning("run %s names the profile of agent %s, which its %s may not use: judged by [defaults]",
                        one_line(row.id, 32), agent_shown(row.agent), who)

    # -- pauses ----------------------------------------------------------------------------

    def mark_pause(self, rid: str, resumes: int | None, at_s: float) -> None:
        self.memory.mark("pause", f"{rid}:{resumes or 0}", repr(at_s))

    def pause_mark(self, rid: str, resumes: int | None) -> float | None:
        """When the daemon paused this run (or confirmed its guard's pause), per resume; None: a claim."""
        v = self.memory.marked("pause", f"{rid}:{resumes or 0}")
        try:
            return float(v) if v is not None else None
        except ValueError:
            return None

    def deny_pause(self, conn: Connection, row: RunView, now: dt.datetime) -> Row:
        """paused -> running (store.pause.deny_pause): the row read again, or None."""
        log.warning("run %s: a pause the daemon did not write or confirm: running again", row.id[:8])
        return deny_pause(conn, row, now=now, by=self.by, agent=row.agent, sealer=self.sealer)

    def confirms_pause(self, row: RunView, snap_totals: object, budgets: Budgets) -> bool:
        """A pause the run's own guard wrote, the daemon confirms: a budget that pauses for this
        profile is at (or over) its limit by the daemon's own counters."""
        reason = row.stop_reason or ""
        budget = ap.BY_REASON.get(reason)
        if budget is None or not ap.pauses(budgets, reason):
            return False
        limit = getattr(budgets, budget.key, None)
        return limit is not None and getattr(snap_totals, budget.measure) >= limit


class _Ended:
    """What _owner reads of a run not judged (ended, or before its first judgement): its id,
    agent, owner column and the witness that created it."""

    __slots__ = ("id", "agent", "owner", "source")

    def __init__(self, rid: str, agent: object, owner: object, source: object) -> None:
        self.id, self.agent, self.owner, self.source = rid, agent, owner, source


def first_sight_budget_s(config: Config, agent: object) -> float:
    """The wall clock a run whose row cannot be read is held to: its profile's, else [defaults]'."""
    prof = config.profile(agent) if isinstance(agent, str) else config.defaults
    if getattr(prof, "owners", ()):  # whose it is cannot be told from an unreadable row
        prof = config.defaults
    wall_s = float(getattr(prof, BY_KEY["max_wall_s"].key))
    return min(wall_s, config.defaults.max_wall_s) if prof is config.defaults else wall_s
