#!/usr/bin/env python
"""Soak with malformed rows: 10,000 runs, 1 % of them malformed, through one in-process daemon.

Two passes on fresh SQLite stores (or PostgreSQL with --backend postgresql), with the
clock passed in (`Ticker.tick(now)`, 5 s apart):

  clean      10,000 runs, none malformed: the baseline, measured in the same process
  malformed  the same runs, 1 % of them spoiled by hand with the schema's checks off
             (text in a counter, a timestamp that does not parse, labels that are not
             JSON, a negative cost on SQLite; NaN, infinity and year 20000 on PostgreSQL)

Runs arrive a thousand at a time (plain SQL, as a client in another language would write
them), 10 % of the well-formed ones over their step budget. After each thousand the daemon
ticks --ticks times; then every well-formed run of that thousand must be stopping (the
runaways) or untouched (the rest), and the thousand is ended (the malformed ones stay
active: the worst case, they accumulate). Per thousand: tick p50 / p99, daemon RSS, the
runaways stopped, the rows reported (quarantined). The table ends with the malformed /
clean ratios and last / first thousand ratios: flat is the point.

Run:  python benchmarks/bench_malformed.py [--runs 10000] [--ticks 5] [--backend sqlite]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
import uuid

from sqlalchemy import select, text

PG_SERVER = os.environ.get("AW_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
BATCH = 1000
BUDGET_STEPS = 12
SPOIL_SQLITE = ("UPDATE runs SET steps = 'many' WHERE id = :rid",
                "UPDATE runs SET started_at = 'garbage' WHERE id = :rid",
                "UPDATE runs SET labels = 'not json', steps = 99 WHERE id = :rid",
                "UPDATE runs SET cost_eur = -1 WHERE id = :rid")
SPOIL_PG = ("UPDATE runs SET cost_eur = 'NaN' WHERE id = :rid",
            "UPDATE runs SET last_seen_at = 'infinity' WHERE id = :rid",
            "UPDATE runs SET last_seen_at = '20000-01-01 00:00:00+00', steps = 99 WHERE id = :rid",
            "UPDATE runs SET cost_eur = -1 WHERE id = :rid")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def store(backend: str):
    """(url, cleanup): a fresh migrated store."""
    from sqlalchemy import create_engine

    from watchdog.store import access
    from watchdog.store.engine import make_engine

    if backend == "sqlite":
        folder = tempfile.mkdtemp(prefix="aw-bench-malformed-")
        url = f"sqlite:///{folder}/runs.db"

        def cleanup():
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    else:
        name = f"aw_bench_malformed_{os.getpid()}_{uuid.uuid4().hex[:6]}"
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
    engine.dispose()
    return url, cleanup


def checks_off(conn) -> None:
    """As for rows written before migration 0007, or by hand with the checks off."""
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
    else:
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")


def add_runs(engine, n: int, now: dt.datetime, host: str, malformed_every: int, k: int) -> tuple[set, set, set]:
    """n running runs; returns (runaway ids, healthy ids, malformed ids)."""
    from watchdog.store.schema import runs

    rows, runaways, healthy, bad = [], set(), set(), set()
    for i in range(n):
        rid = uuid.uuid4().hex
        over = i % 10 == 0
        rows.append(dict(id=rid, agent="bench", status="running", kill_mode="cooperative", host=host, pid=None,
                         steps=BUDGET_STEPS + 5 if over else 3, started_at=now, last_seen_at=now, labels={}))
        if malformed_every and i % malformed_every == malformed_every - 1:
            bad.add(rid)
        elif over:
            runaways.add(rid)
        else:
            healthy.add(rid)
    with engine.begin() as conn:
        conn.execute(runs.insert(), rows)
        if bad:
            checks_off(conn)
            spoil = SPOIL_SQLITE if conn.dialect.name == "sqlite" else SPOIL_PG
            for j, rid in enumerate(sorted(bad)):
                conn.execute(text(spoil[(j + k) % len(spoil)]), {"rid": rid})
    return runaways, healthy, bad


def one_pass(backend: str, n_runs: int, ticks: int, malformed_every: int) -> list[dict]:
    from watchdog.core.config import Budgets, Config, DaemonConfig
    from watchdog.core.seal import Sealer
    from watchdog.daemon.stops.killer import Killer
    from watchdog.daemon.tick.ticker import Ticker
    from watchdog.store.engine import make_engine
    from watchdog.store.schema import runs

    url, cleanup = store(backend)
    engine = make_engine(url)
    try:
        budgets = Budgets(max_steps=BUDGET_STEPS, max_wall_s=7 * 86400.0, heartbeat_timeout_s=86400.0)
        cfg = Config(daemon=DaemonConfig(tick_s=5.0), defaults=budgets, agents={})
        killer = Killer()
        tk = Ticker(engine, cfg, killer, money=False, sealer=Sealer(os.urandom(32), killer.host))
        now = dt.datetime.now(dt.timezone.utc)
        out = []
        for k in range(n_runs // BATCH):
            runaways, healthy, bad = add_runs(engine, BATCH, now, killer.host, malformed_every, k)
            times = []
            for _ in range(ticks):
                now += dt.timedelta(seconds=5)
                t0 = time.perf_counter()
                tk.tick(now)
                times.append((time.perf_counter() - t0) * 1000)
            with engine.connect() as conn:
                status = dict(conn.execute(select(runs.c.id, runs.c.status)
                                           .where(runs.c.id.in_(sorted(runaways | healthy)))).all())
                reported = conn.execute(text("SELECT count(*) FROM interventions WHERE action = 'quarantined'")).scalar()
            stopped = sum(status[r] == "stopping" for r in runaways)
            wrongly = sum(status[r] != "running" for r in healthy)
            with engine.begin() as conn:  # the thousand ends (the malformed rows stay active)
                conn.execute(runs.update().where(runs.c.id.in_(sorted(runaways | healthy)))
                             .values(status="completed", ended_at=now))
            times.sort()
            out.append(dict(runs=(k + 1) * BATCH, p50_ms=statistics.median(times),
                            p99_ms=times[min(len(times) - 1, int(0.99 * len(times)))], rss_mb=rss_mb(),
                            runaways=len(runaways), stopped=stopped, healthy_touched=wrongly,
                            malformed=len(bad), reported=reported))
        return out
    finally:
        engine.dispose()
        cleanup()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--ticks", type=int, default=5)
    ap.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--json", help="also write the rows to this file")
    a = ap.parse_args(argv)
    import logging

    logging.disable(logging.WARNING)  # one warning per malformed row: not what is measured
    clean = one_pass(a.backend, a.runs, a.ticks, 0)
    bad = one_pass(a.backend, a.runs, a.ticks, 100)
    print(f"backend {a.backend}, {a.runs:,} runs a thousand at a time, {a.ticks} ticks each, "
          f"1 % malformed in the second pass; python {sys.version.split()[0]}, load {os.getloadavg()[0]:.1f}\n")
    print("| runs | clean p50 ms | clean p99 ms | malformed p50 ms | malformed p99 ms | p99 ratio | clean RSS MB | "
          "malformed RSS MB | runaways stopped | healthy touched | malformed reported |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, b in zip(clean, bad):
        print(f"| {b['runs']:,} | {c['p50_ms']:.1f} | {c['p99_ms']:.1f} | {b['p50_ms']:.1f} | {b['p99_ms']:.1f} | "
              f"{b['p99_ms'] / c['p99_ms']:.2f}x | {c['rss_mb']:.1f} | {b['rss_mb']:.1f} | "
              f"{b['stopped']}/{b['runaways']} | {b['healthy_touched']} | {b['reported']}/{b['runs'] // 100} |")
    first, last = bad[0], bad[-1]
    print(f"\nmalformed pass, last / first thousand: tick p99 {last['p99_ms'] / first['p99_ms']:.2f}x, "
          f"RSS {last['rss_mb'] / first['rss_mb']:.2f}x; every runaway stopped: "
          f"{all(r['stopped'] == r['runaways'] for r in bad)}; healthy runs touched: "
          f"{sum(r['healthy_touched'] for r in bad)}; malformed reported once each: "
          f"{bad[-1]['reported'] == sum(r['malformed'] for r in bad)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"clean": clean, "malformed": bad}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
