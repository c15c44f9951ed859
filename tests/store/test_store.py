"""The store itself: connection discipline, timestamps, constraints, URLs (contention between
real processes and agents in other time zones: tests/system/test_store_processes.py)."""
from __future__ import annotations

import datetime as dt
import sqlite3
import threading

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.exc import IntegrityError, StatementError

from watchdog import Watchdog
from watchdog.errors import StoreError
from watchdog.store.engine import SQLITE_BUSY_TIMEOUT_MS, make_engine, normalise_url
from watchdog.store.schema import alerts, events, runs, utcnow


def sqlite_path(url: str) -> str:
    return url.split("sqlite:///", 1)[1]


# --- SQLite connection discipline ---------------------------------------------------------


def _pragmas(cursor) -> dict:
    out = {}
    for name in ("journal_mode", "busy_timeout", "synchronous", "foreign_keys"):
        cursor.execute(f"PRAGMA {name}")
        out[name] = cursor.fetchone()[0]
    return out


EXPECTED_PRAGMAS = {"journal_mode": "wal", "busy_timeout": SQLITE_BUSY_TIMEOUT_MS, "synchronous": 1, "foreign_keys": 1}


def test_sqlite_pragmas_on_engine_connections(sqlite_url):
    engine = make_engine(sqlite_url)
    try:
        with engine.connect() as conn:
            cur = conn.connection.dbapi_connection.cursor()
            assert _pragmas(cur) == EXPECTED_PRAGMAS
        assert SQLITE_BUSY_TIMEOUT_MS >= 5000
    finally:
        engine.dispose()


def test_sqlite_pragmas_on_the_sdk_write_connection(sqlite_url):
    wd = Watchdog(sqlite_url)
    try:
        with wd.writer.connection() as conn:
            assert _pragmas(conn.cursor()) == EXPECTED_PRAGMAS
    finally:
        wd.close()


def test_sqlite_wal_is_persistent_in_the_file(sqlite_url):
    # Another program (sqlite3 CLI, another language) opening the file sees WAL too.
    conn = sqlite3.connect(sqlite_path(sqlite_url))
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def _write_lock_free(path) -> bool:
    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError as exc:
        assert "locked" in str(exc)
        return False
    finally:
        probe.close()


def test_sqlalchemy_transactions_begin_immediate(sqlite_url):
    """A transaction takes the write lock at BEGIN, before its first read."""
    engine = make_engine(sqlite_url)
    path = sqlite_path(sqlite_url)
    try:
        assert _write_lock_free(path)
        with engine.begin() as conn:
            conn.execute(text("SELECT 1"))  # reads only, yet the write lock is already ours
            assert not _write_lock_free(path)
        assert _write_lock_free(path)
    finally:
        engine.dispose()


def test_a_failed_write_releases_the_write_lock_even_while_its_error_is_kept(sqlite_url):
    """Agents log and keep exceptions. A failed SDK transaction must still give the
    write lock back at once: closing a sqlite3 connection whose failed statement is
    still referenced (by the kept traceback) would otherwise keep the transaction
    open and every other agent would wait out its busy timeout."""
    from watchdog.store.agent_writes import Writer

    engine = make_engine(sqlite_url)
    writer = Writer(engine)
    d = writer.dialect
    path = sqlite_path(sqlite_url)
    kept = []
    try:
        row = ("no-such-run", 1, d.ts(utcnow()), "step") + (None,) * 12
        try:
            writer.transaction([(writer.sql.insert_event, row)])
        except Exception as exc:  # noqa: BLE001
            kept.append(exc)  # what a logger or an error tracker does
        assert len(kept) == 1 and writer.is_rejection(kept[0])
        assert _write_lock_free(path)
    finally:
        writer.discard()
        engine.dispose()


def test_a_record_the_store_refuses_is_reported_and_does_not_hold_the_lock(sqlite_url):
    engine = make_engine(sqlite_url)
    wd = Watchdog(sqlite_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TRIGGER refuse BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'no'); END"))
        run = wd.run(agent="a")
        run.start()
        with pytest.warns(RuntimeWarning, match="rejected"):
            try:
                run.step()
            except Exception as exc:  # noqa: BLE001
                pytest.fail(f"the SDK raised into the agent: {exc!r}")
        assert _write_lock_free(sqlite_path(sqlite_url))
        assert wd.rejected_events == 1 and wd.buffered == 0
    finally:
        wd.close()
        engine.dispose()


# --- timestamps --------------------------------------------------------------------------


def _assert_utc(value, lo, hi):
    assert isinstance(value, dt.datetime)
    assert value.tzinfo is not None and value.utcoffset() == dt.timedelta(0), value
    assert lo <= value <= hi


def test_timestamps_come_back_timezone_aware_utc(db_url, engine):
    wd = Watchdog(db_url)
    lo = utcnow()
    try:
        with wd.run(agent="tz") as run:
            run.step()
            run.heartbeat("x")
    finally:
        wd.close()
    hi = utcnow()
    with engine.connect() as conn:
        row = conn.execute(select(runs).where(runs.c.id == run.id)).one()
        ats = conn.execute(select(events.c.at).where(events.c.run_id == run.id)).scalars().all()
    for value in (row.started_at, row.last_seen_at, row.ended_at, *ats):
        _assert_utc(value, lo, hi)
    assert row.started_at <= min(ats) <= max(ats) == row.last_seen_at <= row.ended_at


def test_core_writes_round_trip_the_same_instant(db_url, engine):
    """Whatever offset a writer uses, the same instant comes back, in UTC."""
    paris = dt.timezone(dt.timedelta(hours=2))
    local = dt.datetime(2026, 7, 1, 14, 30, 15, 123456, tzinfo=paris)
    with engine.begin() as conn:
        conn.execute(insert(runs).values(id="r1", agent="a", status="running", kill_mode="cooperative", host="h",
                                         started_at=local, last_seen_at=local))
        row = conn.execute(select(runs.c.started_at)).one()
    assert row.started_at == local
    assert row.started_at.utcoffset() == dt.timedelta(0)
    assert row.started_at.hour == 12


def test_naive_datetimes_are_refused(db_url, engine):
    with pytest.raises(StatementError) as err:
        with engine.begin() as conn:
            conn.execute(insert(runs).values(id="r1", agent="a", status="running", kill_mode="cooperative",
                                             host="h", started_at=dt.datetime(2026, 1, 1), last_seen_at=utcnow()))
    assert "naive" in str(err.value)


def test_sqlite_rows_written_by_plain_sql_read_back_aware(sqlite_url):
    """Another language writing the documented text format is read back as aware UTC."""
    conn = sqlite3.connect(sqlite_path(sqlite_url))
    try:
        conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at) VALUES "
                     "('plain', 'go-agent', 'running', 'cooperative', 'h', '2026-03-01 10:00:00.000000', "
                     "'2026-03-01 10:00:05.250000')")
        conn.commit()
    finally:
        conn.close()
    engine = make_engine(sqlite_url)
    try:
        with engine.connect() as c:
            row = c.execute(select(runs).where(runs.c.id == "plain")).one()
    finally:
        engine.dispose()
    assert row.started_at == dt.datetime(2026, 3, 1, 10, 0, tzinfo=dt.timezone.utc)
    assert row.last_seen_at == dt.datetime(2026, 3, 1, 10, 0, 5, 250000, tzinfo=dt.timezone.utc)
    assert (row.steps, row.tool_calls, row.cost_eur, row.last_seq) == (0, 0, 0.0, 0)  # server defaults


# --- constraints of the table contract ------------------------------------------------------


def _run_values(run_id="r1"):
    now = utcnow()
    return dict(id=run_id, agent="a", status="running", kill_mode="cooperative", host="h", started_at=now,
                last_seen_at=now)


def test_events_need_their_run_and_go_with_it(db_url, engine):
    with pytest.raises(IntegrityError):
        with engine.begin() as conn:
            conn.execute(insert(events).values(run_id="missing", seq=1, at=utcnow(), kind="step"))
    with engine.begin() as conn:
        conn.execute(insert(runs).values(**_run_values()))
        conn.execute(insert(events).values(run_id="r1", seq=1, at=utcnow(), kind="step"))
    with pytest.raises(IntegrityError):
        with engine.begin() as conn:
            conn.execute(insert(events).values(run_id="r1", seq=1, at=utcnow(), kind="step"))
    with engine.begin() as conn:
        conn.execute(runs.delete().where(runs.c.id == "r1"))
        assert conn.execute(text("SELECT COUNT(*) FROM events")).scalar() == 0


def test_an_alert_exists_at_most_once_per_dedupe_key(db_url, engine):
    values = dict(dedupe_key="run:r1:stop", created_at=utcnow(), title="t", body="b")
    with engine.begin() as conn:
        conn.execute(insert(alerts).values(**values))
    with pytest.raises(IntegrityError):
        with engine.begin() as conn:
            conn.execute(insert(alerts).values(**values))


def test_concurrent_sdk_and_sqlalchemy_writers_in_threads(db_url, engine):
    """The SDK's raw write path and SQLAlchemy sessions interleave without errors."""
    wd = Watchdog(db_url)
    errors = []
    try:
        with wd.run(agent="mixed", guards=False) as run:
            def sdk():
                try:
                    for _ in range(100):
                        run.step(tokens_in=1)
                except BaseException as exc:  # noqa: BLE001
                    errors.append(repr(exc))

            def daemon_like():
                try:
                    for _ in range(50):
                        with engine.begin() as conn:
                            conn.execute(text("UPDATE runs SET progress = progress WHERE id = :id"), {"id": run.id})
                except BaseException as exc:  # noqa: BLE001
                    errors.append(repr(exc))

            threads = [threading.Thread(target=sdk), threading.Thread(target=sdk), threading.Thread(target=daemon_like)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        assert errors == []
        assert (wd.buffered, wd.dropped_events, wd.rejected_events) == (0, 0, 0)
    finally:
        wd.close()
    with engine.connect() as conn:
        assert conn.execute(select(runs.c.steps)).scalar() == 200


# --- URLs ------------------------------------------------------------------------------------


def test_normalise_url():
    assert normalise_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("postgresql+psycopg://u:p%40ss@h:5/db") == "postgresql+psycopg://u:p%40ss@h:5/db"
    assert normalise_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    for bad in ("", None, "not a url", "mysql://u@h/db"):
        with pytest.raises(StoreError):
            normalise_url(bad)


def test_watchdog_with_a_bad_url_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="url"):
        Watchdog("mysql://u@h/db")
    with pytest.raises(ValueError, match="buffer_max"):
        Watchdog("sqlite:///x.db", buffer_max=-1)
