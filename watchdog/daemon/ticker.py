"""`Ticker.tick(now)`: one scan of the active runs. The daemon's whole job, drivable from tests.

Cost per tick: O(active runs + events since the last tick). Stop requests are
written before any alert is delivered, so a slow alert target never delays a stop.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from watchdog.core import lifecycle as lc
from watchdog.store.actions import actor, enqueue_alert, facts, mark_lost, queued, record, request_stop
from watchdog.core.budgets import BUDGETS, RUN_BUDGET_KEYS, Budgets, effective_budgets
from watchdog.core.config import Config
from watchdog.daemon.killer import Killer, ProcessIdentity
from watchdog.daemon.ladder import WAITING_STAGES, advance, exited
from watchdog.daemon.ladder import due as ladder_due
from watchdog.core.messages import rate_alert
from watchdog.core.policies import evaluate, rate_alarm
from watchdog.daemon.cluster import ClusterDuties, DutyTick, Membership
from watchdog.daemon.lease import LeaseLost
from watchdog.daemon.scan import L, MEASURES, OWN_BUDGETS, RATE_WINDOW_S, Scanner
from watchdog.store.engine import read_connection

log = logging.getLogger("watchdog.tick")
# The pre-filter's clock checks fire this much early: the database's epoch seconds are
# floats, the policies compare datetimes; early only costs one full evaluation.
SLACK_S = 1.0


class _Batch:
    """The tick's writes for running runs (stop requests, lost runs, rate alarms) in ONE
    transaction, opened at the first write, with a SAVEPOINT per run so a failing run rolls
    back only its own rows: one commit per tick instead of one per run."""

    def __init__(self, engine):
        self.engine = engine
        self.conn = None
        self.tx = None

    @contextmanager
    def run(self):
        if self.conn is None:
            self.conn = self.engine.connect()
            self.tx = self.conn.begin()
        sp = self.conn.begin_nested()
        try:
            yield self.conn
        except BaseException:
            sp.rollback()
            raise
        sp.commit()

    def commit(self):
        if self.conn is None:
            return
        try:
            self.tx.commit()
        finally:
            self.close()

    def close(self):
        """Without a commit: what is pending is rolled back."""
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = self.tx = None


def store_unavailable(exc: BaseException) -> bool:
    """The store is down, unreachable or locked (as opposed to one row being bad)."""
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeoutError)):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


@dataclass
class TickReport:
    at: dt.datetime
    active: int = 0
    stopping: int = 0
    new_events: int = 0
    stops: list = field(default_factory=list)  # (run id, reason)
    lost: list = field(default_factory=list)
    alarms: list = field(default_factory=list)
    events: list = field(default_factory=list)  # the tool events folded this tick
    duration_s: float = 0.0
    leader: bool = True  # this daemon did the cluster duties this tick
    adopted: tuple = ()  # hosts without a live daemon whose runs it judged too


class Ticker:
    def __init__(self, engine, config: Config, killer: Killer, *, circuits=None, by: str | None = None,
                 membership: Membership | None = None):
        self.engine = engine
        self.config = config
        self.killer = killer
        self.circuits = circuits  # watchdog.circuits.CircuitBreakers, optional
        self.by = by or actor()
        self.scanner = Scanner()
        # Whose runs this daemon judges and whether it leads (no lease: the store's sole daemon).
        self.membership = membership or Membership(engine, killer.host)
        self.duties = ClusterDuties(engine, config, circuits=circuits, by=self.by)
        self._rate_alarmed: dict[str, dt.datetime] = {}
        self._budget_memo: dict[tuple, tuple] = {}

    def tick(self, now: dt.datetime) -> TickReport:
        t0 = time.perf_counter()
        rep = TickReport(at=now)
        role = self.membership.refresh()
        rep.leader, rep.adopted = role.leader, tuple(sorted(role.adopted))
        if role.grew:  # newly adopted hosts: rebuild the caches from their active runs' history too
            self.scanner = Scanner()
        live = self._live_pids()
        with self._read_snapshot() as conn:
            light = self.scanner.load_active(conn, role.hosts)
            # The leader reads every host's tool events (circuits, the all-runs rate); the others their own.
            new = self.scanner.fold(conn, [r[L["id"]] for r in light], hosts=None if role.leader else role.hosts)
            # Only the runs that may need something this tick are read whole and evaluated.
            rows = self.scanner.load_rows(conn, self._due(light, now, live))
        rep.new_events = len(new)
        rep.events = new
        rep.active = len(light)
        sharing = Counter((r[L["host"]], r[L["pid"]]) for r in light) if any(r.status == lc.STOPPING for r in rows) else {}
        batch = _Batch(self.engine)
        try:
            for row in rows:
                try:
                    self._one(row, now, rep, live, sharing, batch)
                except Exception as exc:  # one bad row must not stop the scan of the others...
                    if store_unavailable(exc):
                        raise  # ...but a store that is down or locked fails them all: retry the whole tick
                    log.exception("run %s: evaluation failed; skipped this tick", row.id)
        except BaseException:
            batch.close()  # rolled back: the next tick finds the same runs over budget
            raise
        batch.commit()  # this tick's stop requests, lost runs and rate alarms: one commit
        if role.leader:  # the cluster duties: exactly one daemon of the store does them
            self.duties.run(DutyTick(now, role, new, self.scanner))
        self._touch_lease(now)
        rep.duration_s = time.perf_counter() - t0
        return rep

    # -- which runs need a full evaluation ---------------------------------------

    def _budgets_of(self, r) -> Budgets:
        """The effective budgets of a light row, memoised: few distinct (agent, own budgets) exist."""
        return self._limits_of(r)[0]

    def _limits_of(self, r) -> tuple:
        """(budgets, [(light index, limit) of each counter budget], age limit, silence limit,
        identical-calls limit, rate limit), memoised per (agent, own budgets)."""
        key = (r[L["agent"]], *r[OWN_BUDGETS])
        memo = self._budget_memo.get(key)
        if memo is None:
            b = effective_budgets(self.config.profile(key[0]), dict(zip(RUN_BUDGET_KEYS, key[1:])))
            counters = [(L[x.measure], getattr(b, x.key)) for x in BUDGETS if x.measure in MEASURES]
            limit = {x.measure: getattr(b, x.key) for x in BUDGETS}
            memo = (b, counters, limit["age_s"] - SLACK_S, limit["silent_s"] - SLACK_S, limit["identical_calls"],
                    limit["calls_last_min"])
            if len(self._budget_memo) > 10_000:
                self._budget_memo.clear()
            self._budget_memo[key] = memo
        return memo

    def _due(self, light, now, live) -> list[str]:
        """Ids of the runs `_one` might act on: a superset of them, never fewer.

        A healthy running run is skipped without building a row, a snapshot or facts:
        the checks below are the budgets' own comparisons (the clock ones SLACK_S early)
        and `_gone`'s conditions. The policies still decide, on the whole row.
        """
        now_s = now.timestamp()
        horizon = now - dt.timedelta(seconds=RATE_WINDOW_S)
        stats = self.scanner.stats
        recheck_s = 2 * self.config.daemon.tick_s - SLACK_S
        my_host = self.killer.host
        i_id, i_status, i_host, i_pid, i_ctime = L["id"], L["status"], L["host"], L["pid"], L["pid_create_time"]
        i_started, i_seen = L["started_s"], L["seen_s"]
        due = []
        for r in light:
            rid = r[i_id]
            if r[i_status] != lc.RUNNING:
                due.append(rid)
                continue
            _b, counters, age_limit, silence_limit, identical_limit, rate_limit = self._limits_of(r)
            seen_s = r[i_seen]
            over = now_s - r[i_started] > age_limit or now_s - seen_s > silence_limit
            for i, limit in counters:  # a plain loop: any(generator) costs twice as much per run
                if over or r[i] > limit:
                    over = True
                    break
            if over:
                due.append(rid)
                continue
            st = stats.get(rid)
            if st is not None and (st.max_signature >= identical_limit
                                   or st.recent_upper_bound(horizon) > rate_limit):
                due.append(rid)
                continue
            host, pid, ctime = r[i_host], r[i_pid], r[i_ctime]
            if (live is not None and host == my_host and pid and ctime is not None
                    and (pid not in live or now_s - seen_s >= recheck_s)):
                due.append(rid)
        return due

    # -- one run -------------------------------------------------------------

    def _one(self, row, now, rep, live, sharing, batch):
        budgets = effective_budgets(self.config.profile(row.agent), row)
        st = self.scanner.stats.get(row.id)
        top = st.top_tool() if st else None
        f = facts(row, top, st.last_error.get(top[0]) if (st and top) else None, now)
        if row.status == lc.STOPPING:
            rep.stopping += 1
            gone = row.signal_stage in (None, *WAITING_STAGES) and self._gone(row, live, now)
            if not gone and not ladder_due(row, now, self.config.daemon, self.killer.host):
                return  # nothing to do yet: no transaction (on SQLite, no write lock)
            batch.commit()  # first: on SQLite the batch holds the write lock this transaction needs
            with self.engine.begin() as conn:  # its own transaction: it may signal a process
                if gone:
                    # It ended without saying so: after the cooperative stop (no need to wait for the
                    # grace), or after a signal that was refused / not allowed / did not work.
                    exited(conn, row, now=now, by=self.by, facts=f, budgets=budgets)
                    return
                advance(conn, row, killer=self.killer, daemon=self.config.daemon, budgets=budgets, facts=f,
                        now=now, by=self.by, sharing=sharing[(row.host, row.pid)] - 1)
            return
        if self._gone(row, live, now):
            with batch.run() as conn:
                if mark_lost(conn, row, detail=f"process {row.pid} on {row.host} is gone without ending the run",
                             now=now, by=self.by, budgets=budgets, run_facts=f):
                    rep.lost.append(row.id)
            return
        snap = self.scanner.snapshot(row, now)
        verdicts = evaluate(snap, budgets, now)
        if verdicts:
            v = verdicts[0]
            with batch.run() as conn:
                if request_stop(conn, row, reason=v.reason, detail=v.detail, now=now, by=self.by, budgets=budgets,
                                run_facts=f):
                    rep.stops.append((row.id, v.reason))
                    log.warning("stop requested: %s run %s — %s (%s)", row.agent, row.id[:8], v.reason, v.detail)
            return
        alarm = rate_alarm(snap, budgets, now)
        if alarm:
            self._alarm(row, alarm, snap, budgets, f, now, rep, batch)

    def _alarm(self, row, alarm, snap, budgets, f, now, rep, batch):
        # One alarm per run per rate window.
        last = self._rate_alarmed.get(row.id)
        if last and (now - last).total_seconds() < RATE_WINDOW_S:
            return
        self._rate_alarmed[row.id] = now
        window = int(now.timestamp() // RATE_WINDOW_S)
        title, body = rate_alert(f, budgets, snap.calls_last_min, snap.top_tool_last_min, stopping=False)
        with batch.run() as conn:
            if queued(conn, f"rate:{row.id}:{window}"):
                return  # a daemon before a restart already alarmed this minute
            iid = record(conn, at=now, action="rate_alarm", by=self.by, run_id=row.id,
                         tool=snap.top_tool_last_min[0] if snap.top_tool_last_min else None,
                         reason=lc.TOOL_RATE, detail=alarm.detail, outcome="alert only")
            if enqueue_alert(conn, f"rate:{row.id}:{window}", title, body, now=now, run_id=row.id,
                             intervention_id=iid):
                rep.alarms.append(row.id)

    def _read_snapshot(self):
        """One snapshot for the active runs and their new events: a run started between the
        two reads must not have its first events folded (and marked seen) while not yet active."""
        return read_connection(self.engine)

    # -- processes -------------------------------------------------------------

    def _live_pids(self) -> set[int] | None:
        try:
            import psutil

            return set(psutil.pids())
        except Exception:  # noqa: BLE001 — no process table: never call a run lost for it
            return None

    def _gone(self, row, live, now) -> bool:
        """The run's registered process on this host no longer exists (or is another process)."""
        if live is None or row.host != self.killer.host or not row.pid or row.pid_create_time is None:
            return False
        if row.pid not in live:
            return True
        if (now - row.last_seen_at).total_seconds() < 2 * self.config.daemon.tick_s:
            return False  # it wrote moments ago: skip the /proc read (the expensive part at 10k runs)
        ident = ProcessIdentity(row.host, row.pid, row.pid_create_time)
        return not self.killer.alive([ident])

    def _touch_lease(self, now):
        try:
            self.membership.touch(now, self.scanner.high_water)
        except LeaseLost:
            raise  # another daemon holds this host now: the daemon must stop
        except Exception:  # noqa: BLE001 — retried next tick; the lease outlives a few missed ones
            log.debug("could not extend the daemon lease", exc_info=True)
