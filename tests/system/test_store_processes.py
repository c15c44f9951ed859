"""The store under real processes: contention on one SQLite file and agents in other time zones
(the store's own rules in one process: tests/store/test_store.py).

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
import time

import pytest
from sqlalchemy import select, text

from watchdog.store.engine import make_engine
from watchdog.store.schema import SQLITE_TS_FORMAT, events, runs, utcnow

WAIT_S = 180.0  # whole multi-process scenarios on a loaded 2-core box


def sqlite_path(url: str) -> str:
    return url.split("sqlite:///", 1)[1]


def _assert_utc(value, lo, hi):
    assert isinstance(value, dt.datetime)
    assert value.tzinfo is not None and value.utcoffset() == dt.timedelta(0), value
    assert lo <= value <= hi


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


# --- timestamps written by agents in other time zones --------------------------------------


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
