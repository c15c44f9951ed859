"""Issue 35: every run's new tool calls grouped by tool in PostgreSQL (watchdog.store.toolcounts),
and the sharded leader's ToolWatch built on it (watchdog.daemon.tick.toolwatch): what the circuits,
the all-runs tool rate and the money's unpriced steps are given is what a row per event gave them.
A Reach's bucket mask (watchdog.store.shards.Reach.mask) selects in SQL what `covers` says."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import insert, select, text

from pg_support import emptied_engine, insert_runs, raw
from watchdog.daemon.tick.toolwatch import ToolWatch
from watchdog.store import shards, toolcounts
from watchdog.store.engine import read_connection
from watchdog.store.schema import events, utcnow

pytestmark = pytest.mark.postgres


@pytest.fixture
def engine(pg_migrated):
    with emptied_engine(pg_migrated) as eng:
        yield eng




def _events(engine, rows: list[dict]) -> list[int]:
    with engine.begin() as conn:
        return [conn.execute(insert(events).values(**r).returning(events.c.id)).scalar_one() for r in rows]


def test_grouped_calls_hold_every_id_time_failure_and_unpriced_step(engine):
    a, b = insert_runs(engine, 2)
    t0 = utcnow().replace(microsecond=250_000)
    before = _events(engine, [dict(run_id=a, seq=1, kind="tool", tool="search", ok=True, at=t0)])
    ids = _events(engine, [
        dict(run_id=a, seq=2, kind="tool", tool="search", ok=True, at=t0 + dt.timedelta(seconds=1)),
        dict(run_id=b, seq=1, kind="tool", tool="search", ok=False, at=t0 + dt.timedelta(seconds=2)),
        dict(run_id=b, seq=2, kind="tool", tool="fetch", ok=True, at=t0 + dt.timedelta(seconds=3)),
        dict(run_id=a, seq=3, kind="step", at=t0, tokens_in=1, tokens_out=1),  # no cost: the backfill's
        dict(run_id=b, seq=3, kind="step", at=t0, tokens_in=1, tokens_out=1, cost_eur=0.1),
        dict(run_id=b, seq=4, kind="heartbeat", at=t0),  # not folded: not read
    ])
    with engine.connect() as conn:
        got = {(g.kind, g.tool): g for g in toolcounts.grouped_calls(conn, before[0])}
        late = {(g.kind, g.tool): g for g in toolcounts.grouped_calls(conn, ids[-1], [before[0]])}
    assert set(got) == {("tool", "search"), ("tool", "fetch"), ("step", None)}
    search = got[("tool", "search")]
    assert sorted(search.ids) == ids[:2] and search.failed
    assert search.at_s == [(t0 + dt.timedelta(seconds=s)).timestamp() for s in (1, 2)]  # to the microsecond
    assert not got[("tool", "fetch")].failed and got[("tool", "fetch")].at_s == [(t0 + dt.timedelta(seconds=3)).timestamp()]
    assert sorted(got[("step", None)].ids) == ids[3:5] and got[("step", None)].unpriced == [ids[3]]
    assert got[("step", None)].at_s == []
    # A late id below the mark: read with those above it (none here).
    assert set(late) == {("tool", "search")} and late[("tool", "search")].ids == before


def test_the_tool_watch_gives_the_circuits_the_failing_tools_and_the_rate_each_call_once(engine):
    a, b = insert_runs(engine, 2)
    now = utcnow()
    _events(engine, [dict(run_id=a, seq=1, kind="tool", tool="search", ok=True, at=now - dt.timedelta(seconds=90))])
    watch = ToolWatch()
    with read_connection(engine) as conn:
        cold = watch.read(conn, [a, b])  # the active runs' history
    assert [(c.tool, c.ok) for c in cold] == [("search", True)]
    assert watch.tool_rates(now) == {}  # ninety seconds ago: out of the minute
    _events(engine, [
        dict(run_id=a, seq=2, kind="tool", tool="search", ok=True, at=now - dt.timedelta(seconds=30)),
        dict(run_id=b, seq=1, kind="tool", tool="search", ok=False, at=now - dt.timedelta(seconds=5)),
        dict(run_id=b, seq=2, kind="tool", tool="fetch", ok=True, at=now + dt.timedelta(seconds=2)),
        dict(run_id=b, seq=3, kind="step", at=now, tokens_in=1, tokens_out=1),
    ])
    with read_connection(engine) as conn:
        calls = watch.read(conn, [a, b])
        step_id = conn.execute(select(events.c.id).where(events.c.kind == "step")).scalar_one()
    assert sorted((c.tool, c.ok) for c in calls) == [("fetch", True), ("search", False)]
    assert watch.unpriced_ids == [step_id]
    assert watch.tool_rates(now) == {"search": 2}  # fetch's call is dated ahead: not yet
    assert watch.tool_rates(now + dt.timedelta(seconds=3)) == {"search": 2, "fetch": 1}
    assert watch.tool_rates(now + dt.timedelta(seconds=40)) == {"search": 1, "fetch": 1}
    with read_connection(engine) as conn:
        assert watch.read(conn, [a, b]) == []  # nothing new: nothing read twice
    assert watch.tool_rates(now + dt.timedelta(seconds=70)) == {}


def test_a_reach_s_bucket_mask_selects_in_sql_what_covers_says(engine):
    ids = insert_runs(engine, 300)
    reach = shards.Reach(["nohost"], shards.buckets_of([1, 6, 7], 16))
    with engine.connect() as conn:
        got = set(conn.execute(text("SELECT id FROM runs WHERE " + shards.bucket_mask_sql("shard", ":m")),
                               {"m": reach.mask}).scalars())
    assert got == {rid for rid in ids if reach.covers(rid, "elsewhere")}
    assert 0 < len(got) < len(ids)


def test_a_call_committed_below_the_watch_s_mark_is_read_once_in_its_late_window(engine, pg_migrated):
    a, b = insert_runs(engine, 2)
    now = utcnow()
    watch = ToolWatch()
    with read_connection(engine) as conn:
        watch.read(conn, [a, b])
    with raw(pg_migrated) as slow:  # a writer that took its event's id, then commits late
        slow.execute("INSERT INTO events (run_id, seq, kind, tool, ok, at) VALUES (%s, 1, 'tool', 'slow', false, %s)",
                     (a, now))
        _events(engine, [dict(run_id=b, seq=1, kind="tool", tool="fast", ok=True, at=now)])
        with read_connection(engine) as conn:
            assert [c.tool for c in watch.read(conn, [a, b])] == ["fast"]  # the mark passed the open one
        slow.commit()
    with read_connection(engine) as conn:
        assert [(c.tool, c.ok) for c in watch.read(conn, [a, b])] == [("slow", False)]
    with read_connection(engine) as conn:
        assert watch.read(conn, [a, b]) == []  # once
    assert watch.tool_rates(now) == {"fast": 1, "slow": 1}
