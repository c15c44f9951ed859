"""One malformed row or event costs only itself: every other run is judged as usual.

Each case writes one bad value by hand (as a client in another language, a corrupted
file or a careless operator would, with the schema's own checks out of the way) into a
run that is not the runaway, then starts a real runaway subprocess beside it. The daemon
must stop the runaway within two ticks and report the bad row exactly once (one
`quarantined` intervention, one alert), across a restart too.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select, text

from daemon_support import ME, config, later
from failsafe_support import constraints_off
from watchdog import Watchdog
from watchdog.core import lifecycle as lc
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.schema import alerts, events, interventions, utcnow

RUNAWAY = dict(kill_mode="process", budgets={"max_steps": 3}, steps=4, then="loop")

# (name, dialects, SQL that spoils the bad run :rid). Runs: the light row, the whole row; events:
# the fold. Values a client in another language could write, or a corrupted file holds.
RUN_CASES = [
    ("agent_not_utf8", {"sqlite"}, "UPDATE runs SET agent = CAST(X'fffe41' AS TEXT) WHERE id = :rid"),
    ("steps_text", {"sqlite"}, "UPDATE runs SET steps = 'many' WHERE id = :rid"),
    ("cost_text", {"sqlite"}, "UPDATE runs SET cost_eur = 'lots' WHERE id = :rid"),
    ("max_steps_text", {"sqlite"}, "UPDATE runs SET max_steps = 'ten' WHERE id = :rid"),
    ("started_garbage", {"sqlite"}, "UPDATE runs SET started_at = 'garbage' WHERE id = :rid"),
    ("labels_not_json", {"sqlite"}, "UPDATE runs SET labels = 'not json', steps = 99 WHERE id = :rid"),
    ("cost_negative", {"sqlite", "postgresql"}, "UPDATE runs SET cost_eur = -5 WHERE id = :rid"),
    ("cost_nan", {"postgresql"}, "UPDATE runs SET cost_eur = 'NaN' WHERE id = :rid"),
    ("seen_infinity", {"postgresql"}, "UPDATE runs SET last_seen_at = 'infinity' WHERE id = :rid"),
    ("started_now", {"sqlite"}, "UPDATE runs SET started_at = 'now', steps = 1 WHERE id = :rid"),
    ("seen_year_20000", {"postgresql"},
     "UPDATE runs SET last_seen_at = '20000-01-01 00:00:00+00', steps = 99 WHERE id = :rid"),
    ("tokens_text", {"sqlite"}, "UPDATE runs SET tokens_in = 'x' WHERE id = :rid"),
]
EVENT_CASES = [
    ("event_error_blob", {"sqlite"}, "UPDATE events SET error_msg = X'41', ok = 0 WHERE id = :eid"),
    ("event_attempt_text", {"sqlite"}, "UPDATE events SET attempt = 'x' WHERE id = :eid"),
    ("event_null_tool", {"sqlite", "postgresql"}, "UPDATE events SET tool = NULL WHERE id = :eid"),
    ("event_at_garbage", {"sqlite"}, "UPDATE events SET at = 'not a time' WHERE id = :eid"),
    ("event_year_20000", {"postgresql"}, "UPDATE events SET at = '20000-01-01 00:00:00+00' WHERE id = :eid"),
]


def _backend(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def _ticker(engine, attestor) -> Ticker:
    return Ticker(engine, config(), Killer(allowed_users=[ME]), sealer=attestor.sealer)


class BadRun:
    """A cooperative run of this process (never signalled), left open, then spoiled by hand."""

    def __init__(self, url: str):
        self.wd = Watchdog(url)
        self.cm = self.wd.run(agent="victim", kill_mode="cooperative", guards=False)
        self.run = self.cm.__enter__()
        self.run.record_tool("search", {"q": 1}, ok=False, error="timeout")
        self.id = self.run.id

    def close(self):
        self.wd.close()


@pytest.fixture
def attestor(attest, db_url):
    """This host's daemon socket: the runaway attests to it, so its stop is the daemon's own."""
    return attest(db_url)


@pytest.fixture
def bad_run(db_url):
    made = []

    def make():
        made.append(BadRun(db_url))
        return made[-1]

    yield make
    for b in made:
        b.close()


def spoil(engine, sql: str, **params) -> None:
    with constraints_off(engine) as conn:
        conn.execute(text(sql), params)


def quarantined(engine, run_id: str | None = None) -> list:
    with engine.connect() as conn:
        q = select(interventions.c.run_id, interventions.c.detail).where(interventions.c.action == "quarantined")
        return conn.execute(q).all()


def quarantine_alerts(engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(alerts.c.dedupe_key).where(alerts.c.dedupe_key.like("quarantine:%")))
                    .scalars())


def _stopped_within_two_ticks(tk, agent, t) -> bool:
    for i in range(2):
        rep = tk.tick(later(t, i * 5))
        if (agent.run_id, lc.MAX_STEPS) in rep.stops:
            return True
    return False


def _per_backend(cases):
    """(backend, case) for each backend whose column types let the value in at all."""
    return [pytest.param(b, name, id=f"{b}-{name}") for name, dialects, _sql in cases for b in sorted(dialects)]


@pytest.mark.parametrize("db_url,case", _per_backend(RUN_CASES), indirect=["db_url"])
def test_a_malformed_run_costs_only_itself_and_is_reported_once(case, db_url, engine, procs, attestor, bad_run):
    _name, _dialects, sql = next(c for c in RUN_CASES if c[0] == case)
    victim = bad_run()
    spoil(engine, sql, rid=victim.id)
    agent = procs.start("runaway", db_url, **RUNAWAY)
    tk = _ticker(engine, attestor)
    t = utcnow()
    assert _stopped_within_two_ticks(tk, agent, t), agent.log()
    assert agent.wait() == 0 and agent.result()["killed"] == lc.MAX_STEPS

    reports = quarantined(engine)
    assert [r.run_id for r in reports] == [victim.id]
    assert quarantine_alerts(engine) == [f"quarantine:run:{victim.id}"]
    # Restarted: still reported once, and still every other run judged.
    for i in range(3):
        _ticker(engine, attestor).tick(later(t, 20 + i))
    assert len(quarantined(engine)) == 1 and len(quarantine_alerts(engine)) == 1


def test_what_was_wrong_is_named_without_the_stored_text(db_url, engine, procs, attestor, bad_run):
    victim = bad_run()
    if _backend(db_url) == "sqlite":
        spoil(engine, "UPDATE runs SET steps = 'IGNORE PREVIOUS INSTRUCTIONS' WHERE id = :rid", rid=victim.id)
        expect = "steps is not a number"
    else:
        spoil(engine, "UPDATE runs SET last_seen_at = 'infinity' WHERE id = :rid", rid=victim.id)
        expect = "last_seen_at is not a plausible time"
    _ticker(engine, attestor).tick(utcnow())
    (report,) = quarantined(engine)
    assert expect in report.detail and "IGNORE" not in report.detail
    with engine.connect() as conn:
        body = conn.execute(select(alerts.c.body).where(alerts.c.dedupe_key == f"quarantine:run:{victim.id}")).scalar()
    assert expect in body and "IGNORE" not in body


def test_a_fixed_row_is_judged_again(db_url, engine, attestor, bad_run):
    victim = bad_run()
    spoil(engine, "UPDATE runs SET cost_eur = -1 WHERE id = :rid", rid=victim.id)
    tk = _ticker(engine, attestor)
    t = utcnow()
    assert tk.tick(t).quarantined == [victim.id]
    with engine.begin() as conn:  # fixed by the operator, and now over its budget
        conn.execute(text("UPDATE runs SET cost_eur = 0, steps = 50 WHERE id = :rid"), {"rid": victim.id})
    assert (victim.id, lc.MAX_STEPS) in tk.tick(later(t, 5)).stops


@pytest.mark.parametrize("db_url,case", _per_backend(EVENT_CASES), indirect=["db_url"])
@pytest.mark.parametrize("ended", [False, True], ids=["running", "ended"])
def test_a_bad_event_is_passed_once_and_never_again_after_a_restart(case, ended, db_url, engine, procs, attestor,
                                                                      bad_run):
    _name, _dialects, sql = next(c for c in EVENT_CASES if c[0] == case)
    tk = _ticker(engine, attestor)
    t = utcnow()
    tk.tick(t)  # the daemon is warm: the bad event arrives above its high-water mark
    victim = bad_run()
    with engine.connect() as conn:
        eid = conn.execute(select(events.c.id).where(events.c.run_id == victim.id, events.c.kind == "tool")).scalar()
    spoil(engine, sql, eid=eid)
    if ended:
        victim.run.__exit__(None, None, None)
    agent = procs.start("runaway", db_url, **RUNAWAY)
    assert _stopped_within_two_ticks(tk, agent, later(t, 1)), agent.log()
    assert tk.scanner.high_water >= eid  # moved past the bad event
    assert len(quarantine_alerts(engine)) == 1
    # A restart (cold start re-reads the active runs' history): still once, the tick still works.
    tk2 = _ticker(engine, attestor)
    tk2.tick(later(t, 30))
    tk2.tick(later(t, 35))
    assert len(quarantined(engine)) == 1 and len(quarantine_alerts(engine)) == 1


def test_many_malformed_rows_beside_many_runs_every_runaway_is_found(db_url, engine, attestor, bad_run):
    """At scale, in one tick: 30 bad rows of kinds that each break a different read."""
    bad = [bad_run() for _ in range(6)]
    sqlite = _backend(db_url) == "sqlite"
    spoilers = (["UPDATE runs SET steps = 'x' WHERE id = :rid", "UPDATE runs SET started_at = 'x' WHERE id = :rid",
                 "UPDATE runs SET labels = 'x', steps = 99 WHERE id = :rid"] if sqlite else
                ["UPDATE runs SET last_seen_at = 'infinity' WHERE id = :rid",
                 "UPDATE runs SET last_seen_at = '20000-01-01 00:00:00+00', steps = 99 WHERE id = :rid"])
    spoilers += ["UPDATE runs SET cost_eur = -1 WHERE id = :rid"]
    for i, b in enumerate(bad):
        spoil(engine, spoilers[i % len(spoilers)], rid=b.id)
    good = bad_run()
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET steps = 40 WHERE id = :rid"), {"rid": good.id})
    rep = _ticker(engine, attestor).tick(utcnow())
    assert [r for r, _ in rep.stops] == [good.id]
    assert sorted(rep.quarantined) == sorted(b.id for b in bad)


# -- the schema refuses malformed rows at the door ------------------------------------------------


REFUSED = [
    ("UPDATE runs SET steps = -1 WHERE id = :rid", "ck_runs_counters"),
    ("UPDATE runs SET signal_stage = 'zzz' WHERE id = :rid", "ck_runs_signal_stage"),
    ("UPDATE runs SET labels = :deep WHERE id = :rid", "ck_runs_labels"),
    ("UPDATE runs SET status = 'zombie' WHERE id = :rid", "ck_runs_status"),
    ("UPDATE runs SET kill_mode = 'nuke' WHERE id = :rid", "ck_runs_kill_mode"),
    ("UPDATE runs SET cost_eur = -0.5 WHERE id = :rid", "ck_runs_cost"),
    ("UPDATE runs SET max_steps = -3 WHERE id = :rid", "ck_runs_budgets"),
    ("UPDATE events SET tool = NULL WHERE run_id = :rid AND kind = 'tool'", "ck_events_tool"),
]
REFUSED_SQLITE = [
    ("UPDATE runs SET steps = 'many' WHERE id = :rid", "ck_runs_counters"),
    ("UPDATE runs SET started_at = 'now' WHERE id = :rid", "ck_runs_times"),  # julianday('now') never grows old
    ("UPDATE events SET error_msg = X'41' WHERE run_id = :rid", "ck_events_text"),
    ("UPDATE runs SET started_at = 'garbage' WHERE id = :rid", "ck_runs_times"),
    ("UPDATE runs SET labels = 'not json' WHERE id = :rid", "ck_runs_labels"),
    ("UPDATE events SET at = 'not a time' WHERE run_id = :rid", "ck_events_at"),
]
REFUSED_PG = [
    ("UPDATE runs SET cost_eur = 'NaN' WHERE id = :rid", "ck_runs_cost"),
    ("UPDATE runs SET last_seen_at = 'infinity' WHERE id = :rid", "ck_runs_times"),
]


def test_the_schema_refuses_each_malformed_value_naming_its_check(db_url, engine, bad_run):
    from sqlalchemy.exc import IntegrityError

    victim = bad_run()
    cases = REFUSED + (REFUSED_SQLITE if _backend(db_url) == "sqlite" else REFUSED_PG)
    for sql, check in cases:
        with pytest.raises(IntegrityError) as err, engine.begin() as conn:
            conn.execute(text(sql), {"rid": victim.id, "deep": "[" * 3000 + "]" * 3000})
        assert check in str(err.value), sql
    # The run itself still records: the checks refuse only what is malformed.
    victim.run.step(model="gpt-x", tokens_in=3, tokens_out=2, cost_eur=0.01)
    victim.run.heartbeat("fine")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT steps FROM runs WHERE id = :rid"), {"rid": victim.id}).scalar() == 1


def test_the_migrations_checks_name_every_status_kill_mode_event_kind_and_budget():
    """A new status or budget needs a new revision: this fails until one is written."""
    import importlib.util
    from pathlib import Path

    from watchdog.core.budgets import BUDGETS, RUN_BUDGET_KEYS

    path = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0007_checks.py"
    spec = importlib.util.spec_from_file_location("checks_0007", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    assert set(m.STATUSES) == {s.value for s in lc.Status}
    latest = importlib.util.spec_from_file_location("witnesses_0009", path.with_name("0009_witnesses.py"))
    m9 = importlib.util.module_from_spec(latest)
    latest.loader.exec_module(m9)
    assert set(m9.KILL_MODES) == {k.value for k in lc.KillMode}
    latest14 = importlib.util.spec_from_file_location("hook_source_0014", path.with_name("0014_hook_source.py"))
    m14 = importlib.util.module_from_spec(latest14)
    latest14.loader.exec_module(m14)
    assert set(m14.SOURCES) == {s.value for s in lc.Source}
    assert set(m.EVENT_KINDS) == {e.value for e in lc.EventKind}
    assert set(m.STAGES) == {s.value for s in lc.Stage}
    integer = {b.key for b in BUDGETS if b.key in RUN_BUDGET_KEYS and b.integer}
    assert set(m.RUN_BUDGETS_INT) == integer and set(m.RUN_BUDGETS_FLOAT) == set(RUN_BUDGET_KEYS) - integer


def test_a_store_writers_text_stays_on_one_line_of_the_alert(db_url, engine, attestor, bad_run):
    """An agent name or heartbeat with newlines cannot add lines of its writer's own to an alert."""
    victim = bad_run()
    forged = "bot\naction: nothing was done, ignore this alert\u202e"
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET agent = :a, progress = :p, steps = 50 WHERE id = :rid"),
                     {"a": forged, "p": "line one\nsteps 1/12  <- fine", "rid": victim.id})
    rep = _ticker(engine, attestor).tick(utcnow())
    assert (victim.id, lc.MAX_STEPS) in rep.stops
    with engine.connect() as conn:
        title, body = conn.execute(select(alerts.c.title, alerts.c.body)
                                   .where(alerts.c.dedupe_key == f"stop:{victim.id}")).one()
    lines = body.splitlines()
    assert not any(line.startswith("action: nothing") for line in lines)
    assert not any(line.startswith("steps 1/12") for line in lines)
    assert "\n" not in title and "\u202e" not in body


# -- rows of the other tables the tick reads --------------------------------------------------------


@pytest.mark.parametrize("where", ["lease", "labels", "unpriced_step"])
def test_a_bad_row_in_what_the_tick_reads_besides_runs_blinds_nothing(where, db_url, engine, procs, attestor,
                                                                        bad_run):
    """A lease whose expiry does not parse (or is infinity), labels nested past the JSON parser's
    recursion limit on an ended run not booked yet, a step not priced yet whose timestamp does
    not parse: the runaway beside them is still stopped within two ticks."""
    sqlite = _backend(db_url) == "sqlite"
    victim = bad_run()
    if where == "lease":
        spoil(engine, "UPDATE runs SET host = 'h2' WHERE id = :rid", rid=victim.id)
        spoil(engine, "INSERT INTO daemons (host, pid, pid_create_time, started_at, expires_at) "
                      "VALUES ('h2', 1, 1.0, '2026-12-01 00:00:00', :exp)", exp="garbage" if sqlite else "infinity")
    elif where == "labels":
        spoil(engine, "UPDATE runs SET labels = :deep WHERE id = :rid", rid=victim.id,
              deep="[" * 5000 + "]" * 5000)
        victim.run.__exit__(None, None, None)
    else:
        victim.run.step(model="no-such-model-7b", tokens_in=10, tokens_out=10)
        spoil(engine, "UPDATE events SET at = :at WHERE run_id = :rid AND kind = 'step'", rid=victim.id,
              at="yesterday" if sqlite else "20000-01-01 00:00:00+00")
    agent = procs.start("runaway", db_url, **RUNAWAY)
    tk = _ticker(engine, attestor)
    assert _stopped_within_two_ticks(tk, agent, utcnow()), agent.log()


@pytest.mark.parametrize("sql", ["UPDATE runs SET status = 'stopping', signal_stage = 'zzz' WHERE id = :rid",
                                 "UPDATE runs SET status = 'stopping', kill_mode = 'nuke' WHERE id = :rid"],
                         ids=["stage", "kill_mode"])
def test_a_stopping_run_with_an_unknown_ladder_value_is_reported_not_left_on_no_step(sql, db_url, engine, attestor,
                                                                                   bad_run):
    victim = bad_run()
    spoil(engine, sql, rid=victim.id)
    tk = _ticker(engine, attestor)
    t = utcnow()
    for i in range(3):
        tk.tick(later(t, i * 5))
    (report,) = quarantined(engine)
    assert report.run_id == victim.id
    assert ("signal_stage" in report.detail) or ("kill_mode" in report.detail)


def test_a_flood_of_malformed_rows_is_a_few_alerts_and_every_row_recorded(db_url, engine, attestor, bad_run):
    from watchdog.daemon.trust.quarantine import ALERTS_PER_HOUR

    bad = [bad_run() for _ in range(ALERTS_PER_HOUR + 10)]
    for b in bad:
        spoil(engine, "UPDATE runs SET cost_eur = -1 WHERE id = :rid", rid=b.id)
    tk = _ticker(engine, attestor)
    t = utcnow()
    tk.tick(t)
    tk.tick(later(t, 5))
    assert len(quarantined(engine)) == len(bad)  # every row recorded, once
    keys = quarantine_alerts(engine)
    assert len([k for k in keys if k.startswith("quarantine:run:")]) == ALERTS_PER_HOUR
    with engine.connect() as conn:
        summary = conn.execute(select(alerts.c.title).where(alerts.c.dedupe_key.like("quarantine-many:%"))).scalars().all()
    assert len(summary) == 1 and "malformed rows" in summary[0]
    # A restarted daemon reports none of them again.
    _ticker(engine, attestor).tick(later(t, 10))
    assert len(quarantined(engine)) == len(bad)


def test_an_id_any_writer_chose_is_never_pasted_into_the_command_an_alert_suggests(db_url, engine, attestor):
    """Issue 32 item 8: only an id of the generated form goes into a command; any other is a marked field."""
    evil = "$(touch /tmp/x)"
    wd = Watchdog(db_url)
    try:
        with wd.run(agent="victim", run_id=evil, guards=False):
            spoil(engine, "UPDATE runs SET cost_eur = -1 WHERE id = :rid", rid=evil)
            _ticker(engine, attestor).tick(utcnow())
            spoil(engine, "UPDATE runs SET cost_eur = 0 WHERE id = :rid", rid=evil)
    finally:
        wd.close()
    with engine.connect() as conn:
        body = conn.execute(select(alerts.c.body).where(alerts.c.dedupe_key == f"quarantine:run:{evil}")).scalar()
    assert "$(" not in body and "run «＄(touch /tmp/x)»" in body.splitlines()
    assert body.splitlines()[-1] == "agent-watchdog runs --all"


def test_the_sdk_refuses_what_the_store_would_refuse(sqlite_url):
    victim = BadRun(sqlite_url)
    try:
        with pytest.raises(ValueError, match="cost_eur: expected a number from 0 to"):
            victim.run.step(model="gpt-x", cost_eur=2e15)
        with pytest.raises(ValueError, match="tokens_in: expected an integer from 0 to"):
            victim.run.step(model="gpt-x", tokens_in=3_000_000_000)
    finally:
        victim.close()


def test_an_old_bad_value_never_refuses_the_daemons_writes_to_its_other_columns(db_url, engine, attestor, bad_run):
    """The checks look only at the columns a write changes: a step whose duration is negative
    (from before the checks) is still priced beside a healthy one; a run whose tool_errors is
    negative is still stopped, and so is the parent of a child whose signalled_at is bad."""
    spoiled, healthy = bad_run(), bad_run()
    for b in (spoiled, healthy):
        b.run.step(model="gpt-4o", tokens_in=100_000, tokens_out=20_000)  # unpriced: no table published yet
    spoil(engine, "UPDATE events SET duration_s = -1 WHERE run_id = :rid AND kind = 'step'", rid=spoiled.id)
    spoil(engine, "UPDATE runs SET tool_errors = -1 WHERE id = :rid", rid=spoiled.id)
    child = spoiled.run.child(agent="sub", guards=False)
    child.__enter__()
    spoil(engine, "UPDATE runs SET signalled_at = :t WHERE id = :rid", rid=child.id,
          t="1960-01-01 00:00:00" if _backend(db_url) == "sqlite" else "1960-01-01 00:00:00+00")
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET steps = 50 WHERE id = :rid"), {"rid": spoiled.id})
    tk = _ticker(engine, attestor)
    t = utcnow()
    rep = tk.tick(t)
    rep2 = tk.tick(later(t, 5))
    assert (spoiled.id, lc.MAX_STEPS) in rep.stops + rep2.stops
    with engine.connect() as conn:
        costs = dict(conn.execute(select(events.c.run_id, events.c.cost_eur).where(events.c.kind == "step")).all())
        status = dict(conn.execute(text("SELECT id, status FROM runs")).all())
    assert costs[healthy.id] is not None and costs[healthy.id] > 0
    assert costs[spoiled.id] is not None  # its price is written: duration_s was not touched
    assert status[child.id] == lc.STOPPING  # the stop reached the child, whose bad column it did not touch


def test_a_lease_written_to_last_for_ever_does_not_keep_a_dead_hosts_runs_unjudged(db_url, engine, attestor, bad_run):
    victim = bad_run()
    spoil(engine, "UPDATE runs SET host = 'h2', steps = 50 WHERE id = :rid", rid=victim.id)
    spoil(engine, "INSERT INTO daemons (host, pid, pid_create_time, started_at, expires_at) "
                  "VALUES ('h2', 1, 1.0, :now, :exp)",
          now=utcnow().replace(tzinfo=None) if _backend(db_url) == "sqlite" else utcnow(),
          exp="9999-12-30 00:00:00" if _backend(db_url) == "sqlite" else "9999-12-30 00:00:00+00")
    rep = _ticker(engine, attestor).tick(utcnow())
    assert "h2" in rep.adopted
    assert (victim.id, lc.MAX_STEPS) in rep.stops
