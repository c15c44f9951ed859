"""`Ticker.tick(now)`: one scan of the active runs. The daemon's whole job, drivable from tests.

Cost per tick: O(runs that changed, came due or lost their process + events since the last
tick) between full ticks, O(active runs) on a full one (watchdog.daemon.tick.activeset says when;
watchdog.daemon.tick.tickread reads either way). Stop requests are written before any alert is
delivered, so a slow alert target never delays a stop.

A tick is five steps, each its own method: `_begin` (leadership, the process table, this
tick's ThisTick), the read (tickread.read: one read snapshot: the runs to look at, their new
events, the pre-filter, the money's read), `_money_judge` (prices and period budgets, the leader's),
`_judge_rows` (each due run, in one write batch) and `_end` (late stops, the books, the
duties, forgetting the runs that ended). What the Ticker remembers between ticks is its
TickState (watchdog.daemon.tick.tickstate). A stopping run is watchdog.daemon.stops.stopping's, a
paused one watchdog.daemon.tick.judging's. The tick speaks no SQL: it calls named store verbs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from watchdog.core import lifecycle as lc
from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.budgets import Budgets
from watchdog.core.config import Config
from watchdog.core.interventions import Action
from watchdog.core.messages import RunFacts
from watchdog.core.periods import PeriodState
from watchdog.core.policies import RunSnapshot, Verdict, evaluate, rate_alarm, with_period
from watchdog.core.seal import Sealer
from watchdog.core.text import one_line
from watchdog.daemon.tick import judging, tickread
from watchdog.daemon.stops.acknowledge import EndedStops
from watchdog.daemon.tick.activeset import ActiveSet
from watchdog.daemon.trust.authentic import OwnEvidence
from watchdog.daemon.tick.judging import Batch, act_on_breach, announce_resume, judge_paused
from watchdog.daemon.leases.cluster import ClusterDuties, DutyTick, Membership, Role
from watchdog.daemon.tick.heap import HeapFreezer
from watchdog.daemon.tick.hooktop import HookTops
from watchdog.daemon.tick.toolwatch import ToolWatch
from watchdog.daemon.trust.lightrow import proc_of
from watchdog.daemon.trust.scan import Defect, RATE_WINDOW_S, Scanner
from watchdog.core.procid import ProcessIdentity
from watchdog.daemon.stops.enforcer import Enforcer
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.leases.lease import LeaseLost
from watchdog.daemon.money.money import Money
from watchdog.daemon.otlp import silence
from watchdog.daemon.tick.prefilter import PreFilter
from watchdog.daemon.trust.quarantine import Malformed, Quarantine, check_actionable
from watchdog.daemon.stops.stopping import lose_run
from watchdog.daemon.tick.stopping_runs import judge_stopping
from watchdog.daemon.tick.tickread import TickRead
from watchdog.daemon.tick.tickstate import PeriodStop, ThisTick, TickReport, TickState
from watchdog.store.alerts import Audit, announce, actor
from watchdog.store.engine import Connection, Engine, read_connection, row_locked, store_unavailable

if TYPE_CHECKING:
    from watchdog.daemon.leases.shards import ShardSet
    from watchdog.store.memory import Memory

__all__ = ["Ticker", "TickReport"]

log = logging.getLogger("watchdog.tick")

Row = Any  # a `runs` row as the tick reads it whole (watchdog.store.scan.active_rows)


class Ticker:
    def __init__(self, engine: Engine, config: Config, killer: Killer, *, circuits: Any = None, by: str | None = None,
                 money: bool = True, sealer: Sealer | None = None, membership: Membership | None = None,
                 memory: Memory | None = None, heap: HeapFreezer | None = None):
        self.engine = engine
        self.config = config
        self.killer = killer
        self.circuits = circuits  # watchdog.circuits.CircuitBreakers, optional
        self.by = by or actor()
        # The daemon's key (watchdog.core.seal): seals alerts and SIGTERM targets, verifies
        # attestations. Without one nothing is signalled and no alert is queued.
        self.sealer = sealer
        self.state = TickState()  # what it remembers between ticks (watchdog.daemon.tick.tickstate)
        self.this: ThisTick | None = None  # the tick in progress (or the last one)
        self.scanner = Scanner()
        self.hook_tops = HookTops()  # a hook run's top tool with the errors appended after its calls
        # Prices, the spend ledger, period budgets, drift (watchdog.daemon.money.money); None = run budgets only.
        # A cluster duty: only the leader runs it (see tick).
        self.money = Money(config, self.by, sealer=sealer) if money else None
        # Whose runs this daemon judges and whether it leads (no lease: the store's sole daemon).
        self.membership = membership or Membership(engine, killer.host)
        self.duties = ClusterDuties(engine, config, circuits=circuits, by=self.by, sealer=sealer)
        self.prefilter = PreFilter(config)  # which runs need a full evaluation this tick
        self.quarantine = Quarantine(self.by, sealer)  # rows that cannot be judged, reported once
        # exec'd runs: their trees remembered, and taken down when exec is gone (watchdog.daemon.stops.exectree).
        from watchdog.daemon.stops.exectree import ExecTrees

        self.exec_trees = ExecTrees(engine, killer, by=self.by, sealer=sealer)
        # SQLite: a first signal needs the run's own (MAC'd) evidence (watchdog.daemon.trust.authentic).
        self.own_evidence = OwnEvidence(config, sealer) if engine.dialect.name == "sqlite" else None
        # issue 20: the daemon's own memory (state file) and its evidence rules (watchdog.daemon.trust.trust)
        from watchdog.daemon.trust.trust import Trust
        from watchdog.store.memory import Memory as StateFile

        # The Daemon passes its state file; a bare Ticker (tests, tools) keeps one only in a state_dir
        # it was given, never in this process's default (the system's, as root).
        from watchdog.core.config import resolve_paths

        state_dir = getattr(config.daemon, "state_dir", None)
        self.memory = memory or StateFile.for_daemon(state_dir if state_dir != resolve_paths().state_dir else None,
                                                     engine.url)
        self.trust = Trust(config, self.memory, sealer=sealer, by=self.by)
        self.exec_trees.memory.state = self.memory  # pinned trees outlive a restart
        # The judge -> enforcer seam: the ladder's commands are carried out by this one, keyed in memory.
        self.enforcer = Enforcer(killer, self.memory)
        # PostgreSQL: a first signal needs the run's own evidence too (watchdog.daemon.trust.owned).
        from watchdog.daemon.trust.owned import OwnerEvidence

        self.owner_evidence = OwnerEvidence(config, sealer, self.trust) if self.own_evidence is None else None
        if self.money is not None:
            self.money.whose = self.trust  # whose each run's spend is (issue 32)
        self.ended_stops = EndedStops()  # issue 19: stops heard after their runs ended
        # issue 25: the active runs kept between ticks, so that a tick costs what changed.
        self.active = ActiveSet(killer)
        self.heap = heap  # the daemon's: its heap frozen after a full tick (watchdog.daemon.tick.heap)
        self.shards: ShardSet | None = None  # issue 35: a sharded judge's shards (set by ShardSet.before_tick)
        self.toolwatch: ToolWatch | None = None  # a sharded leader's every-run tool calls (tickread)

    def tick(self, now: dt.datetime, *, skip_clock: bool = False) -> TickReport:
        """`skip_clock`: the clock just jumped (watchdog.daemon.tick.clock): durations measured on it
        (wall_clock, heartbeat_timeout) are not judged this tick."""
        t0 = time.perf_counter()
        this, role = self._begin(now, skip_clock)
        read = tickread.read(self, this, role)
        self.exec_trees.observe(reuse=self.active.local_quiet)  # before any run is judged gone
        rows = self._money_judge(this, read) if this.money is not None else read.rows
        rep = this.rep
        rep.new_events, rep.events, rep.active = len(read.new), read.new, read.mine
        rep.full, rep.looked = read.full, len(read.looked)
        self._judge_rows(this, read.light, rows, read.full)
        self._end(this, role, read)
        # What the next incremental tick needs of this one: the deadlines, the sticky runs.
        self.active.settle(() if read.full else read.looked, wake=read.wake, due=read.due,
                           unreadable=[*rep.quarantined, *rep.locked])
        self.active.ticked(now.timestamp())
        rep.duration_s = time.perf_counter() - t0
        if read.full and self.heap is not None:
            self.heap.after_full_tick()  # after the report's duration: not the tick's own work
        return rep

    # -- the five steps of a tick ----------------------------------------------------------

    def _begin(self, now: dt.datetime, skip_clock: bool) -> tuple[ThisTick, Role]:
        """Leadership and the judged hosts, the process table, the exec trees: this tick's ThisTick."""
        rep = TickReport(at=now)
        role = self.membership.refresh(self.active.host_counts())
        rep.leader, rep.adopted = role.leader, tuple(sorted(role.adopted))
        if role.grew:  # newly adopted hosts: rebuild the caches from their active runs' history too
            self.scanner = Scanner()
        this = ThisTick(now=now, rep=rep, skip_clock=skip_clock, judged=role.hosts, live=self._live_pids())
        # Money (prices, the ledger, period budgets, drift) is a cluster duty: the leader's. It
        # sums the live spend of EVERY host's active runs, so the leader reads them all (and
        # judges only its own and the adopted hosts'); the others read their host's only.
        if role.leader and self.money is not None:
            this.money = self.money.begin(now)
        self.this = this
        return this, role

    def _money_judge(self, this: ThisTick, read: TickRead) -> list[Row]:
        """Price what the SDK could not, judge the period budgets, publish the spent ones; return
        the rows to evaluate: the repriced runs (read again: their cost changed) and those a
        spent budget covers are added to them."""
        assert this.money is not None
        judged = this.money.judge(self.engine, read.light, read.due)
        bf, rep = judged.priced, this.rep
        rep.priced_steps, rep.learned_prices = bf.priced_steps, bf.learned
        rep.unpriced = {m: u.tokens for m, u in bf.unpriced.items()}
        rep.periods = judged.periods
        for r, cost in bf.deltas:  # the daemon's own prices count on its own counters too
            self.scanner.evidence.priced(r.run_id, cost)
        if not judged.again:
            return read.rows
        with self.read_snapshot() as conn:
            fresh = self.scanner.load_rows(conn, sorted(judged.again))
        return [r for r in read.rows if r.id not in judged.again] + fresh

    def _judge_rows(self, this: ThisTick, light: list[Any], rows: list[Row], full: bool = True) -> None:
        """Each due run, then the defects and the backstop: this tick's stop requests, lost runs
        and rate alarms in one commit (rolled back on failure: the next tick finds them again)."""
        if any(r.status == lc.STOPPING for r in rows):  # (incremental: the ActiveSet's count, not a pass)
            this.sharing = Counter(map(proc_of, light)) if full else self.active.by_proc
        batch = Batch(self.engine)
        try:
            for row in judging.order(self.state, rows):
                self._one_isolated(row, this, batch)
            for row in judging.first_missed(self.state, this, rows):
                self._one_isolated(row, this, batch, again=True)
            self._report_defects(this, batch)
            self._backstop(this, batch)
        except BaseException:
            batch.close()  # rolled back: the next tick finds the same runs over budget
            raise
        batch.commit()

    def _end(self, this: ThisTick, role: Role, read: TickRead) -> None:
        """After the stops: stops heard late, forgetting the runs that ended, the books, the
        cluster duties, the lease."""
        now = this.now
        # -- issue 19: stops whose runs ended before this daemon saw them stopping (acknowledge.py);
        # none to hear when no run ended since the last tick (issue 25)
        if not self.active.none_ended or self.ended_stops.backlog:
            self._safely(lambda engine, at: self.ended_stops.run(
                engine, at, hosts=this.judged, config=self.config, sealer=self.sealer, by=self.by), now)
            this.rep.heard += self.ended_stops.heard
        if self.state.holds_runs():  # forget the runs that ended
            self.state.forget(self.active.rows)
        if this.money is not None:
            stopped: dict[str, list[str]] = {}
            for s in this.period_stops:
                stopped.setdefault(s.scope, []).append(s.run_id)
            this.rep.booked = this.money.finish(self.engine, stopped)
        if role.leader:  # the cluster duties: exactly one daemon of the store does them
            # (a sharded leader folded only its Reach's events: the circuits take every run's calls)
            calls, rates = (read.new, self.scanner) if read.calls is None else (read.calls, self.toolwatch)
            self.duties.run(DutyTick(now, role, calls, rates, none_ended=self.active.none_ended))
        else:
            self.duties.follow()
        self._touch_lease(now)

    # -- defects ---------------------------------------------------------------------------

    def _one_isolated(self, row: Row, this: ThisTick, batch: Batch, again: bool = False) -> None:
        """`again`: the tick's second try of a run whose row was locked at its first (first_missed)."""
        if not again and judging.skipped(self, this, row):
            return
        for attempt in range(1 + judging.RETRIES_AFTER_ENDING):
            try:
                self._one(row, this, batch)
                break
            except Exception as exc:  # one bad row must not stop the scan of the others...
                if row_locked(exc):  # a writer holds its row: its step rolled back alone, tried next tick
                    if judging.held(self, this, row, batch, again=again or attempt > 0) \
                            and attempt < judging.RETRIES_AFTER_ENDING:
                        continue  # its holder was ended (and has exited): the step at once, before another takes the row
                    return
                self._failed(row, exc)
                return
        if self.state.locked:
            if row.id in this.rep.locked:  # a retry went through: the run is not left locked this tick
                this.rep.locked.remove(row.id)
            judging.released(self, row)

    def _failed(self, row: Row, exc: Exception) -> None:
        """A run's step failed for another reason than its row lock."""
        if store_unavailable(exc):
            raise exc  # ...but a store that is down or locked fails them all: retry the whole tick
        if not isinstance(exc, Malformed) and row.id not in self.quarantine.logged:  # once: our bug?
            self.quarantine.logged.add(row.id)
            log.exception("run %s: evaluation failed", one_line(row.id, 40), exc_info=exc)
        detail = str(exc) if isinstance(exc, Malformed) else f"its evaluation failed ({type(exc).__name__})"
        self.scanner.defects.append(Defect(row.id, detail))

    def _report_defects(self, this: ThisTick, batch: Batch) -> None:
        """Each row or event the tick could not read or judge, reported once (quarantine.py)."""
        defects, self.scanner.defects = self.scanner.defects, []
        this.rep.quarantined = [d.run_id for d in defects]
        for d in defects:
            if self.quarantine.known(d):
                continue
            try:
                with batch.run() as conn:
                    self.quarantine.report(conn, d, this.now)
            except Exception as exc:  # noqa: BLE001 — reported at a later tick; never at the others' expense
                if store_unavailable(exc):
                    raise
                log.warning("could not report a malformed row (%s): %s", one_line(d.run_id, 40), type(exc).__name__)

    def _safely(self, fn: Callable[[Engine, dt.datetime], object], now: dt.datetime) -> None:
        try:
            fn(self.engine, now)
        except Exception as exc:  # noqa: BLE001 — retried next tick; never at the expense of the stops
            if store_unavailable(exc):
                raise
            log.exception("%s failed; retried next tick", getattr(fn, "__name__", fn))

    # -- one run -------------------------------------------------------------

    def _one(self, row: Row, this: ThisTick, batch: Batch) -> None:
        check_actionable(row)
        now = this.now
        budgets = judging.budgets(self, row, batch)
        st = self.scanner.stats.get(row.id)
        top = self.hook_tops.top(self.engine, row, st.top_tool() if st else None,
                                 sum(st.tool_errors.values()) if st else 0)
        last_error = st.last_error.get(top[0]) if (st and top) else None
        if self.config.store.record_errors == "class":
            last_error = None  # the operator asked for no message text anywhere the daemon writes
        f = self._facts(row, top, last_error, now)
        if silence.end_if_silent(batch, row, budgets, now, self.by,  # span-only runs end by silence
                                 gone=lambda: self.gone(row, this)):
            return
        if row.status == lc.STOPPING:
            judge_stopping(self, this, row, batch, budgets, f)
            return
        self_paused = False
        if row.status == lc.PAUSED and not judging.pause_is_known(self, row, now, budgets):
            # A pause only a store writer claims (issue 20): denied, and the run judged as running.
            again = judging.unclaimed_pause(self, row, now, batch)
            if again is None:
                return
            row, self_paused = again, True
            f = self._facts(row, top, last_error, now)
        elif row.status == lc.PAUSED:
            judge_paused(self, this, row, budgets=budgets, facts=f, batch=batch)
            return
        if row.resumes and (row.id, row.resumes) not in self.state.resume_seen:
            announce_resume(self, row, budgets=budgets, facts=f, now=now, batch=batch)
        if self.gone(row, this):
            self._gone_running(row, this, batch, budgets, f)
            return
        self._judge_running(row, this, batch, budgets, f, self_paused)

    def _gone_running(self, row: Row, this: ThisTick, batch: Batch, budgets: Budgets, f: RunFacts) -> None:
        """A running run whose process is gone: lost, or stopped when exec left its tree behind."""
        if self.exec_trees.left(row):  # exec is gone, not its tree: stopped, the ladder takes it down
            with batch.run() as conn:
                if self.exec_trees.stop_orphaned(conn, row, budgets=budgets, facts=f, now=this.now):
                    self.state.decided.add(row.id)  # the daemon's own decision: its ladder may signal
                    this.rep.stops.append((row.id, lc.PROCESS_GONE))
            return
        with batch.run() as conn:
            if lose_run(conn, row, detail=self.exec_trees.lost_detail(row), now=this.now, by=self.by, budgets=budgets,
                        run_facts=f, sealer=self.sealer):
                this.rep.lost.append(row.id)

    def _judge_running(self, row: Row, this: ThisTick, batch: Batch, budgets: Budgets, f: RunFacts,
                       stop_only: bool) -> None:
        """A running run: stopped (or paused) over a budget, else maybe a rate alarm."""
        now = this.now
        snap = self._snapshot(row, now)
        period = self.closing(row, this)
        judges = self.shards.owns(row.id) if self.shards is not None and self.shards.active else (
            this.judged is None or row.host in this.judged)  # issue 35: a sharded judge judges its shards' runs
        if not judges:
            # Due only because a spent period budget covers it (the leader's duty), or a sharded
            # judge's own host's run another judge judges: that stop alone.
            verdicts = with_period([], period)
        else:
            verdicts = with_period(evaluate(snap, budgets, now, skip_clock=this.skip_clock), period)
        if verdicts:
            if self.money is not None:
                lines = self.money.forecast_lines(row, budgets, now)  # they name the agent: one line each
                f = dataclasses.replace(f, forecast=tuple(one_line(x, 300) for x in lines))
            with batch.run() as conn:  # stop, or pause with on_breach = "pause"
                self.state.decided.add(row.id)  # the daemon's own decision: its ladder may signal for it
                action, v, done = act_on_breach(self, this, conn, row, verdicts, budgets=budgets, facts=f,
                                                stop_only=stop_only)
                if done and action == "stop" and period is not None and v.reason == period.reason:
                    this.period_stops.append(PeriodStop(row.id, v.reason, period.scope.key))
            return
        alarm = rate_alarm(snap, budgets, now) if judges or self.shards is None else None
        if alarm:
            self._alarm(row, alarm, snap, budgets, f, this, batch)

    def closing(self, row: Row, this: ThisTick) -> PeriodState | None:
        """The spent period budget covering the run (the leader's money work), or None."""
        return this.money.closing(row.id, row.agent) if this.money is not None else None

    def _alarm(self, row: Row, alarm: Verdict, snap: RunSnapshot, budgets: Budgets, f: RunFacts, this: ThisTick,
               batch: Batch) -> None:
        # One alarm per run per rate window.
        now = this.now
        last = self.state.rate_alarmed.get(row.id)
        if last and (now - last).total_seconds() < RATE_WINDOW_S:
            return
        self.state.rate_alarmed[row.id] = now
        window = int(now.timestamp() // RATE_WINDOW_S)
        said = Outcome.of(Say.RATE, AlertKind.RATE.key(row.id, window), row.id, f=f, b=budgets,
                          calls_min=snap.calls_last_min, top=snap.top_tool_last_min, stopping=False)
        with batch.run() as conn:
            # once: a daemon before a restart may have alarmed this minute already
            if announce(conn, said, now=now, sealer=self.sealer, once=True, audit=Audit(
                    Action.RATE_ALARM, self.by, tool=snap.top_tool_last_min[0] if snap.top_tool_last_min else None,
                    reason=lc.TOOL_RATE, detail=alarm.detail, outcome="alert only")).queued:
                this.rep.alarms.append(row.id)

    # -- issue 20: what the daemon believes of a row (watchdog.daemon.tick.judging) ---------------

    def _snapshot(self, row: Row, now: dt.datetime) -> RunSnapshot:
        return judging.snapshot(self, row, now)

    def _facts(self, row: Row, top: tuple[str, int, int] | None, last_error: str | None,
               now: dt.datetime) -> RunFacts:
        return judging.run_facts(self, row, top, last_error, now)

    def _backstop(self, this: ThisTick, batch: Batch) -> None:
        from watchdog.daemon.tick.judging import backstop

        backstop(self, this, self.active.rows, batch)

    def read_snapshot(self) -> Connection:
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

    def gone(self, row: Row, this: ThisTick) -> bool:
        """The run's registered process on this host no longer exists (or is another process)."""
        live = this.live
        if live is None or row.host != self.killer.host or not row.pid or row.pid_create_time is None:
            return False
        if row.pid not in live:
            return True
        if (this.now - row.last_seen_at).total_seconds() < 2 * self.config.daemon.tick_s:
            return False  # it wrote moments ago: skip the /proc read (the expensive part at 10k runs)
        ident = ProcessIdentity(row.host, row.pid, row.pid_create_time)
        return not self.killer.alive([ident])

    def _touch_lease(self, now: dt.datetime) -> None:
        try:
            self.membership.touch(now, self.scanner.high_water)
        except LeaseLost:
            raise  # another daemon holds this host now: the daemon must stop
        except Exception:  # noqa: BLE001 — retried next tick; the lease outlives a few missed ones
            log.debug("could not extend the daemon lease", exc_info=True)


if TYPE_CHECKING:
    from watchdog.daemon.context import TickContext

    def _is_a_tick_context(tk: Ticker) -> TickContext:
        return tk  # mypy: the Ticker is what its tick's parts are handed (watchdog.daemon.context)
