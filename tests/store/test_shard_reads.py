"""Issue 35, revision 0016: the stored bucket of each run and event, and a judge's reads confined
to its Reach (watchdog.store.shards) on PostgreSQL.

The bucket is the database's: a writer cannot give a run or an event another one (a generated
column refuses it; the events trigger overwrites it), and the database computes what Python's
`bucket_of` does, so a judge's reads and its `owns` agree on every run."""

from __future__ import annotations


import pytest
from sqlalchemy import insert, text, update
from sqlalchemy.exc import DBAPIError

from pg_support import emptied_engine, insert_runs
from watchdog.store import scan, shards
from watchdog.store.changes import ChangeFeed
from watchdog.store.engine import read_connection
from watchdog.store.schema import events, runs, utcnow

pytestmark = pytest.mark.postgres

N = 4  # shards


@pytest.fixture
def engine(pg_migrated):
    with emptied_engine(pg_migrated) as eng:
        yield eng




def _step(engine, rid: str, seq: int) -> None:
    with engine.begin() as conn:
        conn.execute(insert(events).values(run_id=rid, seq=seq, kind="step", at=utcnow(), tokens_in=1, tokens_out=1))


def test_the_database_computes_python_s_bucket_and_no_writer_sets_another(engine):
    odd = "é-ü-" + "x" * 28  # a non-ASCII id: its UTF-8 bytes hashed on both sides
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(insert(runs).values(id=odd, agent="bot", status="running", kill_mode="cooperative",
                                         host="elsewhere", started_at=now, last_seen_at=now))
    ids = [odd] + insert_runs(engine, 200)
    for rid in ids[:20]:
        _step(engine, rid, 1)
    with engine.connect() as conn:
        stored = dict(conn.execute(text("SELECT id, shard FROM runs")).all())
        on_events = dict(conn.execute(text("SELECT run_id, shard FROM events")).all())
    assert stored == {rid: shards.bucket_of(rid) for rid in ids}
    assert on_events == {rid: shards.bucket_of(rid) for rid in ids[:20]}
    # A writer aiming its run or its events at another judge: refused, or overwritten.
    other = (shards.bucket_of(ids[0]) + 1) % shards.BUCKETS
    with pytest.raises(DBAPIError, match="generated column"):
        with engine.begin() as conn:
            conn.execute(text("UPDATE runs SET shard = :s WHERE id = :i"), {"s": other, "i": ids[0]})
    with pytest.raises(DBAPIError, match="generated column"):
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO runs (id, agent, status, kill_mode, host, shard) "
                              "VALUES ('aimed', 'bot', 'running', 'cooperative', 'h', :s)"), {"s": other})
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO events (run_id, seq, kind, at, shard) VALUES (:i, 2, 'step', now(), :s)"),
                     {"i": ids[0], "s": other})
        got = conn.execute(text("SELECT shard FROM events WHERE run_id = :i AND seq = 2"), {"i": ids[0]}).scalar()
    assert got == shards.bucket_of(ids[0])


def test_a_judge_reads_its_shards_runs_and_events_and_its_hosts_nothing_else(engine):
    elsewhere = insert_runs(engine, 120)
    here = insert_runs(engine, 5, host="judge-host")
    held = {1, 3}
    reach = shards.Reach({"judge-host"}, shards.buckets_of(held, N))
    mine = {rid for rid in elsewhere if shards.shard_of(rid, N) in held} | set(here)
    assert 0 < len(mine & set(elsewhere)) < len(elsewhere)
    feed = ChangeFeed()
    with read_connection(engine) as conn:
        assert {r[0] for r in scan.active_light(conn, reach)} == mine  # the full read
        feed.mark(conn, reach)
    for rid in elsewhere + here:  # every run changes, with an event each
        _step(engine, rid, 1)
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id.in_(elsewhere[:10])).values(steps=1))
    with read_connection(engine) as conn:
        got = scan.changed_light(conn, feed, reach)
        folded = [e.run_id for e in scan.read_events(conn, scan.EventSelection.folded_above(0, reach),
                                                      isolated=None, defects=[])[0]]
        ids_in_window = scan.folded_ids_between(conn, 0, 10**9, reach)
        window = scan.folded_sum_between(conn, 0, 10**9, reach)
    assert {r[0] for r in got.rows} == mine and got.ids == mine  # the feed: only the reach's runs
    assert sorted(folded) == sorted(mine)  # the new events: only theirs
    assert len(ids_in_window) == window.n == len(mine)  # the late window counts the same events
    assert shards.Reach({"a"}, [1]) != shards.Reach({"a"}, [2]) and shards.Reach({"a"}, [1]) != frozenset({"a"})


def test_a_reachs_feed_reads_its_late_commits_once_and_not_the_others(engine, pg_migrated):
    """The reach's late window reads every number below its cursor unconfined and reads whole
    only those the read before did not see (issue 35): a run of the reach (by its shard, or on
    its host) whose change commits after a later one is still read, once; another judge's run
    committed late is not read; a number seen before is not read again."""
    import psycopg
    from sqlalchemy import make_url

    elsewhere = insert_runs(engine, 60)
    here = insert_runs(engine, 2, host="judge-host")
    held = {0, 2}
    reach = shards.Reach({"judge-host"}, shards.buckets_of(held, N))
    by_shard = [rid for rid in elsewhere if shards.shard_of(rid, N) in held]
    theirs = [rid for rid in elsewhere if shards.shard_of(rid, N) not in held]
    feed = ChangeFeed()

    def read() -> list[str]:
        with read_connection(engine) as conn:
            return sorted(scan.changed_light(conn, feed, reach).ids)

    with read_connection(engine) as conn:
        feed.mark(conn, reach)
    assert read() == []
    dsn = make_url(pg_migrated).set(drivername="postgresql").render_as_string(hide_password=False)
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(4)]
    slow_mine, slow_host, slow_theirs, fast = conns
    try:
        for _ in range(2):  # twice: the first read after mark is confined, the next ones are not
            for c in (slow_mine, slow_host, slow_theirs):
                c.execute("BEGIN")
            slow_mine.execute("UPDATE runs SET progress = 'slow' WHERE id = %s", (by_shard[0],))
            slow_host.execute("UPDATE runs SET progress = 'slow' WHERE id = %s", (here[0],))
            slow_theirs.execute("UPDATE runs SET progress = 'slow' WHERE id = %s", (theirs[0],))
            fast.execute("UPDATE runs SET progress = 'fast' WHERE id = %s", (by_shard[1],))  # a later number
            fast.execute("UPDATE runs SET progress = 'fast' WHERE id = %s", (theirs[1],))
            assert read() == [by_shard[1]]
            for c in (slow_mine, slow_host, slow_theirs):
                c.execute("COMMIT")
            assert read() == sorted([by_shard[0], here[0]])  # below the cursor: read once, only the reach's
            assert read() == []
            fast.execute("UPDATE runs SET progress = 'again' WHERE id = %s", (theirs[2],))
            assert read() == []
    finally:
        for c in conns:
            c.close()
