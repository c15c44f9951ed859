"""A read of rows anyone may have written (watchdog.store.isolated.chunk_read): on PostgreSQL a
bad value fails in the driver and leaves the snapshot usable, so no SAVEPOINT round trips; a
read the server itself fails is an outage (the tick is retried), and savepoints from then on."""

from __future__ import annotations

import pytest
from sqlalchemy import event, text

from watchdog.store import isolated
from watchdog.store.engine import read_connection, store_unavailable


def _statements(engine) -> list[str]:
    sent: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    return sent


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_value_the_driver_refuses_costs_no_savepoint_and_leaves_the_snapshot(db_url, engine,
                                                                                         monkeypatch):
    monkeypatch.setattr(isolated._Savepoints, "always", False)
    sent = _statements(engine)
    with read_connection(engine) as conn:
        with pytest.raises(Exception) as got:
            with isolated.chunk_read(conn):
                conn.execute(text("SELECT 'infinity'::timestamptz")).all()  # psycopg: past year 9999
        assert not store_unavailable(got.value)  # a bad value, not an outage: the caller reads key by key
        assert conn.execute(text("SELECT 2")).scalar() == 2  # the snapshot goes on
    assert not any("SAVEPOINT" in s for s in sent)
    assert not isolated._Savepoints.always


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_a_read_the_server_fails_is_an_outage_and_savepoints_follow(db_url, engine, monkeypatch):
    monkeypatch.setattr(isolated._Savepoints, "always", False)
    with read_connection(engine) as conn:
        with pytest.raises(Exception) as got:
            with isolated.chunk_read(conn):
                conn.execute(text("SELECT 1 / (SELECT count(*) FROM runs WHERE false)")).all()
        assert store_unavailable(got.value)  # never a defect of the rows it read: the tick is retried
    assert isolated._Savepoints.always
    sent = _statements(engine)
    with read_connection(engine) as conn:
        with isolated.chunk_read(conn):
            assert conn.execute(text("SELECT 3")).scalar() == 3
    assert any(s.startswith("SAVEPOINT") for s in sent)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sqlite_reads_in_a_savepoint(db_url, engine):
    sent = _statements(engine)
    with read_connection(engine) as conn:
        with isolated.chunk_read(conn):
            assert conn.execute(text("SELECT 1")).scalar() == 1
    assert any(s.startswith("SAVEPOINT") for s in sent)
