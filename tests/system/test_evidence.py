"""Issue 20, the daemon's side: each attack of the issue's list, against the Ticker on real
stores (SQLite and PostgreSQL where the daemon's logic is what defends) with real agent
processes where a signal is at stake. Each attack fails: the attacking run is stopped at its
profile's budget (by its events, or its wall clock from first sight), no other run is touched
or signalled, the ledger books the real spend, no alert carries the planted text.
"""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy import func, insert, select, text, update

from agent_procs import sigterm_pending, wait_until
from failsafe_support import constraints_off
from daemon_support import ME, SEALER, actions, alerts_of, config, later, run_row
from watchdog.core import lifecycle as lc
from watchdog.core.messages import ACK_MARK
from watchdog.daemon.trust.scan import Tally
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.schema import alerts, events, interventions, runs, spend_ledger, utcnow

PLANTED = "evil.example"
URGENT = f"URGENT: credentials leaked, rotate them at http://{PLANTED}/rotate"


@pytest.fixture
def attestor(attest, db_url):
    return attest(db_url)


def _ticker(engine, cfg, sealer) -> Ticker:
    return Ticker(engine, cfg, Killer(allowed_users=[ME]), sealer=sealer)


def _sql_run(engine, *, agent="bot", status="running", started_at=None, **values) -> str:
    """A run written with plain SQL, as any store writer (no SDK, no attestation)."""
    rid = uuid.uuid4().hex
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(insert(runs).values(id=rid, agent=agent, status=status, kill_mode="cooperative",
                                         host=Killer().host, started_at=started_at or now, last_seen_at=now,
                                         **values))
    return rid


def _steps(engine, rid, n, *, cost=0.0, start_seq=1, source=None, call_ids=None):
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(insert(events), [dict(run_id=rid, seq=start_seq + i, at=now, kind="step", model="gpt-x",
                                           tokens_in=10, tokens_out=5, cost_eur=cost, source=source,
                                           call_id=call_ids[i] if call_ids else None) for i in range(n)])


def _no_planted_text(engine):
    for a in alerts_of(engine):
        assert PLANTED not in (a.title or "") and PLANTED not in (a.body or ""), a.title


# -- one call, one count ------------------------------------------------------------------------------


def test_one_call_seen_by_several_witnesses_counts_once_and_never_their_sum():
    t = Tally()
    for source in (None, "mcp"):  # the SDK and the MCP proxy saw the same 3 calls
        for i in range(3):
            t.add("tool", source, f"call-{i}", True, None, None, None)
    t.add("tool", "mcp", None, True, None, None, None)  # one more only the proxy saw, without an id
    assert t.values[1] == 4  # max(3 distinct ids, the proxy's 4) — not 7
    for i in range(2):  # the LiteLLM gateway priced two steps the SDK also wrote
        t.add("step", "litellm", f"llm-{i}", None, 100, 50, 0.25)
        t.add("step", None, f"llm-{i}", None, 100, 50, 0.25)
    assert t.values[0] == 2 and t.values[3] == 300 and t.values[4] == pytest.approx(0.5)


# -- attack 3: inserted with resumes = 1 and budgets of 1e9 ------------------------------------------------


def test_a_run_inserted_as_resumed_with_huge_budgets_is_held_to_its_profile(db_url, engine):
    cfg = config(agents={"bot": {"max_steps": 5, "max_cost_eur": 0.01}})
    rid = _sql_run(engine, resumes=1, max_steps=1_000_000_000, max_cost_eur=1e9, max_tool_calls=1_000_000_000)
    other = _sql_run(engine, resumes=1, max_steps=8)  # a healthy run beside it
    _steps(engine, rid, 50, cost=0.009)
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == rid).values(steps=50, cost_eur=0.45))
    rep = _ticker(engine, cfg, SEALER).tick(utcnow())
    assert [s[0] for s in rep.stops] == [rid]
    assert run_row(engine, rid).stop_reason in (lc.MAX_COST, lc.MAX_STEPS)
    assert run_row(engine, other).status == lc.RUNNING


# -- attack 4: a run resets its own counters -------------------------------------------------------------


def test_a_run_that_resets_its_counters_is_judged_by_its_events(db_url, engine, wd):
    cfg = config(agents={"bot": {"max_steps": 100, "max_cost_eur": 2.0}})
    run = wd.run(agent="bot", guards=False).start()
    run.step(model="gpt-x", tokens_in=1, tokens_out=1, cost_eur=0.05)
    bystander = wd.run(agent="bot", guards=False).start()
    bystander.step(model="gpt-x", tokens_in=1, tokens_out=1, cost_eur=0.01)
    tk = _ticker(engine, cfg, SEALER)
    assert tk.tick(utcnow()).stops == []  # warm: later ticks fold only new events
    for _ in range(50):  # 2.55 EUR in all...
        run.step(model="gpt-x", tokens_in=1, tokens_out=1, cost_eur=0.05)
    with engine.begin() as conn:  # ...and its row says it spent nothing
        conn.execute(text("UPDATE runs SET steps = 0, cost_eur = 0 WHERE id = :r"), {"r": run.id})
    rep = tk.tick(later(utcnow(), 1))
    assert rep.stops == [(run.id, lc.MAX_COST)]
    assert run_row(engine, bystander.id).status == lc.RUNNING
    (alert,) = [a for a in alerts_of(engine, run.id) if a.dedupe_key == f"stop:{run.id}"]
    assert "2.55" in alert.body  # the alert counts what its events show, not the row's 0
    # A restarted daemon folds the run's whole history again: the same verdict.
    assert _ticker(engine, cfg, SEALER).scanner is not None


# -- attack 5: a run pauses itself for good ----------------------------------------------------------------


@pytest.mark.parametrize("on_breach", ["stop", "pause"])
def test_a_self_written_pause_is_judged_as_running(db_url, engine, on_breach):
    cfg = config(agents={"bot": {"max_steps": 5, "on_breach": on_breach, "approval_timeout_s": 60.0}})
    far = dt.datetime(9999, 1, 1, tzinfo=dt.timezone.utc)
    rid = _sql_run(engine, status="paused", paused_at=far, stop_reason=lc.MAX_STEPS, steps=500)
    _steps(engine, rid, 500)
    tk = _ticker(engine, cfg, SEALER)
    now = utcnow()
    rep = tk.tick(now)
    if on_breach == "stop":  # its profile never pauses: the pause is denied, the run stopped
        assert rep.stops == [(rid, lc.MAX_STEPS)]
    else:  # a pausing budget over its limit by the daemon's counters: confirmed, timed from now
        assert rep.stops == []
        assert tk.tick(later(now, 30)).stops == []
        assert tk.tick(later(now, 61)).stops == [(rid, lc.MAX_STEPS)]
    assert run_row(engine, rid).status == lc.STOPPING


# -- attack 6: the daily budget escaped by zeroing cost_eur before ending ----------------------------------


def test_zeroing_cost_before_ending_does_not_escape_the_daily_budget(db_url, engine):
    cfg = config(agents={"bot": {"max_cost_eur_per_day": 1.0, "max_cost_eur": 100.0, "max_steps": 1000}})
    tk = _ticker(engine, cfg, SEALER)
    ended = []
    for _ in range(3):
        rid = _sql_run(engine)
        _steps(engine, rid, 4, cost=0.10)
        with engine.begin() as conn:  # spent 0.40, zeroed its counters, ended
            conn.execute(update(runs).where(runs.c.id == rid).values(
                steps=0, cost_eur=0.0, status=lc.COMPLETED, ended_at=utcnow()))
        ended.append(rid)
    live = _sql_run(engine, cost_eur=0.30, steps=3)
    _steps(engine, live, 3, cost=0.10)
    now = utcnow()
    tk.tick(now)
    tk.tick(later(now, 60))  # booked, then judged against the booked spend
    with engine.connect() as conn:
        booked = conn.execute(select(func.max(spend_ledger.c.cost_eur)).where(
            spend_ledger.c.scope == "agent:bot", spend_ledger.c.period == "day")).scalar()
    assert booked == pytest.approx(1.20)
    assert run_row(engine, live).stop_reason == lc.DAILY_BUDGET


# -- attack 7: started_at 30 days ahead; an unreadable row ------------------------------------------------


def test_a_future_dated_run_is_stopped_at_its_wall_clock_from_first_sight(db_url, engine):
    cfg = config(agents={"bot": {"max_steps": 5, "max_wall_s": 60.0}})
    ahead = utcnow() + dt.timedelta(days=30)
    rid = _sql_run(engine, started_at=ahead, steps=500)
    tk = _ticker(engine, cfg, SEALER)
    now = utcnow()
    rep = tk.tick(now)
    assert rid in rep.quarantined and rep.stops == []
    healthy = _sql_run(engine, steps=1, started_at=later(now, 30))  # first seen 30 s later
    assert tk.tick(later(now, 30)).stops == []
    rep = tk.tick(later(now, 61))
    assert rep.stops == [(rid, lc.WALL_CLOCK)]
    row = run_row(engine, rid)
    assert (row.status, row.stop_reason) == (lc.STOPPING, lc.WALL_CLOCK)
    assert run_row(engine, healthy).status == lc.RUNNING
    # A restarted daemon (same state_dir) keeps the first sight: it does not start the clock again.
    again = _ticker(engine, cfg, SEALER)
    assert again.trust.first[rid] == tk.trust.first[rid]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_unreadable_run_whose_process_dies_is_marked_lost(db_url, engine, procs):
    import psutil

    agent = procs.start("runaway", db_url, kill_mode="cooperative", steps=1, then="hang")
    ctime = psutil.Process(agent.pid).create_time()
    rid = agent.run_id
    with constraints_off(engine) as conn:  # its row can no longer be read whole
        conn.execute(text("UPDATE runs SET started_at = 'the day before yesterday', pid_create_time = :c "
                          "WHERE id = :r"), {"r": rid, "c": ctime})
    tk = _ticker(engine, config(), SEALER)
    assert rid in tk.tick(utcnow()).quarantined
    agent.proc.kill()
    agent.proc.wait()
    rep = tk.tick(later(utcnow(), 1))
    assert rid in rep.lost
    with engine.connect() as conn:
        assert conn.execute(select(runs.c.status).where(runs.c.id == rid)).scalar() == lc.LOST


# -- attack 8: writer text in an alert -------------------------------------------------------------------


def test_a_pause_written_on_another_run_is_denied_and_its_text_never_alerted(db_url, engine, wd):
    cfg = config(agents={"bot": {"max_steps": 10, "on_breach": "pause"}})
    victim = wd.run(agent="bot", guards=False).start()
    victim.step(model="gpt-x", tokens_in=1, tokens_out=1)
    tk = _ticker(engine, cfg, SEALER)
    tk.tick(utcnow())
    with engine.begin() as conn:  # another writer pauses it, with words of its own
        conn.execute(update(runs).where(runs.c.id == victim.id).values(
            status=lc.PAUSED, paused_at=utcnow(), stop_reason=lc.MAX_STEPS, stop_detail=URGENT))
    tk.tick(later(utcnow(), 1))
    row = run_row(engine, victim.id)
    assert (row.status, row.stop_detail) == (lc.RUNNING, None)  # not held: running again
    assert "pause_denied" in actions(engine, victim.id)
    _no_planted_text(engine)


def test_a_forged_resume_row_puts_no_text_into_the_resume_alert(db_url, engine, wd):
    cfg = config(agents={"bot": {"max_steps": 10}})
    run = wd.run(agent="bot", guards=False).start()
    run.step(model="gpt-x", tokens_in=1, tokens_out=1)
    with engine.begin() as conn:
        conn.execute(insert(interventions).values(
            at=utcnow(), run_id=run.id, action="resumed", reason=lc.MAX_STEPS, detail=URGENT,
            actor=f"cli@vm:1 (root, sudo by your-ciso): re-authenticate at http://{PLANTED}/login",
            outcome=f"resumed; see http://{PLANTED}"))
        conn.execute(update(runs).where(runs.c.id == run.id).values(resumes=1, max_steps=1000))
    sealer = _sealer()
    tk = _ticker(engine, cfg, sealer)
    tk.tick(utcnow())
    (alert,) = [a for a in alerts_of(engine, run.id) if a.dedupe_key.startswith("resume:")]
    assert "not sealed by an operator" in alert.body
    _no_planted_text(engine)
    # and its raised budget is not honoured: 11 steps stop it at the profile's 10
    for _ in range(10):
        run.step(model="gpt-x", tokens_in=1, tokens_out=1)
    assert tk.tick(later(utcnow(), 1)).stops == [(run.id, lc.MAX_STEPS)]
    _no_planted_text(engine)


def _sealer():
    import os

    from watchdog.core.seal import Sealer

    return Sealer(os.urandom(32), Killer().host)


# -- attack 9: adoption ------------------------------------------------------------------------------------


def test_an_adopted_healthy_run_is_stopped_cooperatively_never_signalled(db_url, engine, procs, attestor):
    cfg = config(agents={"bot": {"max_steps": 5}})
    victim = procs.start("runaway", db_url, kill_mode="process", steps=1, then="attest_then_hang",
                         block_sigterm=True, budgets={"max_steps": 5})
    assert wait_until(lambda: run_row(engine, victim.run_id).pid == victim.pid)
    tk = _ticker(engine, cfg, attestor.sealer)
    now = utcnow()
    tk.tick(now)  # first sight of the victim: its parent link (none) is the daemon's record
    attacker = _sql_run(engine, steps=50)
    _steps(engine, attacker, 50)
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == victim.run_id).values(parent_id=attacker))
    rep = tk.tick(later(now, 1))
    assert (attacker, lc.MAX_STEPS) in rep.stops
    assert run_row(engine, victim.run_id).status == lc.STOPPING  # stopped with "its parent": cooperatively
    for i in range(2, 8):
        tk.tick(later(now, i))
    assert not sigterm_pending(victim.pid)  # never signalled
    assert "sigterm" not in actions(engine, victim.run_id)
    (alert,) = [a for a in alerts_of(engine, victim.run_id) if a.dedupe_key == f"stop:{victim.run_id}"]
    assert ACK_MARK in alert.body


# -- attack 11: signal_stage = 'done' written by the runaway -------------------------------------------------


def test_a_runaway_writing_signal_stage_done_is_still_sigtermed(db_url, engine, procs, attestor):
    cfg = config(agents={"bot": {"max_steps": 3}})
    agent = procs.start("runaway", db_url, kill_mode="process", steps=4, then="attest_then_hang",
                        block_sigterm=True, budgets={"max_steps": 3})
    assert wait_until(lambda: run_row(engine, agent.run_id).pid == agent.pid)
    tk = _ticker(engine, cfg, attestor.sealer)
    now = utcnow()
    assert tk.tick(now).stops == [(agent.run_id, lc.MAX_STEPS)]
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == agent.run_id).values(signal_stage="done"))
    tk.tick(later(now, 1))  # past cancel_grace_s: the ladder goes by its own record
    assert wait_until(lambda: sigterm_pending(agent.pid), 10)
    assert "sigterm" in actions(engine, agent.run_id)


# -- attack 11: delivery state reset into a re-send ------------------------------------------------------


def test_resetting_an_alerts_delivery_state_never_sends_it_again(db_url, engine, http):
    from watchdog.daemon.alerts.notify import Notifier
    from watchdog.daemon.alerts.outbox import deliver_due
    from watchdog.store.alerts import enqueue_alert
    from watchdog.store.memory import Memory

    sealer, memory = _sealer(), Memory(None)
    t0 = utcnow()
    with engine.begin() as conn:
        assert enqueue_alert(conn, "stop:genuine", "agent-watchdog: stopped bot run 1234abcd — max_steps",
                             "a genuine sealed alert", now=t0, sealer=sealer)
    notifier = Notifier([http.url()])
    assert deliver_due(engine, notifier, later(t0, 1), sealer=sealer, memory=memory).delivered == 1
    for i in range(10):  # a store writer makes it undelivered again, ten times
        with engine.begin() as conn:
            conn.execute(update(alerts).where(alerts.c.dedupe_key == "stop:genuine").values(
                delivered_at=None, delivered_targets=[], attempts=0, next_attempt_at=later(t0, 1 + i)))
        deliver_due(engine, notifier, later(t0, 2 + i), sealer=sealer, memory=memory)
    assert not http.wait_for(2, timeout_s=1.0)
    assert len(http.received) == 1
    with engine.connect() as conn:  # and the row says delivered again
        assert conn.execute(select(alerts.c.delivered_at).where(alerts.c.dedupe_key == "stop:genuine")).scalar()


def test_the_writers_fast_path_never_lowers_what_a_gateway_saw_first():
    t = Tally()
    for i in range(4):  # a gateway saw 4 calls first...
        t.add("tool", "mcp", None, True, None, None, None)
    t.add("tool", None, None, True, None, None, None)  # ...then the run's own writer one
    assert t.values[1] == 4
    for _ in range(5):
        t.add("tool", None, None, False, None, None, None)
    assert t.values[1] == 6 and t.values[2] == 5


# -- budgets: runs_may_raise, a sealed resume, owners ------------------------------------------------------


def test_a_raise_holds_only_with_runs_may_raise_or_a_sealed_resume(db_url, engine):
    from watchdog.store.alerts import seal_grant

    cfg = config(agents={"bot": {"max_steps": 5}, "lax": {"max_steps": 5, "runs_may_raise": True}})
    lax = _sql_run(engine, agent="lax", max_steps=50, steps=20)
    sealed = _sql_run(engine, resumes=1, max_steps=50, steps=20)
    with engine.begin() as conn:  # an operator's resume, sealed with the daemon's key
        conn.execute(insert(interventions).values(at=utcnow(), run_id=sealed, action="resumed",
                                                  reason=lc.MAX_STEPS, outcome="resumed after 3 s paused"))
        assert seal_grant(conn, sealed, SEALER)
    claimed = _sql_run(engine, resumes=1, max_steps=50, steps=20)  # resumes written by hand
    tk = _ticker(engine, cfg, SEALER)
    now = utcnow()
    assert tk.tick(now).stops == [(claimed, lc.MAX_STEPS)]
    with engine.begin() as conn:  # the writer raises the sealed run's budget further: no longer sealed
        conn.execute(update(runs).where(runs.c.id == sealed).values(max_steps=1_000_000))
    assert tk.tick(later(now, 1)).stops == [(sealed, lc.MAX_STEPS)]
    assert run_row(engine, lax).status == lc.RUNNING


def test_a_run_whose_owner_may_not_use_its_profile_is_judged_by_defaults_and_alerted_once(db_url, engine):
    cfg = config(defaults={"max_steps": 12}, agents={"trusted-bot": {"max_steps": 1000, "owners": ["ops-agent"]}})
    rid = _sql_run(engine, agent="trusted-bot", steps=20)  # no sealed attestation: no provable owner
    tk = _ticker(engine, cfg, SEALER)
    now = utcnow()
    assert tk.tick(now).stops == [(rid, lc.MAX_STEPS)]
    tk.tick(later(now, 1))
    owner_alerts = [a for a in alerts_of(engine, rid) if a.dedupe_key == f"owner:{rid}"]
    assert len(owner_alerts) == 1 and "judged by [defaults]" in owner_alerts[0].title


def test_a_gateways_events_for_a_run_count_on_it_once_without_its_row(db_url, engine):
    """A gateway may not update another owner's row (PostgreSQL): the fold counts its events, and
    the SDK's copies of the same calls (one call id) count once."""
    cfg = config(agents={"bot": {"max_tool_calls": 10}})
    rid = _sql_run(engine, tool_calls=6)
    now = utcnow()
    with engine.begin() as conn:
        rows = [dict(run_id=rid, seq=i + 1, at=now, kind="tool", tool="search", ok=True, args_hash=f"h{i}",
                     source=None, call_id=f"c{i}") for i in range(6)]  # the SDK's 6, counted on its row
        rows += [dict(run_id=rid, seq=100 + i, at=now, kind="tool", tool="search", ok=True, args_hash=f"h{i}",
                      source="mcp", call_id=f"c{i}") for i in range(9)]  # the proxy saw those 6 and 3 more
        conn.execute(insert(events), rows)
    tk = _ticker(engine, cfg, SEALER)
    assert tk.tick(now).stops == []  # 9 calls (not 15): under 10
    with engine.begin() as conn:
        conn.execute(insert(events), [dict(run_id=rid, seq=200 + i, at=now, kind="tool", tool="search", ok=True,
                                           args_hash=f"x{i}", source="mcp", call_id=f"d{i}") for i in range(2)])
    assert tk.tick(later(now, 1)).stops == [(rid, lc.MAX_TOOL_CALLS)]  # 11 > 10, the row still says 6
