"""The store itself: connection discipline, contention, timestamps, constraints, URLs.

Contention is exercised with real processes on one SQLite file: the claim under
test is that nobody ever sees "database is locked", including a transaction
that reads before it writes (which a deferred BEGIN cannot guarantee).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.exc import IntegrityError, StatementError

from watchdog import Watchdog
from watchdog.errors import StoreError
from watchdog.store.engine import SQLITE_BUSY_TIMEOUT_MS, make_engine, normalise_url
from watchdog.store.schema import SQLITE_TS_FORMAT, alerts, events, runs, utcnow

WAIT_S = 180.0  # whole multi-process scenarios on a loaded 2-core box


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


# --- contention: real processes, one SQLite file ------------------------------------------

SDK_WORKER = r"""
import json, sys, time, warnings
from watchdog import Watchdog
url, no, n, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
warnings.simplefilter("error", RuntimeWarning)  # an outage or a rejection is an error here
deadline = time.monotonic() + 60
import os
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.005)
errors = []
wd = Watchdog(url)
try:
    with wd.run(agent=f"proc{no}", kill_mode="process", guards=False) as run:
        for i in range(n):
            try:
                if i % 4 == 0:
                    run.step(model="m", tokens_in=3, tokens_out=2, cost_eur=0.001)
                elif i % 4 == 1:
                    run.record_tool("search", {"i": i}, ok=(i % 8 != 1), error=None if i % 8 != 1 else "boom")
                elif i % 4 == 2:
                    run.tool_call("calc", {"x": i}, lambda x: x * 2)
                else:
                    run.heartbeat(f"{i}/{n}")
            except Exception as exc:
                errors.append(repr(exc))
except BaseException as exc:
    errors.append(repr(exc))
print(json.dumps({"run_id": run.id, "errors": errors, "buffered": wd.buffered, "dropped": wd.dropped_events,
                  "rejected": wd.rejected_events}))
wd.close()
"""

READ_THEN_WRITE_WORKER = r"""
import json, os, sys, time
from sqlalchemy import text
from watchdog.store.engine import make_engine
url, n, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.005)
engine = make_engine(url)
errors = []
for _ in range(n):
    try:
        with engine.begin() as conn:  # read, compute, write: a lost update or SQLITE_BUSY otherwise
            value = conn.execute(text("SELECT last_event_id FROM daemons WHERE host = 'counter'")).scalar()
            conn.execute(text("UPDATE daemons SET last_event_id = :v WHERE host = 'counter'"), {"v": value + 1})
    except Exception as exc:
        errors.append(repr(exc))
print(json.dumps({"errors": errors}))
engine.dispose()
"""


def _run_workers(code, argv_for, count, tmp_path):
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", code, *argv_for(i), str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=str(tmp_path)) for i in range(count)]
    time.sleep(0.2)
    go.touch()  # let them all start hammering at once
    results = []
    for p in procs:
        out, err = p.communicate(timeout=WAIT_S)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_eight_processes_two_hundred_records_each_no_lock_errors(db_url, engine, tmp_path):
    n, count = 200, 8
    results = _run_workers(SDK_WORKER, lambda i: [db_url, str(i), str(n)], count, tmp_path)
    for r in results:
        assert r["errors"] == [], r["errors"][:3]
        assert (r["buffered"], r["dropped"], r["rejected"]) == (0, 0, 0)
    steps = sum(1 for i in range(n) if i % 4 == 0)
    tools = sum(1 for i in range(n) if i % 4 in (1, 2))
    tool_errors = sum(1 for i in range(n) if i % 8 == 1)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM events")).scalar() == n * count
        rows = conn.execute(select(runs)).all()
        assert sorted(r.id for r in rows) == sorted(r["run_id"] for r in results)
        for row in rows:
            per_kind = dict(conn.execute(
                text("SELECT kind, COUNT(*) FROM events WHERE run_id = :id GROUP BY kind"), {"id": row.id}).all())
            errors = conn.execute(text("SELECT COUNT(*) FROM events WHERE run_id = :id AND ok = :f"),
                                  {"id": row.id, "f": False}).scalar()
            seqs = conn.execute(select(events.c.seq).where(events.c.run_id == row.id)).scalars().all()
            assert (row.steps, row.tool_calls, row.tool_errors) == (per_kind["step"], per_kind["tool"], errors)
            assert (row.steps, row.tool_calls, row.tool_errors) == (steps, tools, tool_errors)
            assert row.tokens_in == 3 * steps and row.cost_eur == pytest.approx(0.001 * steps)
            assert sorted(seqs) == list(range(1, n + 1)) and row.last_seq == n
            assert row.status == "completed"


def test_read_then_write_transactions_from_eight_processes_never_fail_or_lose_updates(sqlite_url, tmp_path):
    engine = make_engine(sqlite_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO daemons (host, pid, pid_create_time, started_at, last_event_id) "
                              "VALUES ('counter', 0, 0, '2026-01-01 00:00:00.000000', 0)"))
        n, count = 50, 8
        results = _run_workers(READ_THEN_WRITE_WORKER, lambda i: [sqlite_url, str(n)], count, tmp_path)
        assert [r["errors"] for r in results] == [[]] * count
        with engine.connect() as conn:
            assert conn.execute(text("SELECT last_event_id FROM daemons WHERE host = 'counter'")).scalar() == n * count
    finally:
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


@pytest.mark.postgres
def test_postgresql_session_timezone_does_not_leak(pg_migrated):
    """A connection whose session timezone is not UTC still reads UTC, and the SDK
    writes the right instant even when the agent's own process runs in another zone."""
    code = ("import sys; from watchdog import Watchdog\n"
            "wd = Watchdog(sys.argv[1])\n"
            "with wd.run(agent='tz') as run: run.step()\n"
            "wd.close(); print(run.id)")
    lo = utcnow()
    out = subprocess.run([sys.executable, "-c", code, pg_migrated], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TZ": "America/Los_Angeles", "PGTZ": "Asia/Kolkata"})
    hi = utcnow()
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    kolkata = make_engine(pg_migrated, connect_args={"options": "-c timezone=Asia/Kolkata"})
    try:
        with kolkata.connect() as conn:
            assert conn.execute(text("SHOW timezone")).scalar() == "Asia/Kolkata"
            row = conn.execute(select(runs).where(runs.c.id == run_id)).one()
        for value in (row.started_at, row.last_seen_at, row.ended_at):
            _assert_utc(value, lo, hi)
    finally:
        kolkata.dispose()


def test_sqlite_timestamps_follow_the_documented_text_format(sqlite_url, tmp_path):
    """The table contract: naive UTC text '%Y-%m-%d %H:%M:%S.%f', whatever the agent's TZ."""
    code = ("import sys; from watchdog import Watchdog\n"
            "wd = Watchdog(sys.argv[1])\n"
            "with wd.run(agent='tz') as run: run.step()\n"
            "wd.close(); print(run.id)")
    lo = utcnow()
    out = subprocess.run([sys.executable, "-c", code, sqlite_url], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TZ": "Asia/Kolkata"})
    hi = utcnow()
    assert out.returncode == 0, out.stderr
    conn = sqlite3.connect(sqlite_path(sqlite_url))
    try:
        values = list(conn.execute("SELECT started_at, last_seen_at, ended_at FROM runs").fetchone())
        values += [r[0] for r in conn.execute("SELECT at FROM events")]
    finally:
        conn.close()
    for value in values:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}", value), value
        parsed = dt.datetime.strptime(value, SQLITE_TS_FORMAT).replace(tzinfo=dt.timezone.utc)
        assert lo - dt.timedelta(seconds=1) <= parsed <= hi + dt.timedelta(seconds=1)


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
