#!/usr/bin/env python
"""The tick's change-feed read on revision 0019 (run_changes joined to runs) against head (0020:
run_changes alone, its light copy): two fresh stores on $AW_BENCH_PG, N running runs each (env N,
default 10,000), three rounds of 300 records (an event and its run's counters) each, then READS
(default 300) reads of `scan.changed_light` from the cursor before the last round, alternating
stores, and 50 `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF)` of the same statement. Not a test; the
databases (aw_bench_feedmicro_*) are dropped at the end.

Run:  N=10000 READS=300 python benchmarks/bench_feed.py
"""
import os
import random
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from watchdog.store import access, scan, change_index
from watchdog.store.changes import ChangeFeed
from watchdog.store.engine import make_engine, read_connection

SERVER = os.environ.get("AW_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
N, CHANGED, READS = int(os.environ.get("N", 10000)), 300, int(os.environ.get("READS", 300))
stores = {}
def conninfo(db: str) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(SERVER)
    return f"host={u.host or '127.0.0.1'} port={u.port or 5432} user={u.username or 'postgres'} dbname={db}"


admin = psycopg.connect(conninfo("postgres"), autocommit=True)
try:
    for rev in ("0019", "head"):
        db = f"aw_bench_feedmicro_{os.getpid()}_{rev}"
        admin.execute(f'CREATE DATABASE "{db}"')
        stores[rev] = db
        eng = make_engine(f"{SERVER}/{db}")
        access.upgrade(eng, rev)
        raw = psycopg.connect(conninfo(db), autocommit=True)
        raw.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, max_steps) "
                    "SELECT md5(i::text), 'bot', 'running', 'cooperative', 'bench-elsewhere', now(), now(), "
                    "CASE WHEN i %% 5 = 0 THEN 50 END FROM generate_series(1, %s) i", (N,))
        raw.execute("VACUUM ANALYZE")
        ids = [r[0] for r in raw.execute("SELECT id FROM runs").fetchall()]
        rng = random.Random(1)
        with read_connection(eng) as conn:
            c0 = ChangeFeed().mark(conn)
        for k in range(3):  # three ticks' worth of writes, as bench_tick: event + counters
            with raw.transaction():
                for j, rid in enumerate(rng.sample(ids, CHANGED)):
                    raw.execute("INSERT INTO events (run_id, seq, at, kind, tool, ok) VALUES (%s, %s, now(), 'tool', 't', true)",
                                (rid, 100 + k))
                    raw.execute("UPDATE runs SET tool_calls = tool_calls + 1, last_seen_at = now() WHERE id = %s", (rid,))
            if k < 2:
                with read_connection(eng) as conn:
                    c0 = ChangeFeed().mark(conn)
        raw.close()
        stores[rev] = (db, eng, c0)
    times = {rev: [] for rev in stores}
    counts = {}
    for i in range(READS):
        for rev in (("0019", "head") if i % 2 == 0 else ("head", "0019")):
            db, eng, c0 = stores[rev]
            feed = ChangeFeed()
            with read_connection(eng) as conn:
                t = time.perf_counter()
                got = scan.changed_light(conn, feed.__class__(c0), None)
                times[rev].append((time.perf_counter() - t) * 1e3)
                counts[rev] = (len(got.rows), change_index.source(conn).key)
    for rev, ts in times.items():
        ts.sort()
        print(f"{rev}: {counts[rev]} rows/source; tick feed read median {statistics.median(ts):.3f} ms, "
              f"p25 {ts[len(ts)//4]:.3f}, p75 {ts[3*len(ts)//4]:.3f} ms over {len(ts)} reads")
    # server time: EXPLAIN ANALYZE of the same statement
    for rev in ("0019", "head"):
        db, eng, c0 = stores[rev]
        with read_connection(eng) as conn:
            from watchdog.store.changes import _rendered
            src = change_index.source(conn)
            sql = _rendered(conn, src, "tick light", scan._light_select(conn, with_seq=True)).replace("%s", str(c0))
            ex = []
            for _ in range(50):
                plan = [r[0] for r in conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) " + sql)]
                ex.append(float([l for l in plan if l.startswith("Execution Time")][0].split()[2]))
            print(f"{rev}: server execution median {statistics.median(ex):.3f} ms; plan:")
            print("   " + "\n   ".join(plan[:8]))
finally:
    for v in stores.values():
        db = v[0] if isinstance(v, tuple) else v
        if isinstance(v, tuple):
            v[1].dispose()
        admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    admin.close()
