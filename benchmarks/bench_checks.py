#!/usr/bin/env python
"""What the store's checks (migration 0007's triggers) cost the agents' write path.

One SDK writer records --records tool calls on a fresh store with the checks on, and the
same on a store whose checks are dropped (the baseline), alternating ABBA so drift and
load hit both alike; per backend: records/s, p50 and p99 of one record, and the ratio.

Run:  python benchmarks/bench_checks.py [--records 3000] [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid

from sqlalchemy import create_engine, text

PG_SERVER = os.environ.get("AW_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")


def fresh_store(backend: str, checks: bool):
    """(url, cleanup): a migrated store, its checks dropped unless `checks`."""
    from watchdog.store import access
    from watchdog.store.engine import make_engine

    if backend == "sqlite":
        folder = tempfile.mkdtemp(prefix="aw-bench-checks-")
        url = f"sqlite:///{folder}/runs.db"

        def cleanup():
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    else:
        name = f"aw_bench_checks_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        url = f"{PG_SERVER}/{name}"

        def cleanup():
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
    engine = make_engine(url)
    access.upgrade(engine)
    if not checks:
        with engine.begin() as conn:
            if backend == "sqlite":
                for table in ("runs", "events"):
                    for op in ("insert", "update"):
                        conn.exec_driver_sql(f"DROP TRIGGER ck_{table}_{op}")
            else:
                for table in ("runs", "events"):
                    conn.exec_driver_sql(f"DROP TRIGGER ck_{table} ON {table}")
    engine.dispose()
    return url, cleanup


def measure(url: str, n: int) -> list[float]:
    from watchdog import Watchdog

    wd = Watchdog(url, attest_socket="")
    times = []
    try:
        with wd.run(agent="bench", guards=False) as run:  # no daemon here: nothing stops it
            for i in range(n):
                t0 = time.perf_counter()
                run.record_tool("search", {"q": i % 50}, ok=True)
                times.append(time.perf_counter() - t0)
    finally:
        wd.close()
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--backends", default="sqlite,postgresql")
    a = ap.parse_args(argv)
    rows = []
    for backend in a.backends.split(","):
        stores = {checks: fresh_store(backend, checks) for checks in (True, False)}
        got: dict[bool, list[float]] = {True: [], False: []}
        try:
            for checks in (True, False, False, True):  # ABBA
                got[checks] += measure(stores[checks][0], a.records // 2)
        finally:
            for _url, cleanup in stores.values():
                cleanup()
        for checks in (False, True):
            t = sorted(got[checks])
            rows.append((backend, "on" if checks else "off (baseline)", len(t) / sum(t), statistics.median(t) * 1e3,
                         t[int(0.99 * (len(t) - 1))] * 1e3))
    print(f"one SDK writer, {a.records:,} tool calls per store, ABBA; load {os.getloadavg()[0]:.1f}\n")
    print("| backend | checks | records/s | p50 ms | p99 ms | p50 on / off |")
    print("|---|---|---:|---:|---:|---:|")
    base = {}
    for backend, checks, rate, p50, p99 in rows:
        if checks.startswith("off"):
            base[backend] = p50
        ratio = f"{p50 / base[backend]:.2f}x" if checks == "on" else ""
        print(f"| {backend} | {checks} | {rate:,.0f} | {p50:.3f} | {p99:.3f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
