"""The SDK's write path (watchdog.store.agent_writes.Writer) on both backends: a record is one
statement on PostgreSQL (its own transaction, in autocommit) and BEGIN IMMEDIATE ... COMMIT on
SQLite; several statements stay one transaction; each pooled connection keeps its cursor."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from watchdog import Watchdog
from watchdog.core.periods import utcnow
from watchdog.store.agent_writes import EVENT_COLUMNS
from watchdog.store.schema import events, runs


def _at(wd: Watchdog) -> object:
    return wd.writer.dialect.seen(utcnow())  # SQLite: this host's time; PostgreSQL: None, the server's


def _event(wd: Watchdog, run_id: str, seq: int) -> tuple[object, ...]:
    # EVENT_COLUMNS' order: run_id, seq, at, kind, then tool ... mac (all NULL for a heartbeat)
    return (run_id, seq, _at(wd), "heartbeat", *(None,) * (len(EVENT_COLUMNS) - 4))


def _update(wd: Watchdog, run_id: str, seq: int) -> tuple[object, ...]:
    # steps, tool_calls, tool_errors, tokens_in, tokens_out, cost_eur, cached, reasoning, unpriced,
    # last_seq, last_seen_at, progress, id
    return (0, 0, 0, 0, 0, 0.0, 0, 0, 0, seq, _at(wd), None, run_id)


def _counts(engine, run_id: str) -> tuple[int, int | None]:
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(events).where(events.c.run_id == run_id)).scalar_one()
        last_seq = conn.execute(select(runs.c.last_seq).where(runs.c.id == run_id)).scalar_one()
    return n, last_seq


def test_a_record_is_one_statement_on_postgresql_and_two_on_sqlite(wd, db_url):
    with wd.run(agent="bot", guards=False) as run:
        run.step(tokens_in=1)
        statements = wd.writer.sql.record(_event(wd, run.id, 99), _update(wd, run.id, 99))
    if db_url.startswith("postgresql"):
        assert len(statements) == 1 and statements[0][0].startswith("WITH ev AS (INSERT INTO events")
        assert len(statements[0][1]) == len(EVENT_COLUMNS) + 13
    else:
        assert [sql.split()[0] for sql, _ in statements] == ["INSERT", "UPDATE"]


def test_the_one_statement_record_reads_the_status_back_and_leaves_no_transaction_open(wd, engine, db_url):
    with wd.run(agent="bot", guards=False) as run:
        run.step(tokens_in=1)
        row = wd.writer.transaction(wd.writer.sql.record(_event(wd, run.id, 2), _update(wd, run.id, 2)))
        assert tuple(row) == ("running", None, None)
        with wd.writer.connection() as conn:
            if db_url.startswith("postgresql"):
                from psycopg.pq import TransactionStatus

                assert conn.dbapi_connection.autocommit is True
                assert conn.dbapi_connection.info.transaction_status == TransactionStatus.IDLE
            else:
                assert conn.in_transaction is False  # COMMIT ended it: no write lock held between records
        seen = _counts(engine, run.id)
    assert seen == (2, 2)


def test_several_statements_stay_one_transaction_when_the_last_fails(wd, engine):
    """Autocommit connections (PostgreSQL) must still wrap a record of several statements in
    BEGIN ... COMMIT: a failure in the last one takes the first back too."""
    with wd.run(agent="bot", guards=False) as run:
        run.step(tokens_in=1)
        sql = wd.writer.sql
        good = (sql.insert_event, _event(wd, run.id, 2))
        duplicate = (sql.insert_event, _event(wd, run.id, 1))  # seq 1 is the step's: a duplicate key
        with pytest.raises(Exception) as caught:
            wd.writer.transaction([good, duplicate])
        assert wd.writer.is_conflict(caught.value)
        assert _counts(engine, run.id) == (1, 1)  # the good insert was rolled back with it
        run.step(tokens_in=1)  # the pool reopened what it dropped: the next record goes through
        assert _counts(engine, run.id) == (2, 2)


def test_every_transaction_of_a_pooled_connection_reuses_its_cursor(db_url):
    wd = Watchdog(db_url, pool_size=1)
    try:
        with wd.run(agent="bot", guards=False) as run:
            run.step(tokens_in=1)
            (slot,) = wd.writer._idle
            for _ in range(5):
                run.record_tool("search", {"q": 1})
            assert wd.writer._idle == [slot]  # the same (connection, cursor) pair, never a new cursor
            assert wd.writer.open_connections == 1
    finally:
        wd.close()


def test_a_read_through_the_pool_leaves_no_transaction_open(wd, db_url):
    with wd.run(agent="bot", guards=False) as run:
        rows = wd.writer.query(wd.writer.sql.select_status, (run.id,))
        assert [tuple(r) for r in rows] == [("running", None, None)]
        with wd.writer.connection() as conn:
            if db_url.startswith("postgresql"):
                from psycopg.pq import TransactionStatus

                assert conn.dbapi_connection.info.transaction_status == TransactionStatus.IDLE
            else:
                assert conn.in_transaction is False


def test_the_writer_fetches_only_after_a_statement_that_returned_rows(wd):
    """Dialect.has_rows (PostgreSQL: the result's status, not psycopg's costly `description`)."""
    with wd.run(agent="bot", guards=False) as run:
        sql, d = wd.writer.sql, wd.writer.dialect
        with wd.writer.connection() as conn:
            cur = conn.cursor()
            cur.execute(sql.select_status, (run.id,))
            assert d.has_rows(cur) and tuple(cur.fetchone()) == ("running", None, None)
            cur.execute(sql.select_status, ("no-such-run",))
            assert d.has_rows(cur) and cur.fetchone() is None  # rows may be none: still a row result
            cur.execute(sql.set_progress, ("working", run.id))
            assert not d.has_rows(cur)
            cur.close()
