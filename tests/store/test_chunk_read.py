"""A read of rows anyone may have written (watchdog.store.scan.chunk_read): on PostgreSQL a
bad value fails in the driver and leaves the snapshot usable, so no SAVEPOINT round trips; a
read the server itself fails is an outage (the tick is retried), and savepoints from then on."""

from __future__ import annotations

import pytest
from sqlalchemy import event, text

from watchdog.store import scan
from watchdog.store.engine import read_connection, store_unavailable


def _statements(engine) -> list[str]:
    sent: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    return sent


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_value_the_driver_refuses_costs_no_savepoint_and_leaves_the_snapshot(db_url, engine,
                                                                                         monkeypatch):
    monkeypatch.setattr(scan._Savepoints, "always", False)
    sent = _statements(engine)
    with read_connection(engine) as conn:
        with pytest.raises(Exception) as got:
            with scan.chunk_read(conn):
                conn.execute(text("SELECT 'infinity'::timestamptz")).all()  # psycopg: past year 9999
        assert not store_unavailable(got.value)  # a bad value, not an outage: the caller reads key by key
        assert conn.execute(text("SELECT 2")).scalar() == 2  # the snapshot goes on
    assert not any("SAVEPOINT" in s for s in sent)
    assert not scan._Savepoints.always


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_read_the_server_fails_is_an_outage_and_savepoints_follow(db_url, engine, monkeypatch):
    monkeypatch.setattr(scan._Savepoints, "always", False)
    with read_connection(engine) as conn:
        with pytest.raises(Exception) as got:
            with scan.chunk_read(conn):
                conn.execute(text("SELECT 1 / (SELECT count(*) FROM runs WHERE false)")).all()
        assert store_unavailable(got.value)  # never a defect of the rows it read: the tick is retried
    assert scan._Savepoints.always
    sent = _statements(engine)
    with read_connection(engine) as conn:
        with scan.chunk_read(conn):
            assert conn.execute(text("SELECT 3")).scalar() == 3
    assert any(s.startswith("SAVEPOINT") for s in sent)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sqlite_reads_in_a_savepoint(db_url, engine):
    sent = _statements(engine)
    with read_connection(engine) as conn:
        with scan.chunk_read(conn):
            assert conn.execute(text("SELECT 1")).scalar() == 1
    assert any(s.startswith("SAVEPOINT") for s in sent)


def test_a_writers_free_text_is_read_bounded_in_whole_rows(db_url, engine):
    """stop_detail, progress and partial hold whatever a writer stored: a whole-row read takes
    RUN_TEXT_READ_MAX_CHARS of each (two 540 MB texts made every read of the row fail on
    PostgreSQL, a result row being at most 1 GB)."""
    import uuid

    from sqlalchemy import insert

    from watchdog.core import lifecycle as lc
    from watchdog.daemon.trust.scan import read_isolated
    from watchdog.store import scan
    from watchdog.store.schema import RUN_TEXT_READ_MAX_CHARS, runs, utcnow

    rid, now = uuid.uuid4().hex, utcnow()
    with engine.begin() as conn:
        conn.execute(insert(runs).values(id=rid, agent="bot", status=lc.RUNNING, kill_mode="cooperative", host="h",
                                         started_at=now, last_seen_at=now, progress="p" * 100_000,
                                         partial="q" * 30_000))
    with read_connection(engine) as conn:
        (row,) = scan.active_rows(conn, [rid], isolated=read_isolated, defects=[], suspects={})
    assert row.id == rid and len(row.progress) == RUN_TEXT_READ_MAX_CHARS and len(row.partial) == RUN_TEXT_READ_MAX_CHARS


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_statement_past_the_servers_limits_is_not_an_outage(db_url, engine):
    """SQLSTATE class 54 (a program limit exceeded: a value past 1 GB) is what was read, not the
    store being down: the rows' own isolation decides, the tick is not failed for ever."""
    with engine.connect() as conn:
        with pytest.raises(Exception) as got:
            conn.execute(text("SELECT repeat('x', 1100000000)")).scalar()
    assert got.value.orig.sqlstate == "54000" and not store_unavailable(got.value)
