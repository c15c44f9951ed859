"""`Ticker.tick(now)`: one scan of the active runs. The daemon's whole job, drivable from tests.

Cost per tick: O(active runs + events since the last tick). Stop requests are
written before any alert is delivered, so a slow alert target never delays a stop.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import and_, select

from watchdog.core import lifecycle as lc
from watchdog.daemon.stopping import lose_run, stop_plan
from watchdog.store.alerts import enqueue_alert, queued
from watchdog.store.interventions import actor, record
from watchdog.core.config import Config
from watchdog.daemon.acknowledge import EndedStops
from watchdog.daemon.backfill import BackfillReport
from watchdog.daemon.batch import Batch
from watchdog.daemon.pause import act_on_breach, announce_resume, judge_paused
from watchdog.daemon.authentic import OwnEvidence
from watchdog.daemon.killer import Killer, ProcessIdentity
from watchdog.daemon.ladder import WAITING_STAGES, advance, exited
from watchdog.daemon.money import Money
from watchdog.daemon.otlp import silence
from watchdog.daemon.ladder import due as ladder_due
from watchdog.core.text import one_line
from watchdog.core.messages import ACK_MARK, rate_alert, requested_stop_alert
from watchdog.core.policies import evaluate, rate_alarm, with_period
from watchdog.daemon import believe, ownstage
from watchdog.daemon.cluster import ClusterDuties, DutyTick, Membership
from watchdog.daemon.lease import LeaseLost
from watchdog.daemon.quarantine import Malformed, Quarantine, check_actionable
from watchdog.daemon.isolation import Defect
from watchdog.daemon.prefilter import PreFilter
from watchdog.daemon.scan import L, RATE_WINDOW_S, Scanner
from watchdog.store.engine import read_connection, store_unavailable
from watchdog.store.schema import alerts, interventions

log = logging.getLogger("watchdog.tick")


@dataclass
class TickReport:
    at: dt.datetime
    active: int = 0
    stopping: int = 0
    new_events: int = 0
    stops: list = field(default_factory=list)  # (run id, reason)
    pauses: list = field(default_factory=list)  # (run id, reason): on_breach = "pause"
    paused: int = 0  # runs waiting for a human
    lost: list = field(default_factory=list)
    alarms: list = field(default_factory=list)
    events: list = field(default_factory=list)  # the tool events folded this tick
    duration_s: float = 0.0
    priced_steps: int = 0  # steps the SDK could not price that the daemon priced this tick
    learned_prices: list = field(default_factory=list)  # models added to the published price table
    unpriced: dict = field(default_factory=dict)  # model -> tokens no table prices (first seen this tick)
    booked: int = 0  # ended runs booked into the spend ledger
    periods: list = field(default_factory=list)  # every period budget's state (watchdog.core.periods)
    leader: bool = True  # this daemon did the cluster duties this tick
    adopted: tuple = ()  # hosts without a live daemon whose runs it judged too
    quarantined: list = field(default_factory=list)  # run ids (None: an event of no run) not judged this tick


class Ticker:
    def __init__(self, engine, config: Config, killer: Killer, *, circuits=None, by: str | None = None,
                 money: bool = True, sealer=None, membership: Membership | None = None, memory=None):
        self.engine = engine
        self.config = config
        self.killer = killer
        self.circuits = circuits  # watchdog.circuits.CircuitBreakers, optional
        self.by = by or actor()
        # The daemon's key (watchdog.core.seal): seals alerts and SIGTERM targets, verifies
        # attestations. Without one nothing is signalled and no alert is queued.
        self.sealer = sealer
        self._acked: set[str] = set()  # stopping runs whose stop this daemon recorded or acknowledged
        self._decided: set[str] = set()  # runs whose stop this daemon decided itself (they may be signalled)
        self.scanner = Scanner()
        # Prices, the spend ledger, period budgets, drift (watchdog.daemon.money); None = run budgets only.
        # A cluster duty: only the leader runs it (see tick).
        self.money = Money(config, self.by, sealer=sealer) if money else None
        # Whose runs this daemon judges and whether it leads (no lease: the store's sole daemon).
        self.membership = membership or Membership(engine, killer.host)
        self.duties = ClusterDuties(engine, config, circuits=circuits, by=self.by, sealer=sealer)
        self._judged: frozenset | None = None  # this tick's hosts (None: every host)
        self._rate_alarmed: dict[str, dt.datetime] = {}
        self.prefilter = PreFilter(config)  # which runs need a full evaluation this tick
        self._pause_seen: set[str] = set()  # pause alert keys known to be queued (watchdog.daemon.pause)
        self._resume_seen: set[tuple] = set()  # (run id, resumes) whose resume alert is queued
        self.quarantine = Quarantine(self.by, sealer)  # rows that cannot be judged, reported once
        self._skip_clock = False  # this tick's (see tick)
        # exec'd runs: their trees remembered, and taken down when exec is gone (watchdog.daemon.exectree).
        from watchdog.daemon.exectree import ExecTrees

        self.exec_trees = ExecTrees(self)
        # SQLite: a first signal needs the run's own (MAC'd) evidence (watchdog.daemon.authentic).
        self.own_evidence = OwnEvidence(config, sealer) if engine.dialect.name == "sqlite" else None
        # issue 20: the daemon's own memory (state file) and its evidence rules (watchdog.daemon.trust)
        from watchdog.daemon.trust import Trust
        from watchdog.store.memory import Memory

        # The Daemon passes its state file; a bare Ticker (tests, tools) keeps one only in a state_dir
        # it was given, never in this process's default (the system's, as root).
        from watchdog.core.config import resolve_paths

        state_dir = getattr(config.daemon, "state_dir", None)
        self.memory = memory or Memory.for_daemon(state_dir if state_dir != resolve_paths().state_dir else None,
                                                  engine.url)
        self.trust = Trust(config, self.memory, sealer=sealer, by=self.by)
        self._backstopped: set[str] = set()  # quarantined runs stopped or ended by the backstop
        self.ended_stops = EndedStops()  # issue 19: stops heard after their runs ended

    def tick(self, now: dt.datetime, *, skip_clock: bool = False) -> TickReport:
        """`skip_clock`: the clock just jumped (watchdog.daemon.clock): durations measured on it
        (wall_clock, heartbeat_timeout) are not judged this tick."""
        t0 = time.perf_counter()
        self._skip_clock = skip_clock
        rep = TickReport(at=now)
        self._period_stops: list = []
        role = self.membership.refresh()
        rep.leader, rep.adopted = role.leader, tuple(sorted(role.adopted))
        if role.grew:  # newly adopted hosts: rebuild the caches from their active runs' history too
            self.scanner = Scanner()
        self._judged = role.hosts
        live = self._live_pids()
        self.exec_trees.observe()
        # Money (prices, the ledger, period budgets, drift) is a cluster duty: the leader's. It
        # sums the live spend of EVERY host's active runs, so the leader reads them all (and
        # judges only its own and the adopted hosts'); the others read their host's only.
        money = self.money if role.leader else None
        with self._read_snapshot() as conn:
            light = self.scanner.load_active(conn, None if money is not None else role.hosts)
            i_host = L["host"]
            mine = light if money is None else [r for r in light if r[i_host] in role.hosts]
            # The leader reads every host's tool events (circuits, the all-runs rate); the others their own.
            new = self.scanner.fold(conn, [r[L["id"]] for r in mine], hosts=None if role.leader else role.hosts)
            spend = money.live_spend() if money is not None else None
            due = self.prefilter.due(light, now, live, spend, stats=self.scanner.stats, host=self.killer.host,
                                     judged=self._judged, resume_seen=self._resume_seen,
                                     skip_clock=self._skip_clock, defects=self.scanner.defects,
                                     evidence=self.scanner.evidence.tallies, first=self.trust.first,
                                     new_seen=self.trust.new_seen, raised=self.trust.raised_key,
                                     owner_ok=self.trust.owner_ok)
            if money is not None:
                money.read(conn, now, self.scanner.high_water)
                self.scanner.defects.extend(money.backfill.defects)  # unreadable steps: reported with the rest
                money.backfill.defects.clear()
                money.learn_labels(conn, spend)
            # Only the runs that may need something this tick are read whole and evaluated.
            rows = self.scanner.load_rows(conn, due)
            self.trust.flush({r[L["id"]] for r in light})  # first sights and parent links (issue 20)
        if money is not None:
            rows = self._money_before(money, light, due, rows, spend, now, rep)
        rep.new_events = len(new)
        rep.events = new
        rep.active = len(mine)
        sharing = Counter((r[L["host"]], r[L["pid"]]) for r in light) if any(r.status == lc.STOPPING for r in rows) else {}
        batch = Batch(self.engine)
        try:
            for row in rows:
                try:
                    self._one(row, now, rep, live, sharing, batch)
                except Exception as exc:  # one bad row must not stop the scan of the others...
                    if store_unavailable(exc):
                        raise  # ...but a store that is down or locked fails them all: retry the whole tick
                    if not isinstance(exc, Malformed) and row.id not in self.quarantine.logged:  # once: our bug?
                        self.quarantine.logged.add(row.id)
                        log.exception("run %s: evaluation failed", one_line(row.id, 40))
                    detail = str(exc) if isinstance(exc, Malformed) else f"its evaluation failed ({type(exc).__name__})"
                    self.scanner.defects.append(Defect(row.id, detail))
            self._report_defects(now, rep, batch)
            self._backstop(light, now, live, rep, batch)
        except BaseException:
            batch.close()  # rolled back: the next tick finds the same runs over budget
            raise
        batch.commit()  # this tick's stop requests, lost runs and rate alarms: one commit
        # -- issue 19: stops whose runs ended before this daemon saw them stopping (acknowledge.py)
        self._safely(lambda engine, at: self.ended_stops.run(engine, at, hosts=self._judged, config=self.config,
                                                             sealer=self.sealer, by=self.by), now)
        if self._acked or self._decided or self._rate_alarmed:  # forget the runs that ended
            active = {r[L["id"]] for r in light}
            self._acked &= active
            self._decided &= active
            for rid in [k for k in self._rate_alarmed if k not in active]:
                del self._rate_alarmed[rid]
        if money is not None:
            self._money_after(money, now, rep)
        if role.leader:  # the cluster duties: exactly one daemon of the store does them
            self.duties.run(DutyTick(now, role, new, self.scanner))
        self._touch_lease(now)
        rep.duration_s = time.perf_counter() - t0
        return rep

    def _report_defects(self, now, rep, batch) -> None:
        """Each row or event the tick could not read or judge, reported once (quarantine.py)."""
        defects, self.scanner.defects = self.scanner.defects, []
        rep.quarantined = [d.run_id for d in defects]
        for d in defects:
            if self.quarantine.known(d):
                continue
            try:
                with batch.run() as conn:
                    self.quarantine.report(conn, d, now)
            except Exception as exc:  # noqa: BLE001 — reported at a later tick; never at the others' expense
                if store_unavailable(exc):
                    raise
                log.warning("could not report a malformed row (%s): %s", one_line(d.run_id, 40), type(exc).__name__)

    def _money_before(self, money, light, due, rows, spend, now, rep) -> list:
        """Price what the SDK could not, judge the period budgets, publish the spent ones; return
        the rows to evaluate: the repriced runs (read again: their cost changed) and those a
        spent budget covers are added to them."""
        try:
            bf = money.price(self.engine, now)
        except Exception as exc:  # noqa: BLE001 — pricing is retried next tick; never at the stops' expense
            if store_unavailable(exc):
                raise
            log.exception("pricing the unpriced steps failed; retried next tick")
            bf = BackfillReport()
        rep.priced_steps, rep.learned_prices = bf.priced_steps, bf.learned
        rep.unpriced = {m: u.tokens for m, u in bf.unpriced.items()}
        rep.periods = money.judge(spend, now)
        for r, cost in bf.deltas:  # the daemon's own prices count on its own counters too
            self.scanner.evidence.priced(r.run_id, cost)
        again = {r.run_id for r, _cost in bf.deltas if r.status in lc.ACTIVE_STATUSES}
        if money.closed:  # the running runs a spent period budget covers are due too
            again.update(set(PreFilter.closing(light, due, money)) - set(due))
        if again:
            with self._read_snapshot() as conn:
                fresh = self.scanner.load_rows(conn, sorted(again))
            rows = [r for r in rows if r.id not in again] + fresh
        self._safely(money.publish_closed, now)  # before the stops: see Money.publish_closed
        return rows

    def _safely(self, fn, now):
        try:
            fn(self.engine, now)
        except Exception as exc:  # noqa: BLE001 — retried next tick; never at the expense of the stops
            if store_unavailable(exc):
                raise
            log.exception("%s failed; retried next tick", getattr(fn, "__name__", fn))

    def _money_after(self, money, now, rep):
        """Book the ended runs, then the alerts and the published state: after the stops, and
        never at their expense (a failure here is logged; the next tick does it again)."""
        try:
            rep.booked = money.book(self.engine, now)
        except Exception as exc:  # noqa: BLE001
            if store_unavailable(exc):
                raise
            log.exception("booking ended runs failed; retried next tick")
        stopped: dict[str, list[str]] = {}
        for rid, reason, scope in self._period_stops:
            stopped.setdefault(scope, []).append(rid)
        try:
            money.after(self.engine, now, stopped)
        except Exception as exc:  # noqa: BLE001
            if store_unavailable(exc):
                raise
            log.exception("period budgets / drift / unpriced alerts failed this tick")

    # -- one run -------------------------------------------------------------

    def _one(self, row, now, rep, live, sharing, batch):
        check_actionable(row)
        budgets = believe.budgets(self, row, batch)
        st = self.scanner.stats.get(row.id)
        top = st.top_tool() if st else None
        last_error = st.last_error.get(top[0]) if (st and top) else None
        if self.config.store.record_errors == "class":
            last_error = None  # the operator asked for no message text anywhere the daemon writes
        f = self._facts(row, top, last_error, now)
        if silence.end_if_silent(batch, row, budgets, now, self.by,  # span-only runs end by silence
                                 gone=lambda: self._gone(row, live, now)):
            return
        self_paused = False
        if row.status == lc.STOPPING:
            rep.stopping += 1
            own = ownstage.own_stage(self.memory, row.id)
            if ownstage.differs(row, own):  # the ladder goes by the daemon's record (issue 20)
                batch.commit()
                with self.engine.begin() as conn:
                    row = ownstage.restore(conn, row, own)
            if row.id not in self._acked:
                self._acknowledge(row, f, budgets, now, batch)
            gone = (row.signal_stage in (None, *WAITING_STAGES) and self._gone(row, live, now)
                    and not self.exec_trees.left(row))
            if not gone and not ladder_due(row, now, self.config.daemon, self.killer.host):
                return  # nothing to do yet: no transaction (on SQLite, no write lock)
            batch.commit()  # first: on SQLite the batch holds the write lock this transaction needs
            with self.engine.begin() as conn:  # its own transaction: it may signal a process
                if gone:
                    # It ended without saying so: after the cooperative stop (no need to wait for the
                    # grace), or after a signal that was refused / not allowed / did not work.
                    exited(conn, row, now=now, by=self.by, facts=f, budgets=budgets, sealer=self.sealer)
                    return
                advance(conn, row, killer=self.killer, daemon=self.config.daemon, budgets=budgets, facts=f,
                        now=now, by=self.by, sharing=sharing[(row.host, row.pid)] - 1, sealer=self.sealer,
                        confirmed=lambda: self._confirms(conn, row, budgets, now),
                        remembered=self.exec_trees.remembered(row.id),
                        own_evidence=None if self.own_evidence is None else lambda: self.own_evidence.justifies(
                            conn, row, now, skip_clock=self._skip_clock))
                ownstage.remember(conn, self.memory, row, row.signal_stage)
            return
        if row.status == lc.PAUSED and not believe.pause_is_known(self, row, now, budgets):
            # A pause only a store writer claims (issue 20): denied, and the run judged as running.
            again = believe.unclaimed_pause(self, row, now, batch)
            if again is None:
                return
            row, self_paused = again, True
            f = self._facts(row, top, last_error, now)
        elif row.status == lc.PAUSED:
            if len(self._pause_seen) > 10_000:
                self._pause_seen.clear()
                self._resume_seen.clear()
            judge_paused(self, row, budgets=budgets, facts=f, now=now, rep=rep, live=live, batch=batch)
            return
        if row.resumes and (row.id, row.resumes) not in self._resume_seen:
            announce_resume(self, row, budgets=budgets, facts=f, now=now, batch=batch)
        if self._gone(row, live, now):
            if self.exec_trees.left(row):  # exec is gone, not its tree: stopped, the ladder takes it down
                with batch.run() as conn:
                    self.exec_trees.stop_orphaned(conn, row, budgets=budgets, facts=f, now=now, rep=rep)
                return
            with batch.run() as conn:
                if lose_run(conn, row, detail=f"process {row.pid} on {row.host} is gone without ending the run",
                             now=now, by=self.by, budgets=budgets, run_facts=f, sealer=self.sealer):
                    rep.lost.append(row.id)
            return
        snap = self._snapshot(row, now)
        period = self.money.closing(row.id, row.agent) if self.money is not None else None
        if self._judged is not None and row.host not in self._judged:
            # Due only because a spent period budget covers it (the leader's duty): that stop
            # alone; its own host's daemon judges everything else about it.
            verdicts = with_period([], period)
        else:
            verdicts = with_period(evaluate(snap, budgets, now, skip_clock=self._skip_clock), period)
        if verdicts:
            if self.money is not None:
                lines = self.money.forecast_lines(row, budgets, now)  # they name the agent: one line each
                f = dataclasses.replace(f, forecast=tuple(one_line(x, 300) for x in lines))
            with batch.run() as conn:  # stop, or pause with on_breach = "pause"
                self._decided.add(row.id)  # the daemon's own decision: its ladder may signal for it
                action, v, done = act_on_breach(self, conn, row, verdicts, budgets=budgets, facts=f, now=now,
                                                rep=rep, stop_only=self_paused)
                if done and action == "stop" and period is not None and v.reason == period.reason:
                    self._period_stops.append((row.id, v.reason, period.scope.key))
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
                             intervention_id=iid, sealer=self.sealer):
                rep.alarms.append(row.id)

    def _confirms(self, conn, row, budgets, now) -> bool:
        """Before the first signal: did this daemon decide the stop, or do its own budgets say
        the run is over one now? A stop only written into the store (any store writer can
        write one for any run) never leads to a signal by itself."""
        if row.id in self._decided or self._sealed_stop(conn, row):
            return True
        period = self.money.closing(row.id, row.agent) if self.money is not None else None
        return bool(with_period(evaluate(self._snapshot(row, now), budgets, now,
                                         skip_clock=self._skip_clock), period))

    def _sealed_stop(self, conn, row) -> bool:
        """The stop's alert was sealed with this daemon's key by someone who is not acknowledging
        a store request: this daemon in an earlier life, or an operator running `kill` as the
        daemon's user. Only the key's holders can write such a row."""
        if self.sealer is None:
            return False
        # On the caller's connection: a second one would wait for the write lock the caller holds.
        a = conn.execute(select(alerts.c.dedupe_key, alerts.c.title, alerts.c.body, alerts.c.mac, alerts.c.created_at)
                         .where(alerts.c.dedupe_key == f"stop:{row.id}")).first()
        if a is None or not isinstance(a.body, str) or ACK_MARK in a.body:
            return False
        return self.sealer.alert_ok(a.mac, a.dedupe_key, a.title, a.body, a.created_at)

    def _acknowledge(self, row, f, budgets, now, batch):
        """A stopping run whose stop this daemon did not request (the run's guard, the CLI,
        any store writer): record it if nobody did and alert it, worded by the daemon from
        the store's numbers. Once per run: remembered, and its alert key is unique."""
        with batch.run() as conn:
            if not queued(conn, f"stop:{row.id}"):
                reason = row.stop_reason if row.stop_reason in lc.STOP_REASONS else "unknown"
                iid = conn.execute(select(interventions.c.id).where(and_(
                    interventions.c.run_id == row.id, interventions.c.action == "stop_requested"))).scalar()
                if iid is None:
                    iid = record(conn, at=now, action="stop_requested", by=self.by, run_id=row.id, reason=reason,
                                 outcome="stop requested in the store, not by this daemon; acknowledged")
                plan = stop_plan(row.kill_mode)
                title, body = requested_stop_alert(f, budgets, reason, plan)
                enqueue_alert(conn, f"stop:{row.id}", title, body, now=now, run_id=row.id, intervention_id=iid,
                              sealer=self.sealer)
                log.warning("stop requested in the store: %s run %s — %s", row.agent, row.id[:8], reason)
        self._acked.add(row.id)

    # -- issue 20: what the daemon believes of a row (watchdog.daemon.believe) ---------------

    def _snapshot(self, row, now):
        return believe.snapshot(self, row, now)

    def _facts(self, row, top, last_error, now):
        return believe.run_facts(self, row, top, last_error, now)

    def _backstop(self, light, now, live, rep, batch) -> None:
        from watchdog.daemon.backstop import backstop

        backstop(self, light, now, live, rep, batch)

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
