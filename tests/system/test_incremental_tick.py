"""The tick that costs what changed (issue 25), against real stores and real processes.

Between full ticks the Ticker looks only at the runs that changed, came due or lost their
process (watchdog.daemon.tick.activeset). These tests hold it to the promise that this changes
nothing a user can see: a run that writes nothing is still stopped on time, a dead process is
still found, a row that cannot be read is still watched, the period budgets still count every
run; and that an idle tick really looks at no run.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert, text, update

from daemon_support import config, later, run_row, ticker
from failsafe_support import constraints_off
from watchdog.core import lifecycle as lc
from watchdog.daemon.tick import activeset
from watchdog.daemon.stops.killer import Killer
from watchdog.store.schema import runs, utcnow


def _sql_run(engine, *, agent="bot", host=None, **values) -> str:
    rid = uuid.uuid4().hex
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(insert(runs).values(id=rid, agent=agent, status="running", kill_mode="cooperative",
                                         host=host or Killer().host, started_at=now, last_seen_at=now, **values))
    return rid


def test_an_idle_tick_looks_at_no_run_and_a_write_brings_back_only_its_run(engine, wd):
    tk = ticker(engine)
    quiet = [wd.run("bot", guards=False).start() for _ in range(20)]
    busy = wd.run("bot", guards=False).start()
    now = utcnow()
    first = tk.tick(now)
    assert first.full and first.active == 21 and first.looked == 21
    idle = tk.tick(later(now, 2))
    assert not idle.full and idle.active == 21 and idle.looked == 0
    busy.record_tool("search", {"q": "refund"})
    rep = tk.tick(later(now, 4))
    assert not rep.full and rep.looked == 1 and rep.new_events == 1
    assert tk.tick(later(now, 6)).looked == 0
    for run in quiet:
        run.__exit__(None, None, None)  # the end of its `with` block: completed
    rep = tk.tick(later(now, 8))
    assert rep.active == 1 and not rep.full


def test_a_run_that_writes_nothing_is_stopped_when_its_wall_clock_runs_out(engine, wd):
    tk = ticker(engine, config(agents={"bot": {"max_wall_s": 20.0}}))
    run = wd.run("bot", guards=False).start()
    now = utcnow()
    assert tk.tick(now).full
    rep = tk.tick(later(now, 10))
    assert not rep.full and rep.looked == 0 and rep.stops == []
    rep = tk.tick(later(now, 25))  # its deadline came: looked at, with no write of its own
    assert not rep.full and rep.looked == 1
    assert rep.stops == [(run.id, lc.WALL_CLOCK)]
    assert run_row(engine, run.id).status == lc.STOPPING


def test_a_silent_run_is_stopped_when_its_silence_runs_out(engine, wd):
    tk = ticker(engine, config(agents={"bot": {"heartbeat_timeout_s": 15.0}}))
    run = wd.run("bot", guards=False).start()
    talker = wd.run("bot", guards=False).start()
    now = utcnow()
    tk.tick(now)
    talker.heartbeat()
    assert tk.tick(later(now, 10)).stops == []
    rep = tk.tick(later(now, 17))
    assert not rep.full
    assert (run.id, lc.HEARTBEAT_TIMEOUT) in rep.stops


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_process_that_dies_between_full_ticks_is_found_by_its_pidfd(db_url, engine, procs):
    agent = procs.start("runaway", db_url, kill_mode="cooperative", steps=1, then="hang")
    tk = ticker(engine)
    now = utcnow()
    assert tk.tick(now).lost == []
    assert tk.tick(later(now, 1)).looked == 0
    agent.proc.kill()
    agent.proc.wait()
    rep = tk.tick(later(now, 2))
    assert not rep.full and rep.lost == [agent.run_id]
    assert run_row(engine, agent.run_id).status == lc.LOST


def test_a_run_that_cannot_be_read_stays_watched_and_is_stopped_from_first_sight(engine):
    cfg = config(agents={"bot": {"max_wall_s": 30.0}})
    rid = _sql_run(engine, steps=1)
    # Its cost is not a number (text on SQLite, NaN on PostgreSQL): the pre-filter cannot judge it.
    bad = "'NaN'::float" if engine.dialect.name == "postgresql" else "'a lot'"
    with constraints_off(engine) as conn:
        conn.execute(text(f"UPDATE runs SET cost_eur = {bad} WHERE id = :r"), {"r": rid})
    tk = ticker(engine, cfg)
    now = utcnow()
    assert rid in tk.tick(now).quarantined
    rep = tk.tick(later(now, 10))
    assert not rep.full and rid in rep.quarantined and rep.stops == []
    rep = tk.tick(later(now, 31))
    assert not rep.full and rep.stops == [(rid, lc.WALL_CLOCK)]


def test_the_period_budgets_count_every_run_not_only_those_looked_at(engine, wd):
    cfg = config(agents={"bot": {"max_cost_eur_per_day": 1000.0}},
                 prices={"gpt-x": {"input_eur_per_mtok": 0.0, "output_eur_per_mtok": 0.0}})
    tk = ticker(engine, cfg)
    spenders = [wd.run("bot", guards=False).start() for _ in range(5)]
    for i, run in enumerate(spenders):
        run.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=0.25 * (i + 1))
    now = utcnow()
    tk.tick(now)
    spenders[0].step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=1.0)
    rep = tk.tick(later(now, 2))
    assert not rep.full and rep.looked == 1
    assert tk.this is not None and tk.this.money is not None
    incremental = dict(tk.this.money.spend.per_agent)
    fresh = ticker(engine, cfg)
    fresh.tick(later(now, 2))
    assert fresh.this is not None and fresh.this.money is not None
    assert incremental == pytest.approx(dict(fresh.this.money.spend.per_agent))
    assert incremental["bot"] == pytest.approx(0.25 * 15 + 1.0)


def test_a_run_first_seen_between_full_ticks_counts_for_its_label_budget(engine, wd):
    """A run that starts between full ticks: its labels are read at the tick that first sees it,
    its cost counts for its label budget from then on, as a full tick would count it."""
    cfg = config(agents={"bot": {"max_cost_eur": 100.0}},
                 budgets=[{"labels": {"tenant": "acme"}, "max_cost_eur_per_day": 1000.0}])
    tk = ticker(engine, cfg)
    old = wd.run("bot", labels={"tenant": "acme"}, guards=False).start()
    old.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=1.5)
    now = utcnow()
    assert tk.tick(now).full
    new = wd.run("bot", labels={"tenant": "acme"}, guards=False).start()
    new.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=2.0)
    other = wd.run("bot", labels={"tenant": "globex"}, guards=False).start()
    other.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=4.0)

    def sums(t) -> tuple[dict[str, float], dict[str, float]]:
        assert t.this is not None and t.this.money is not None
        return dict(t.this.money.spend.per_agent), dict(t.this.money.spend.labelled)

    for k in (2, 4):  # the tick that first sees them, and the next (their labels known by then)
        rep = tk.tick(later(now, k))
        assert not rep.full
        fresh = ticker(engine, cfg)
        assert fresh.tick(later(now, k)).full
        (agents, labelled), (agents_full, labelled_full) = sums(tk), sums(fresh)
        assert agents == pytest.approx(agents_full) and agents["bot"] == pytest.approx(7.5)
        assert labelled == pytest.approx(labelled_full)
        assert list(labelled.values()) == pytest.approx([3.5])  # the acme budget: old and new, not globex


def test_a_full_tick_comes_back_after_a_clock_jump_a_reload_a_failure_and_a_minute(engine, wd, monkeypatch):
    run = wd.run("bot", guards=False).start()
    tk = ticker(engine)
    now = utcnow()
    assert tk.tick(now).full
    assert not tk.tick(later(now, 1)).full
    assert tk.tick(later(now, 2), skip_clock=True).full
    assert not tk.tick(later(now, 3)).full
    assert tk.tick(later(now, 3 + activeset.FULL_EVERY_S)).full  # the backstop
    assert tk.tick(later(now, 1)).full  # the clock went back
    from watchdog.daemon.tick.prefilter import PreFilter

    tk.prefilter = PreFilter(tk.config)  # what a SIGHUP reload does (watchdog.daemon.process.reload)
    assert tk.tick(later(now, 2)).full
    fold = tk.scanner.fold

    def fails(*a, **kw):
        raise RuntimeError("a bug in the fold")

    tk.scanner.fold = fails
    run.heartbeat()  # a write: the fold runs (a tick with nothing written skips it)
    with pytest.raises(RuntimeError):
        tk.tick(later(now, 3))
    tk.scanner.fold = fold
    assert tk.tick(later(now, 4)).full  # the tick that failed left nothing half-known


def test_a_writer_that_rewrites_its_counters_is_judged_at_the_next_tick(engine, wd):
    tk = ticker(engine, config(agents={"bot": {"max_steps": 5}}))
    run = wd.run("bot", guards=False).start()
    now = utcnow()
    tk.tick(now)
    assert not tk.tick(later(now, 1)).full
    with engine.begin() as conn:  # any store writer: the change feed numbers it all the same
        conn.execute(update(runs).where(runs.c.id == run.id).values(steps=50))
    rep = tk.tick(later(now, 2))
    assert not rep.full and rep.stops == [(run.id, lc.MAX_STEPS)]


# -- rows written to break the bookkeeping (found by review) ----------------------------------------


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # PostgreSQL's pid column is int4
def test_a_pid_no_process_can_have_costs_only_its_own_run(db_url, engine):
    import time

    good, bad = _sql_run(engine, steps=50), _sql_run(engine, steps=1)
    with engine.begin() as conn:  # a plain INSERT may write any integer: 2**31 overflows pidfd_open
        conn.execute(update(runs).where(runs.c.id == bad).values(pid=2**31, pid_create_time=time.time()))
    tk = ticker(engine, config(agents={"bot": {"max_steps": 5}}))
    now = utcnow()
    assert tk.tick(now).stops == [(good, lc.MAX_STEPS)]
    assert not tk.tick(later(now, 1)).full


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the constraint that refuses inf is lifted
def test_infinite_budgets_of_its_own_give_a_run_no_deadline_and_break_no_tick(db_url, engine):
    cfg = config(agents={"bot": {"runs_may_raise": True, "max_steps": 5}})
    rid, other = _sql_run(engine, steps=1), _sql_run(engine, steps=1)
    with constraints_off(engine) as conn:
        conn.execute(text("UPDATE runs SET max_wall_s = 9e999, heartbeat_timeout_s = 9e999 WHERE id = :r"),
                     {"r": rid})
    tk = ticker(engine, cfg)
    now = utcnow()
    assert tk.tick(now).full
    with engine.begin() as conn:  # both write: both are looked at, one with no finite deadline
        conn.execute(update(runs).where(runs.c.id.in_([rid, other])).values(steps=9))
    rep = tk.tick(later(now, 2))
    assert not rep.full and sorted(rep.stops) == sorted([(rid, lc.MAX_STEPS), (other, lc.MAX_STEPS)])


def test_a_run_that_ends_between_ticks_counts_in_the_day_spend_at_the_next(engine, wd):
    # The ledger's side of the period budgets is read again only when a run ended (issue 25):
    # an ended run's cost moves from the live sum to the ledger's in one tick, never lost.
    cfg = config(agents={"bot": {"max_cost_eur": 100.0, "max_cost_eur_per_day": 1000.0}})
    tk = ticker(engine, cfg)
    a, b = wd.run("bot", guards=False).start(), wd.run("bot", guards=False).start()
    a.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=2.0)
    b.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=3.0)
    now = utcnow()
    tk.tick(now)

    def spent() -> float:
        assert tk.this is not None and tk.this.money is not None
        (day,) = [s for s in tk.this.rep.periods if s.scope.key == "agent:bot" and s.period == "day"]
        return day.spent_eur

    assert tk.tick(later(now, 1)).looked == 0 and spent() == pytest.approx(5.0)
    a.__exit__(None, None, None)  # completed: its 2.00 leaves the live sum for the unbooked runs
    rep = tk.tick(later(now, 2))
    assert not rep.full and spent() == pytest.approx(5.0)
    b.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=1.0)
    assert tk.tick(later(now, 3)).looked == 1 and spent() == pytest.approx(6.0)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_ended_runs_are_sealed_in_batches_and_listed_the_same_before(db_url, engine, wd):
    """The top tool of an ended run is written on its row at most every SEAL_EVERY_S (a tick
    where runs ended costs no seal's round trips); until then a listing reads it from events."""
    from sqlalchemy import select

    from watchdog.daemon.leases.cluster import SEAL_EVERY_S
    from watchdog.store.views import list_runs

    tk = ticker(engine)
    now = utcnow()
    tk.tick(now)

    def end_one(tool: str) -> str:
        with wd.run("bot", guards=False) as run:
            run.record_tool(tool, {"q": 1})
            run.record_tool(tool, {"q": 2})
        return run.id

    def sealed(rid: str):
        with engine.connect() as conn:
            return conn.execute(select(runs.c.top_tool, runs.c.top_tool_calls).where(runs.c.id == rid)).one()

    ended = end_one("fetch")
    tk.tick(later(now, 2))
    assert sealed(ended) == (None, None)  # waits for the batch
    with engine.connect() as conn:
        listed = {r["id"]: r["top_tool"] for r in list_runs(conn, config(), later(now, 2), all_runs=True)}
    assert listed[ended] == {"name": "fetch", "calls": 2, "errors": 0}  # read from its events meanwhile
    tk.tick(later(now, 4))  # a quiet tick in between: the ended run is still due at the batch
    tk.tick(later(now, SEAL_EVERY_S + 1))
    assert sealed(ended) == ("fetch", 2)
    again = end_one("read")
    tk.duties.follow()  # a tick it did not lead (another daemon did): what ended meanwhile is due
    tk.tick(later(now, SEAL_EVERY_S + 3))
    assert sealed(again) == ("read", 2)


def test_the_exec_roots_are_read_again_only_when_a_run_of_this_host_changed(engine, wd):
    """Between full ticks the exec roots (this host's exec'd runs) are read again when a run of
    this host was written or ended, not when only other hosts' runs were."""
    tk = ticker(engine)
    elsewhere = _sql_run(engine, host="far-away")
    here = wd.run("bot", guards=False).start()
    now = utcnow()
    assert tk.tick(now).full
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == elsewhere).values(steps=3))
    tk.tick(later(now, 2))
    assert tk.active.local_quiet  # only another host's run changed: the roots read before hold
    here.step(tokens_in=1)
    tk.tick(later(now, 4))
    assert not tk.active.local_quiet
    tk.tick(later(now, 6))
    assert tk.active.local_quiet  # nothing at all changed
    here.__exit__(None, None, None)  # ended: the roots change
    tk.tick(later(now, 8))
    assert not tk.active.local_quiet


def test_exec_roots_that_failed_to_read_are_read_again_at_the_next_tick(engine, wd, monkeypatch):
    """A failed read of the roots is not kept as "nothing changed": the next tick reads them,
    whether a run of this host changed or not."""
    from watchdog.daemon.stops import exectree

    tk = ticker(engine)
    now = utcnow()
    tk.tick(now)
    calls = []
    real = exectree.active_exec_roots

    def failing(*a, **kw):
        calls.append(1)
        raise RuntimeError("store blip")

    monkeypatch.setattr(exectree, "active_exec_roots", failing)
    wd.run("bot", guards=False).start()  # a run of this host: the roots are read (and fail)
    tk.tick(later(now, 2))
    assert calls and tk.exec_trees._roots is None
    monkeypatch.setattr(exectree, "active_exec_roots", lambda *a, **kw: (calls.append(2), real(*a, **kw))[1])
    tk.tick(later(now, 4))  # nothing changed since, but the last read failed: read again
    assert calls[-1] == 2 and tk.exec_trees._roots is not None


def _an_unpriced_step_after_a_full_tick(engine, wd):
    """(ticker, run, the full tick's time): the run was started before any price was published, so
    its SDK could not price the gpt-4o step it recorded after that tick."""
    tk = ticker(engine)
    run = wd.run("bot", guards=False).start()
    now = utcnow()
    assert tk.tick(now).full
    run.step(model="gpt-4o", tokens_in=100_000, tokens_out=20_000)
    return tk, run, now


def test_the_steps_left_to_price_are_read_only_when_the_fold_saw_one(engine, wd):
    """The money work reads the unpriced steps written since the last tick only when the tick's
    fold (which reads every step written since) saw a step without a cost: a priced step costs
    no read, an unpriced one is priced at the next tick as before."""
    from sqlalchemy import event

    tk = ticker(engine)
    run = wd.run("bot", guards=False).start()  # started before any price is published: the SDK knows none
    now = utcnow()
    assert tk.tick(now).full
    reads: list[str] = []

    def spy(conn, cursor, statement, *args):
        if "cost_eur IS NULL" in statement and "FROM events" in statement:
            reads.append(statement)

    event.listen(engine, "before_cursor_execute", spy)
    try:
        run.step(model="gpt-4o", tokens_in=10, tokens_out=1, cost_eur=0.5)  # priced by the agent
        rep = tk.tick(later(now, 2))
        assert not rep.full and rep.new_events == 0 and rep.priced_steps == 0 and reads == []
        run.step(model="gpt-4o", tokens_in=100_000, tokens_out=20_000)  # the SDK has no price for it
        rep = tk.tick(later(now, 4))
        assert not rep.full and rep.priced_steps == 1 and len(reads) == 1
    finally:
        event.remove(engine, "before_cursor_execute", spy)
    row = run_row(engine, run.id)
    assert row.cost_unpriced_tokens == 0 and row.cost_eur > 0.5


def test_a_hostile_run_whose_steps_sum_to_a_huge_cost_hides_no_other_runs_spend(engine, wd):
    """A plain-SQL writer appends steps each within the store's checks whose costs sum to ~1.2e18
    EUR, then ends its run: the incremental tick's running total of its agent must not lose the
    other runs' spend by difference (45 + 1.2e18 - 1.2e18 == 0), and the day's budget still closes
    when they pass it, as at a full tick."""
    from watchdog.store.schema import events

    cfg = config(agents={"bot": {"max_cost_eur_per_day": 50.0, "max_cost_eur": 1000.0}})
    tk = ticker(engine, cfg)
    honest = wd.run("bot", guards=False).start()
    honest.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=45.0)
    now = utcnow()
    assert tk.tick(now).full
    rid = _sql_run(engine)
    t = utcnow()
    with engine.begin() as conn:
        conn.execute(insert(events), [dict(run_id=rid, seq=i + 1, at=t, kind=lc.EV_STEP, cost_eur=9.99e14)
                                      for i in range(1200)])
    assert not tk.tick(later(now, 2)).full
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == rid).values(status=lc.COMPLETED, ended_at=utcnow()))
    assert not tk.tick(later(now, 4)).full
    assert tk.this is not None and tk.this.money is not None
    assert tk.this.money.spend.per_agent["bot"] == pytest.approx(45.0)
    honest.step(model="gpt-x", tokens_in=10, tokens_out=1, cost_eur=10.0)  # 55 EUR today: over 50
    rep = tk.tick(later(now, 6))
    assert not rep.full and tk.this.money.spend.per_agent["bot"] == pytest.approx(55.0)
    assert "agent:bot" in tk.money.closed  # the day's budget is spent: its running runs are stopped
    assert (honest.id, lc.DAILY_BUDGET) in rep.stops


def test_steps_whose_pricing_failed_are_priced_at_the_next_tick(engine, wd, monkeypatch):
    """Pricing failed once (logged, retried next tick): the next tick, which reads no new step,
    prices them all the same."""
    from watchdog.daemon.money.moneytick import Backfill

    tk, run, now = _an_unpriced_step_after_a_full_tick(engine, wd)
    real = Backfill.apply
    failures = []

    def failing_once(self, *args, **kwargs):
        if not failures:
            failures.append(1)
            raise RuntimeError("the price book failed")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Backfill, "apply", failing_once)
    rep = tk.tick(later(now, 2))
    assert failures and rep.priced_steps == 0 and run_row(engine, run.id).cost_unpriced_tokens == 120_000
    rep = tk.tick(later(now, 4))  # nothing new was written: the failed steps are read again
    assert not rep.full and rep.priced_steps == 1
    assert run_row(engine, run.id).cost_unpriced_tokens == 0


def test_a_leader_counts_its_own_hosts_runs_as_active_at_full_and_incremental_ticks(engine, wd):
    """The leader reads every host's runs (its counts per host spare a count each tick), with or
    without the money work; only the runs of the hosts it judges are its active ones (not those
    of a host whose own daemon is alive)."""
    from sqlalchemy import text as sql_text

    from daemon_support import ME, SEALER
    from watchdog.daemon.tick.ticker import Ticker
    from watchdog.store import leases

    far_host = "far-away-host"
    with engine.begin() as conn:  # that host's daemon holds its lease (and, on PostgreSQL, its lock)
        leases.write_holder(conn, host=far_host, pid=10, create_time=1.0, lease_s=3600)
    lock = engine.connect()
    try:
        if engine.dialect.name == "postgresql":
            lock.execute(sql_text("SELECT pg_advisory_lock(:k)"), {"k": leases.host_key(far_host)})
        for money in (True, False):
            tk = Ticker(engine, config(), Killer(allowed_users=[ME]), money=money, sealer=SEALER)
            far = _sql_run(engine, host=far_host)
            here = wd.run("bot", guards=False).start()
            now = utcnow()
            full = tk.tick(now)
            assert full.full and full.leader and full.adopted == ()
            here.step(tokens_in=1)
            inc = tk.tick(later(now, 2))
            assert not inc.full
            assert full.active == inc.active == 1  # its own host's run, whichever the tick
            assert tk.active.host_counts() is not None  # every host's runs were read: no count of its own
            here.__exit__(None, None, None)
            with engine.begin() as conn:
                conn.execute(update(runs).where(runs.c.id == far).values(status=lc.COMPLETED, ended_at=utcnow()))
    finally:
        lock.close()


def test_the_labels_of_more_new_runs_than_one_read_carries_are_all_learned(engine, wd, monkeypatch):
    """The ledger's read carries the labels of LABELS_ALONG new runs at most; the rest are read on
    their own, in the same tick."""
    from watchdog.store import ledger

    monkeypatch.setattr(ledger, "LABELS_ALONG", 2)
    cfg = config(budgets=[{"labels": {"tenant": "acme"}, "max_cost_eur_per_day": 1000.0}])
    tk = ticker(engine, cfg)
    first = wd.run("bot", labels={"tenant": "acme"}, guards=False).start()
    now = utcnow()
    assert tk.tick(now).full
    with wd.run("bot", guards=False):
        pass  # a run that ended: the ledger's spend is read this tick, with labels along
    new = [wd.run("bot", labels={"tenant": "acme"}, guards=False).start() for _ in range(5)]
    for i, run in enumerate([first, *new]):
        run.step(model="gpt-x", tokens_in=1, tokens_out=1, cost_eur=float(i + 1))
    rep = tk.tick(later(now, 2))
    assert not rep.full
    assert all(run.id in tk.money.run_scopes for run in new)
    tk.tick(later(now, 4))  # their label budgets count from the tick after the one that learned them
    assert tk.this is not None and tk.this.money is not None
    assert list(tk.this.money.spend.labelled.values()) == pytest.approx([21.0])  # 1 + 2 + ... + 6


def test_steps_the_fold_named_are_priced_after_a_tick_that_failed_before_pricing(engine, wd, monkeypatch):
    """The fold moved past an unpriced step, then the tick failed before the money work read it:
    the step is still priced at the next tick (its id is kept), not only if a range read reaches it."""
    from watchdog.daemon.tick import tickread

    tk, run, now = _an_unpriced_step_after_a_full_tick(engine, wd)
    real = tickread._prefilter

    def failing(*args, **kwargs):
        raise RuntimeError("the store went away mid-tick")

    monkeypatch.setattr(tickread, "_prefilter", failing)
    with pytest.raises(RuntimeError):
        tk.tick(later(now, 2))  # folded the step, failed before pricing it
    monkeypatch.setattr(tickread, "_prefilter", real)
    assert tk.money is not None and tk.money.backfill.low is not None
    tk.money.backfill.low = 10**12  # as for a step that committed late, below the range read
    rep = tk.tick(later(now, 4))
    assert rep.priced_steps == 1 and run_row(engine, run.id).cost_unpriced_tokens == 0
