"""Retention, sealing and paginated listing on both stores.

Rows are written with plain SQLAlchemy inserts dated in the past (retention is
about old rows; the SDK would date them now); the daemon's part is driven
through `Ticker.tick`, the command through the real click group.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest
from click.testing import CliRunner
from sqlalchemy import func, insert, select

from daemon_support import SEALER, config
from watchdog.cli import main
from watchdog.cli.store_cmds import parse_age
from watchdog.core import lifecycle as lc
from watchdog.core.config import parse
from watchdog.daemon.leases.cluster import Membership
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.leases.lease import lease_for
from watchdog.daemon.tick.ticker import Ticker
from watchdog.errors import ConfigError
from watchdog.store import retention, views
from watchdog.store.schema import alerts, daemons, events, interventions, runs, utcnow

DAY = dt.timedelta(days=1)


def _ago(days: float) -> dt.datetime:
    return utcnow() - days * DAY


def _run(engine, *, ended_days=None, started_days=None, status=None, tools=(), alerts_delivered=(), agent="bot"):
    """A run with tool events (name, ok) and per-alert delivered flags, dated in the past."""
    rid = uuid.uuid4().hex
    started = _ago(started_days if started_days is not None else (ended_days or 0) + 0.01)
    ended = _ago(ended_days) if ended_days is not None else None
    status = status or (lc.COMPLETED if ended is not None else lc.RUNNING)
    with engine.begin() as conn:
        conn.execute(insert(runs).values(id=rid, agent=agent, status=status, kill_mode="cooperative", host="h",
                                         started_at=started, last_seen_at=ended or started, ended_at=ended,
                                         tool_calls=len(tools), tool_errors=sum(1 for _, ok in tools if not ok)))
        for seq, (tool, ok) in enumerate(tools, 1):
            conn.execute(insert(events).values(run_id=rid, seq=seq, at=started, kind="tool", tool=tool, ok=ok))
        iv = conn.execute(insert(interventions).values(at=started, run_id=rid, action="stop_requested", actor="t"))
        conn.execute(insert(interventions).values(at=started, run_id=rid, action="ended", actor="t"))
        for i, delivered in enumerate(alerts_delivered):
            conn.execute(insert(alerts).values(dedupe_key=f"k:{rid}:{i}", created_at=started, run_id=rid,
                                               intervention_id=iv.inserted_primary_key[0], title="t", body="b",
                                               delivered_at=(ended or started) if delivered else None))
    return rid


def _loose(engine, days, *, delivered=True):
    at = _ago(days)
    with engine.begin() as conn:
        conn.execute(insert(interventions).values(at=at, action="circuit_open", tool="search", actor="t"))
        conn.execute(insert(alerts).values(dedupe_key=f"c:{uuid.uuid4().hex}", created_at=at, title="t", body="b",
                                           delivered_at=at if delivered else None))


def _count(engine, table) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


def _ids(engine) -> set:
    with engine.connect() as conn:
        return set(conn.execute(select(runs.c.id)).scalars())


@pytest.fixture
def aged(engine):
    rows = {
        "old": _run(engine, ended_days=40, tools=[("search", True)] * 4 + [("verify", False)], alerts_delivered=[True]),
        "old2": _run(engine, ended_days=35, status=lc.KILLED, tools=[("fetch", True)] * 3),
        "undelivered": _run(engine, ended_days=40, tools=[("search", True)], alerts_delivered=[True, False]),
        "recent": _run(engine, ended_days=1, tools=[("search", True)] * 2, alerts_delivered=[True]),
        "running": _run(engine, started_days=40, tools=[("search", True)]),
    }
    _loose(engine, 40)
    _loose(engine, 40, delivered=False)
    _loose(engine, 1)
    with engine.begin() as conn:
        conn.execute(insert(daemons).values(host="gone-host", pid=1, pid_create_time=1.0, started_at=_ago(50),
                                            expires_at=_ago(45)))
    return rows


def test_prune_deletes_old_ended_runs_with_their_rows_and_keeps_everything_else(engine, aged):
    cutoff = _ago(30)
    planned = retention.count(engine, cutoff)
    assert (planned.runs, planned.events, planned.interventions, planned.alerts, planned.hosts) == (2, 8, 6, 2, 1)
    done = retention.prune(engine, cutoff, runs_per_batch=1, rows_per_batch=2)  # many tiny transactions
    assert (done.runs, done.events, done.interventions, done.alerts, done.hosts) == (2, 8, 6, 2, 1)
    assert done.complete and done.batches > 8
    assert _ids(engine) == {aged["undelivered"], aged["recent"], aged["running"]}
    assert _count(engine, events) == 1 + 2 + 1
    assert _count(engine, interventions) == 3 * 2 + 1  # the kept runs' and the recent circuit change
    assert _count(engine, alerts) == 2 + 1 + 2  # undelivered run's two, recent's one, the undelivered + recent loose
    with engine.connect() as conn:
        assert conn.execute(select(daemons.c.host)).scalars().all() == []
    assert retention.count(engine, cutoff).runs == 0  # nothing left to do
    assert "pruned 2 ended runs with 8 events, 6 interventions and 2 delivered alerts" in done.summary()


def test_a_prune_out_of_time_stops_between_batches_and_the_next_one_finishes(engine, aged):
    cutoff = _ago(30)
    first = retention.prune(engine, cutoff, budget_s=0)
    assert not first.complete and first.runs == 0
    assert "more left for the next round" in first.summary()
    rest = retention.prune(engine, cutoff)
    assert rest.complete and rest.runs == 2


def test_db_prune_by_hand_dry_run_then_for_real(db_url, engine, aged):
    dry = CliRunner().invoke(main, ["db", "prune", "--older-than", "30d", "--dry-run", "--db", db_url])
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith("would prune 2 ended runs with 8 events, 6 interventions and 2 delivered alerts")
    assert len(_ids(engine)) == 5
    keep_week = CliRunner().invoke(main, ["db", "prune", "--older-than", "6w", "--db", db_url])  # 42 days
    assert keep_week.exit_code == 0 and keep_week.output.startswith("pruned 0 ended runs")
    real = CliRunner().invoke(main, ["db", "prune", "--db", db_url])  # default: [store] keep_days = 30
    assert real.exit_code == 0, real.output
    assert real.output.startswith("pruned 2 ended runs with 8 events")
    assert len(_ids(engine)) == 3


def test_db_prune_refuses_a_bad_age_and_a_disabled_retention_without_one(db_url, tmp_path):
    bad = CliRunner().invoke(main, ["db", "prune", "--older-than", "soon", "--db", db_url])
    assert bad.exit_code == 2 and "expected an age such as 30d, 12h or 90m, got 'soon'" in bad.output
    cfg = tmp_path / "wd.toml"
    cfg.write_text("[store]\nkeep_days = 0\n")
    off = CliRunner().invoke(main, ["db", "prune", "--db", db_url, "--config", str(cfg)])
    assert off.exit_code == 1
    assert "retention is off ([store] keep_days = 0): give --older-than AGE" in off.output


def test_ages_and_keep_days_are_parsed_strictly():
    assert [parse_age(a) for a in ("30d", "12h", "90m", "3600s", "2w", "7", "0.5d")] == [
        30 * 86400, 12 * 3600, 90 * 60, 3600, 14 * 86400, 7 * 86400, 43200]
    assert parse({}).store.keep_days == 30
    assert parse({"store": {"keep_days": 0}}).store.keep_days == 0
    for bad in (-1, "30d", True):
        with pytest.raises(ConfigError, match="store.keep_days"):
            parse({"store": {"keep_days": bad}})


def _ticker(engine, host, lease=None, keep_days=30):
    return Ticker(engine, config(store={"keep_days": keep_days}), Killer(host=host),
                  membership=Membership(engine, host, lease), sealer=SEALER)


# A follower exists only on PostgreSQL: on SQLite (one host) the daemon holding the store's lock
# file is its sole daemon and leader (issue 20: no row decides it).
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_leader_prunes_on_its_ticks_and_a_follower_never_does(engine, aged):
    leader = lease_for(engine, "h1", tick_s=1.0, alive=lambda h: True)
    follower = lease_for(engine, "h2", tick_s=1.0, alive=lambda h: True)
    leader.acquire()
    follower.acquire()
    try:
        assert leader.refresh() and not follower.refresh()
        _ticker(engine, "h2", follower).tick(utcnow())
        assert len(_ids(engine)) == 5
        tk = _ticker(engine, "h1", leader)
        tk.tick(utcnow())
        if not tk.duties.last_prune.complete:  # a loaded machine: the budget is a fifth of a tick
            for _ in range(50):
                tk.tick(utcnow())
        assert aged["old"] not in _ids(engine) and aged["recent"] in _ids(engine)
    finally:
        leader.release()
        follower.release()


def test_retention_off_keeps_everything(engine, aged):
    _ticker(engine, "h1", keep_days=0).tick(utcnow())
    assert len(_ids(engine)) == 5


# -- sealing and listing ------------------------------------------------------------------------


def test_ended_runs_are_sealed_once_and_list_the_same_top_tool(db_url, engine, aged):
    cfg = config()
    with engine.connect() as conn:
        before = views.list_runs(conn, cfg, utcnow(), all_runs=True, limit=10)
    assert retention.seal_ended(engine) == 4  # the ended ones
    assert retention.seal_ended(engine) == 0
    with engine.connect() as conn:
        sealed = {r.id: (r.top_tool, r.top_tool_calls, r.top_tool_errors) for r in conn.execute(select(runs))}
        after = views.list_runs(conn, cfg, utcnow(), all_runs=True, limit=10)
    assert sealed[aged["old"]] == ("search", 4, 0)
    assert sealed[aged["old2"]] == ("fetch", 3, 0)
    assert sealed[aged["running"]] == (None, None, None)  # active: computed live
    strip = lambda recs: [{k: v for k, v in r.items() if k != "duration_s"} for r in recs]  # noqa: E731
    assert strip(after) == strip(before)
    assert [r["top_tool"] for r in after if r["id"] == aged["old"]] == [{"name": "search", "calls": 4, "errors": 0}]


def test_a_run_without_tools_is_sealed_as_such(engine):
    rid = _run(engine, ended_days=2)
    retention.seal_ended(engine)
    with engine.connect() as conn:
        row = conn.execute(select(runs).where(runs.c.id == rid)).one()
        assert (row.top_tool, row.top_tool_calls) == (None, 0)
        assert views.list_runs(conn, config(), utcnow(), all_runs=True)[0]["top_tool"] is None


def test_runs_pages_follow_each_other_without_gaps_or_repeats(db_url, engine):
    same = _ago(3)
    ids = [_run(engine, ended_days=d) for d in (5, 4, 2, 1)]
    twins = []
    for _ in range(3):  # equal start times: the id breaks the tie
        rid = uuid.uuid4().hex
        with engine.begin() as conn:
            conn.execute(insert(runs).values(id=rid, agent="bot", status=lc.COMPLETED, kill_mode="cooperative",
                                             host="h", started_at=same, last_seen_at=same, ended_at=same))
        twins.append(rid)
    seen = []
    before = None
    for _ in range(10):
        args = ["runs", "--all", "--limit", "2", "--json", "--db", db_url] + (["--before", before] if before else [])
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 0, out.output
        page = json.loads(out.stdout)  # stderr may say no daemon watches the store
        if not page:
            break
        seen += [r["id"] for r in page]
        before = page[-1]["id"]
    assert len(seen) == len(set(seen)) == 7
    with engine.connect() as conn:
        order = conn.execute(select(runs.c.id).order_by(runs.c.started_at.desc(), runs.c.id.desc())).scalars().all()
    assert seen == order
    assert set(ids + twins) == set(seen)
