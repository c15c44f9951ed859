#!/usr/bin/env python
"""Tick benchmark: `Ticker.tick(now)` against a naive tick that aggregates all events.

For 100 / 1,000 / 10,000 active runs on top of 10k / 100k / 1M events of history,
on SQLite (WAL, a temp file) and PostgreSQL (databases `aw_bench_tick_<pid>_*`,
dropped at the end), we time:

  cold    the first `Ticker(engine, config, Killer()).tick(now)` of a new Ticker:
          it loads the active runs and rebuilds the per-run caches from the active
          runs' events (what a restarted daemon does).
  warm    the median (min, max) of the following ticks, with `--new-events` fresh
          events (a few hundred) written between ticks by simulated agents, and
          `--churn` runs that end and as many that start, each tick `--tick-s` later
          than the last: the daemon's steady state. A whole tick: the queries, the
          policy evaluation, the writes (lease row), and the money work: the unpriced-
          step backfill, booking the ended runs into the spend ledger and rollups,
          the period budgets (per agent and for a [[budgets]] label set that half the
          active runs carry), the published budget state, the drift check.
  base    the same warm ticks by a second Ticker on the same store without the money
          work (`Ticker(..., money=False)`: the tick before it existed), alternating
          which of the two ticks first; warm/base is the cost of the money work.
  idle    the median of --idle-ticks ticks of the same daemon with nothing written in between
          (time goes on, every run waits on its model): issue 25's "idle tick". The runs that
          ended in the warm ticks are booked and sealed first, by two unmeasured ticks after
          their 30 s pace: that is the churn's work, not an idle tick's.
  feed    the change feed (watchdog.store.changes.ChangeFeed), the read the tick proportional to
          what changed starts from: `start` (a restart: the active runs and the high-water
          mark), a read when nothing changed, and a read after --new-events new events (the
          runs they touched, each once).
  naive   the article's pseudo-code: each tick `SELECT run_id, count(*), sum(cost)...
          FROM events GROUP BY run_id` over ALL events, then the same policies on
          the aggregates (no writes: every run is healthy).
  breach  `--breach` runs (capped at the active count) are pushed over their cost
          budget, then ONE tick: we report how many are `stopping` afterwards
          (from the store, not from the tick's report) and that tick's time, then
          the time of the tick after it (the runs are now in the stop ladder).

Busy machines. Wall time is what the targets are about, but on a shared 2-core
machine it also counts the time the tick's threads wait for a CPU. Per warm tick
we also read /proc/<pid>/schedstat of the benchmark's thread and (PostgreSQL)
of the server backend that serves the engine: "CPU" is their CPU time, "wait"
their time runnable but not running, "wall-wait" the wall time less that wait
(an estimate of the tick on an idle machine). The load average is printed too.

Targets checked at the end (issue 25's goals): warm tick at the largest active count < --target-ms
(25 ms), idle tick <= --idle-target-ms (5 ms), the feed's read <= 5 ms with --new-events new events
and <= 1 ms when nothing changed (its share of those two); the money work at the largest active count <= 1.2x the base tick; warm
tick at the largest history <= 1.2x the smallest; every breached
run `stopping` after one tick. --profile adds, for the largest configuration on
each backend, the wall time per phase of the tick (by wrapping the ticker's own
steps) and a cProfile of a few more warm ticks.

Data. History = completed runs of 50 events each (steps with tokens and cost,
tool calls with an args hash, a few failed, heartbeats), written days before
`now`, booked into the spend ledger and the drift rollups by the real booking
code when the template is built (so the drift baseline is three days of buckets). Each active run adds 10 events of its own (5 steps, 5 tool calls, the
last minutes before `now`), so the events table holds history + 10 x active
runs. Active runs are healthy: the bench profile's budgets are generous, 1 run
in 5 asks for a lower cost budget of its own (so `effective_budgets` takes its
replace path), and `last_seen_at` is seconds before the `now` given to the tick.

Active runs live on host `bench-elsewhere` (not this machine's hostname), so
the tick never reads /proc for them and never signals anything: the tick
measured is the database + policy work that a daemon does for runs on other
hosts of a shared PostgreSQL store. (`--local` instead registers them on this
host with the benchmark's own pid and create time: `_gone()` then takes its
fast path — the pid is in psutil.pids() and the run wrote within 2 ticks — and
the killer would refuse to signal the benchmark itself anyway.)

Lease. Both tickers tick under one real lease of this host (watchdog.daemon.leases.lease: PostgreSQL's
advisory locks on a session of its own, SQLite's row), as a daemon does: its refresh, the leader's
read of the hosts without a daemon and its renewal are part of every tick measured.

Loading. Every (backend, history) store is built ONCE as a template (bulk
insert: one sqlite3 executemany transaction; psycopg COPY), then every
configuration gets a fresh copy of it (SQLite: a file copy; PostgreSQL:
CREATE DATABASE ... TEMPLATE ... STRATEGY FILE_COPY) and its active runs are
added on top. PostgreSQL templates get VACUUM ANALYZE after the load (what
autovacuum does soon after a bulk load anyway), and the copies ANALYZE after
the active runs are added; SQLite gets no ANALYZE (the daemon never runs one).

Run:  python benchmarks/bench_tick.py [--runs 100,1000,10000] [--events 10000,100000,1000000]
                                     [--backends sqlite,postgresql] [--quick] [--profile]
"""

from __future__ import annotations

import argparse
import atexit
import cProfile
import datetime as dt
import io
import json
import logging
import os
import platform
import pstats
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid

PG_SERVER = os.environ.get("AW_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
PG_ADMIN_DB = "postgres"
SQLITE_TS_FORMAT = "%Y-%m-%d %H:%M:%S.%f"  # the table contract's (watchdog.store)
REMOTE_HOST = "bench-elsewhere"
AGENT = "bench-agent"
EVENTS_PER_ENDED_RUN = 50
EVENTS_PER_ACTIVE_RUN = 10
TOOLS = ("search", "fetch_url", "read_file", "write_file", "sql_query", "python", "browser", "email")
MODELS = ("gpt-4o-mini", "claude-sonnet", "mistral-large")

EVENT_COLS = ("run_id", "seq", "at", "kind", "tool", "args_hash", "ok", "error_msg", "duration_s", "model",
              "tokens_in", "tokens_out", "cost_eur")
RUN_COLS = ("id", "agent", "status", "kill_mode", "host", "pid", "pid_create_time", "labels", "max_cost_eur",
            "steps", "tool_calls", "tool_errors", "tokens_in", "tokens_out", "cost_eur", "last_seq",
            "started_at", "last_seen_at", "ended_at", "booked_at")
LABELS = '{"tenant": "bench"}'  # one active run in two carries it: the [[budgets]] of the money config


# --- configuration -------------------------------------------------------------------------


def bench_config(tick_s: float):
    """Generous budgets: a healthy active run trips nothing, whatever the grid size. Period budgets
    per agent and for a label set, and drift alarms, are all on (and never trip): the money work
    (watchdog.daemon.money.money) runs in full each tick of the Ticker that has it."""
    from watchdog.core.config import Budgets, Config, DaemonConfig
    from watchdog.core.periods import LabelBudget

    budgets = Budgets(max_wall_s=7 * 86400.0, max_steps=100_000, max_tool_calls=100_000, max_cost_eur=1000.0,
                      max_identical_calls=1000, heartbeat_timeout_s=3600.0, max_tool_calls_per_min=10_000,
                      max_cost_eur_per_day=1e9, max_cost_eur_per_month=1e9)
    import tempfile

    # The daemon's state file (issue 20) in a directory of the benchmark's own, never the system's.
    state_dir = tempfile.mkdtemp(prefix="aw-bench-state-")
    return Config(daemon=DaemonConfig(tick_s=tick_s, state_dir=state_dir), defaults=budgets, agents={AGENT: budgets},
                  budgets=(LabelBudget({"tenant": "bench"}, max_cost_eur_per_day=1e9, max_cost_eur_per_month=1e9),))


# --- value generation ------------------------------------------------------------------------


class Clock:
    """Timestamps as the store spells them, cached per whole second (bulk loads make millions)."""

    def __init__(self, backend: str, origin: dt.datetime):
        self.sqlite = backend == "sqlite"
        self.origin = origin
        self._cache: dict[int, str] = {}

    def at(self, t: dt.datetime):
        if self.sqlite:
            return t.astimezone(dt.timezone.utc).strftime(SQLITE_TS_FORMAT)
        return t

    def sec(self, offset_s: int):
        """origin + offset_s seconds, cached."""
        v = self._cache.get(offset_s)
        if v is None:
            t = self.origin + dt.timedelta(seconds=offset_s)
            v = t.strftime(SQLITE_TS_FORMAT) if self.sqlite else t.isoformat()
            self._cache[offset_s] = v
        return v


def history_rows(n_events: int, clock: Clock, rng: random.Random):
    """Completed runs of EVENTS_PER_ENDED_RUN events each, over the days before `now`."""
    n_runs = max(1, n_events // EVENTS_PER_ENDED_RUN)
    run_rows, event_rows = [], []
    span = 3 * 86400  # history spread over three days, ending an hour before `now`
    left = n_events
    for r in range(n_runs):
        rid = uuid.UUID(int=rng.getrandbits(128)).hex
        k = EVENTS_PER_ENDED_RUN if r < n_runs - 1 else left
        left -= k
        start = int(r * span / n_runs)
        steps = calls = errors = tin = tout = 0
        cost = 0.0
        for seq in range(1, k + 1):
            at = clock.sec(start + 3 * seq)
            m = seq % 5
            if m in (0, 2):
                ti, to = 800 + seq * 10, 150 + seq
                c = (ti * 0.15 + to * 0.6) / 1e6
                steps += 1
                tin += ti
                tout += to
                cost += c
                event_rows.append((rid, seq, at, "step", None, None, None, None, 1.2, MODELS[r % 3], ti, to, c))
            elif m in (1, 3):
                tool = TOOLS[(r + seq) % len(TOOLS)]
                ok = (r * 7 + seq) % 23 != 0
                calls += 1
                errors += not ok
                event_rows.append((rid, seq, at, "tool", tool, f"{(r * 131 + seq):016x}", ok,
                                   None if ok else "TimeoutError: upstream did not answer", 0.4, None, None, None,
                                   None))
            else:
                event_rows.append((rid, seq, at, "heartbeat", None, None, None, None, None, None, None, None, None))
        run_rows.append((rid, AGENT, "completed", "process", REMOTE_HOST, 10_000 + r % 50_000, 1.7e9 + r,
                         None, None, steps, calls, errors, tin, tout, cost, k,
                         clock.sec(start), clock.sec(start + 3 * k), clock.sec(start + 3 * k), None))
    return run_rows, event_rows


class ActiveRuns:
    """The active runs of one configuration and what the simulated agents write next."""

    def __init__(self, n: int, now: dt.datetime, clock: Clock, rng: random.Random, local: bool):
        self.now = now
        self.clock = clock
        self.rng = rng
        self.ids = [uuid.UUID(int=rng.getrandbits(128)).hex for _ in range(n)]
        self.last_seq: dict[str, int] = {}
        self.local = local
        if local:
            from watchdog.core.procid import current_create_time, hostname

            self.host, self.pid, self.ctime = hostname(), os.getpid(), current_create_time()

    def initial_rows(self):
        run_rows, event_rows = [], []
        c = self.clock
        for i, rid in enumerate(self.ids):
            started = self.now - dt.timedelta(seconds=60 + (i * 37) % 240)
            last = self.now - dt.timedelta(seconds=1 + (i % 4))
            span = (last - started).total_seconds()
            tin = tout = 0
            cost = 0.0
            for seq in range(1, EVENTS_PER_ACTIVE_RUN + 1):
                at = c.at(started + dt.timedelta(seconds=span * seq / EVENTS_PER_ACTIVE_RUN))
                if seq % 2:
                    ti, to = 900 + seq, 120 + seq
                    cc = (ti * 0.15 + to * 0.6) / 1e6
                    tin, tout, cost = tin + ti, tout + to, cost + cc
                    event_rows.append((rid, seq, at, "step", None, None, None, None, 1.1, MODELS[i % 3], ti, to, cc))
                else:
                    event_rows.append((rid, seq, at, "tool", TOOLS[(i + seq) % len(TOOLS)],
                                       f"a{i:08x}{seq:07x}", True, None, 0.3, None, None, None, None))
            self.last_seq[rid] = EVENTS_PER_ACTIVE_RUN
            own_cost_budget = 50.0 if i % 5 == 0 else None
            host, pid, ctime = ((self.host, self.pid, self.ctime) if self.local
                                else (REMOTE_HOST, 20_000 + i, 1.7e9 + i))
            n_half = EVENTS_PER_ACTIVE_RUN // 2
            run_rows.append((rid, AGENT, "running", "process", host, pid, ctime, LABELS if i % 2 else None,
                             own_cost_budget, n_half, n_half, 0, tin, tout, cost, EVENTS_PER_ACTIVE_RUN,
                             c.at(started), c.at(last), None, None))
        return run_rows, event_rows

    def churn(self, n: int, now: dt.datetime):
        """n active runs end (completed at `now`) and n new ones start: the active count stays.
        Returns (ended ids, new run rows, their first events)."""
        ended = self.rng.sample(self.ids, min(n, len(self.ids)))
        gone = set(ended)
        self.ids = [r for r in self.ids if r not in gone]
        run_rows, event_rows = [], []
        c = self.clock
        for j in range(len(ended)):
            rid = uuid.UUID(int=self.rng.getrandbits(128)).hex
            self.ids.append(rid)
            self.last_seq[rid] = 2
            at = now - dt.timedelta(seconds=2)
            event_rows.append((rid, 1, c.at(at), "step", None, None, None, None, 1.0, MODELS[j % 3], 900, 120,
                               (900 * 0.15 + 120 * 0.6) / 1e6))
            event_rows.append((rid, 2, c.at(at), "tool", TOOLS[j % len(TOOLS)], f"c{j:015x}", True, None, 0.3,
                               None, None, None, None))
            host, pid, ctime = ((self.host, self.pid, self.ctime) if self.local
                                else (REMOTE_HOST, 40_000 + j, 1.8e9 + j))
            run_rows.append((rid, AGENT, "running", "process", host, pid, ctime, LABELS if j % 2 else None, None,
                             1, 1, 0, 900, 120, (900 * 0.15 + 120 * 0.6) / 1e6, 2, c.at(at), c.at(at), None, None))
        return ended, run_rows, event_rows

    def burst(self, n: int, now: dt.datetime):
        """n tool calls by random active runs in the `tick_s` before now, and their run updates."""
        ev, upd = [], {}
        for k in range(n):
            rid = self.ids[self.rng.randrange(len(self.ids))]
            seq = self.last_seq[rid] + 1
            self.last_seq[rid] = seq
            at = now - dt.timedelta(milliseconds=self.rng.randrange(1, 4000))
            ok = k % 17 != 0
            ev.append((rid, seq, self.clock.at(at), "tool", TOOLS[k % len(TOOLS)], uuid.uuid4().hex[:16], ok,
                       None if ok else "HTTPError: 503", 0.2, None, None, None, None))
            u = upd.setdefault(rid, [0, 0, seq, at])
            u[0] += 1
            u[1] += not ok
            u[2] = seq
            u[3] = max(u[3], at)
        updates = [(a, b, s, self.clock.at(at), rid) for rid, (a, b, s, at) in upd.items()]
        return ev, updates


# --- stores --------------------------------------------------------------------------------------


def pg_conninfo(dbname: str) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(PG_SERVER)
    parts = [f"host={u.host or '127.0.0.1'}", f"port={u.port or 5432}", f"user={u.username or 'postgres'}",
             f"dbname={dbname}"]
    if u.password:
        parts.append(f"password={u.password}")
    return " ".join(parts)


class Backend:
    """Templates (migrated + history) and fresh copies of them, for one database."""

    def __init__(self, name: str):
        self.name = name
        self.sqlite = name == "sqlite"
        self.prefix = f"aw_bench_tick_{os.getpid()}"
        self.made: list[str] = []  # what to remove at the end
        self.tmp = tempfile.mkdtemp(prefix="aw_bench_tick_") if self.sqlite else None
        atexit.register(self.cleanup)

    # -- naming
    def url(self, where: str) -> str:
        return f"sqlite:///{where}" if self.sqlite else f"{PG_SERVER}/{where}"

    def version(self) -> str:
        if self.sqlite:
            return "SQLite " + sqlite3.sqlite_version
        import psycopg

        with psycopg.connect(pg_conninfo(PG_ADMIN_DB)) as c:
            return "PostgreSQL " + c.execute("SHOW server_version").fetchone()[0].split()[0]

    # -- raw connections for bulk writes (never through the code under test)
    def raw(self, where: str):
        if self.sqlite:
            conn = sqlite3.connect(where, timeout=30.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            return conn
        import psycopg

        return psycopg.connect(pg_conninfo(where), autocommit=True)

    def _admin(self, sql: str):
        import psycopg

        with psycopg.connect(pg_conninfo(PG_ADMIN_DB), autocommit=True) as admin:
            admin.execute(sql)

    def create_empty(self, tag: str) -> str:
        from watchdog.store.access import upgrade
        from watchdog.store.engine import make_engine

        if self.sqlite:
            where = os.path.join(self.tmp, f"{tag}.db")
        else:
            where = f"{self.prefix}_{tag}"
            self._admin(f'DROP DATABASE IF EXISTS "{where}" WITH (FORCE)')
            self._admin(f'CREATE DATABASE "{where}"')
        self.made.append(where)
        engine = make_engine(self.url(where))
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        return where

    def insert(self, where_or_conn, runs_rows, event_rows):
        conn = self.raw(where_or_conn) if isinstance(where_or_conn, str) else where_or_conn
        try:
            if self.sqlite:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(f"INSERT INTO runs ({', '.join(RUN_COLS)}) VALUES ({', '.join('?' * len(RUN_COLS))})",
                                 runs_rows)
                conn.executemany(
                    f"INSERT INTO events ({', '.join(EVENT_COLS)}) VALUES ({', '.join('?' * len(EVENT_COLS))})",
                    event_rows)
                conn.execute("COMMIT")
            else:
                with conn.transaction():
                    cur = conn.cursor()
                    with cur.copy(f"COPY runs ({', '.join(RUN_COLS)}) FROM STDIN") as cp:
                        for r in runs_rows:
                            cp.write_row(r)
                    with cur.copy(f"COPY events ({', '.join(EVENT_COLS)}) FROM STDIN") as cp:
                        for r in event_rows:
                            cp.write_row(r)
        finally:
            if isinstance(where_or_conn, str):
                conn.close()

    def write_burst(self, conn, event_rows, updates):
        """New events and what the SDK's UPDATE runs does for them (summed per run), in one transaction."""
        ph = "?" if self.sqlite else "%s"
        greatest = "MAX" if self.sqlite else "GREATEST"
        sql = (f"UPDATE runs SET tool_calls = tool_calls + {ph}, tool_errors = tool_errors + {ph}, "
               f"last_seq = {greatest}(last_seq, {ph}), last_seen_at = {greatest}(last_seen_at, {ph}) "
               f"WHERE id = {ph}")
        ins = f"INSERT INTO events ({', '.join(EVENT_COLS)}) VALUES ({', '.join([ph] * len(EVENT_COLS))})"
        if self.sqlite:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(ins, event_rows)
            conn.executemany(sql, updates)
            conn.execute("COMMIT")
        else:
            with conn.transaction():
                cur = conn.cursor()
                cur.executemany(ins, event_rows)
                cur.executemany(sql, updates)

    def write_churn(self, conn, ended: list[str], run_rows, event_rows, at):
        """What the SDKs write when runs end and others start, in one transaction."""
        ph = "?" if self.sqlite else "%s"
        end = f"UPDATE runs SET status = 'completed', ended_at = {ph}, last_seen_at = {ph} WHERE id = {ph}"
        ins_run = f"INSERT INTO runs ({', '.join(RUN_COLS)}) VALUES ({', '.join([ph] * len(RUN_COLS))})"
        ins_ev = f"INSERT INTO events ({', '.join(EVENT_COLS)}) VALUES ({', '.join([ph] * len(EVENT_COLS))})"
        if self.sqlite:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(end, [(at, at, rid) for rid in ended])
            conn.executemany(ins_run, run_rows)
            conn.executemany(ins_ev, event_rows)
            conn.execute("COMMIT")
        else:
            with conn.transaction():
                cur = conn.cursor()
                cur.executemany(end, [(at, at, rid) for rid in ended])
                cur.executemany(ins_run, run_rows)
                cur.executemany(ins_ev, event_rows)

    def finish_template(self, where: str):
        conn = self.raw(where)
        try:
            if self.sqlite:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            else:
                conn.execute("VACUUM ANALYZE")
        finally:
            conn.close()
        if not self.sqlite:  # nothing (autovacuum included) may hold the template open while it is copied
            self._admin(f'ALTER DATABASE "{where}" WITH ALLOW_CONNECTIONS false')

    def copy(self, template: str, tag: str) -> str:
        if self.sqlite:
            where = os.path.join(self.tmp, f"{tag}.db")
            shutil.copyfile(template, where)
            self.made.append(where)
            return where
        where = f"{self.prefix}_{tag}"
        self._admin(f'DROP DATABASE IF EXISTS "{where}" WITH (FORCE)')
        self.made.append(where)
        for attempt in range(20):
            try:
                self._admin(f'CREATE DATABASE "{where}" TEMPLATE "{template}" STRATEGY FILE_COPY')
                return where
            except Exception as exc:  # noqa: BLE001 — "source database is being accessed by other users"
                if "being accessed" not in str(exc) or attempt == 19:
                    raise
                time.sleep(0.5)
        return where

    def analyze(self, where: str):
        if not self.sqlite:
            conn = self.raw(where)
            try:
                conn.execute("ANALYZE")
            finally:
                conn.close()

    def drop(self, where: str):
        try:
            if self.sqlite:
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(where + suffix):
                        os.remove(where + suffix)
            else:
                self._admin(f'DROP DATABASE IF EXISTS "{where}" WITH (FORCE)')
        finally:
            if where in self.made:
                self.made.remove(where)

    def cleanup(self):
        for where in list(self.made):
            try:
                self.drop(where)
            except Exception as exc:  # noqa: BLE001
                print(f"warning: could not remove {where}: {exc}", file=sys.stderr)
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


# --- the naive tick: the article's pseudo-code ------------------------------------------------

NAIVE_SQL = """
SELECT run_id, count(*) AS n,
       sum(CASE WHEN kind = 'step' THEN 1 ELSE 0 END) AS steps,
       sum(CASE WHEN kind = 'tool' THEN 1 ELSE 0 END) AS tool_calls,
       sum(CASE WHEN kind = 'tool' AND NOT ok THEN 1 ELSE 0 END) AS tool_errors,
       sum(coalesce(cost_eur, 0)) AS cost,
       max(at) AS last_at
FROM events GROUP BY run_id
"""


def naive_tick(engine, config, now: dt.datetime) -> tuple[int, int]:
    """Aggregate every event of every run, then evaluate the same policies: (active runs, verdicts)."""
    from sqlalchemy import select, text

    from watchdog.core import lifecycle as lc
    from watchdog.core.policies import RunSnapshot, evaluate
    from watchdog.store.schema import runs
    from watchdog.store.views import effective_budgets

    with engine.connect() as conn:
        active = conn.execute(select(runs).where(runs.c.status.in_(lc.ACTIVE_STATUSES))).all()
        agg = {r[0]: r for r in conn.execute(text(NAIVE_SQL))}
    verdicts = 0
    for row in active:
        a = agg.get(row.id)
        if a is None:
            continue
        last = a.last_at
        if isinstance(last, str):
            last = dt.datetime.fromisoformat(last).replace(tzinfo=dt.timezone.utc)
        snap = RunSnapshot(id=row.id, agent=row.agent, started_at=row.started_at, last_seen_at=last,
                           steps=int(a.steps), tool_calls=int(a.tool_calls), tool_errors=int(a.tool_errors),
                           cost_eur=float(a.cost))
        verdicts += bool(evaluate(snap, effective_budgets(config.profile(row.agent), row), now))
    return len(active), verdicts


# --- where a warm tick's time goes, without cProfile's distortion -------------------------------


class PhaseTimer:
    """Wall time per phase of Ticker.tick, by wrapping the ticker's own steps on this instance only.

    Phases: load_active (SELECT of the active runs), fold (new events into the caches),
    live_pids (psutil.pids()), per-run (Ticker._one over every row: budgets, facts,
    snapshot, policies, any writes), lease (the daemons row), the money work's steps
    (m_read, m_labels, m_price, m_judge, m_book, m_after), rest (the pre-filter `PreFilter.due`, the
    Counter of (host, pid), loop overhead); gc = time in the cyclic garbage collector.
    """

    def __init__(self, ticker):
        import gc

        self.ticker = ticker
        self.acc: dict[str, list[float]] = {}
        self.cur: dict[str, float] = {}
        self._gc_t0 = None
        wrapped = {"load_active": (ticker.scanner, "load_active"), "fold": (ticker.scanner, "fold"),
                   "live_pids": (ticker, "_live_pids"), "per_run": (ticker, "_one"),
                   "lease": (ticker, "_touch_lease")}
        if ticker.money is not None:  # the money work, by step (watchdog.daemon.money.money)
            m = ticker.money
            wrapped.update({"m_read": (m, "read"), "m_labels": (m, "learn_labels"), "m_price": (m, "price"),
                            "m_judge": (m, "judge"), "m_book": (m, "book"), "m_after": (m, "after")})
        self._undo = []
        for phase, (obj, name) in wrapped.items():
            fn = getattr(obj, name)
            setattr(obj, name, self._wrap(phase, fn))
            self._undo.append((obj, name))
        self._gc_cb = self._on_gc
        gc.callbacks.append(self._gc_cb)

    def _wrap(self, phase, fn):
        pc = time.perf_counter
        cur = self.cur

        def timed(*a, **kw):
            t = pc()
            try:
                return fn(*a, **kw)
            finally:
                cur[phase] = cur.get(phase, 0.0) + pc() - t
        return timed

    def _on_gc(self, stage, info):
        if stage == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0 is not None:
            self.cur["gc"] = self.cur.get("gc", 0.0) + time.perf_counter() - self._gc_t0
            self._gc_t0 = None

    class _Tick:
        def __init__(self, outer):
            self.outer = outer

        def __enter__(self):
            self.outer.cur.clear()
            self.t = time.perf_counter()

        def __exit__(self, *exc):
            total = time.perf_counter() - self.t
            cur = dict(self.outer.cur)
            named = sum(v for k, v in cur.items() if k != "gc")
            cur["rest"] = total - named
            cur["total"] = total
            for k, v in cur.items():
                self.outer.acc.setdefault(k, []).append(v)

    def tick(self):
        return self._Tick(self)

    def remove(self):
        import gc

        for obj, name in self._undo:
            try:
                delattr(obj, name)  # back to the class's method
            except AttributeError:
                pass
        if self._gc_cb in gc.callbacks:
            gc.callbacks.remove(self._gc_cb)

    def summary(self) -> dict:
        return {k: statistics.median(v) * 1e3 for k, v in self.acc.items()}


# --- one configuration ------------------------------------------------------------------------


def ms(seconds: float) -> float:
    return seconds * 1e3


class SchedClock:
    """CPU time and run-queue wait (ns) of this process's main thread plus, on PostgreSQL, of
    the server backends serving the engine, from /proc/<pid>/schedstat.

    The machine is shared: wall time includes time spent waiting for a CPU while other
    work runs. "wall - wait" removes what the tick's threads spent runnable but not running.
    """

    def __init__(self):
        self.pids = [os.getpid()]
        self.ok = os.path.exists(f"/proc/{os.getpid()}/schedstat")

    def watch(self, engine):
        from sqlalchemy import event

        if engine.dialect.name == "postgresql":
            @event.listens_for(engine, "connect")
            def _backend(dbapi_conn, _rec):
                self.pids.append(dbapi_conn.info.backend_pid)

    def read(self) -> tuple[int, int]:
        cpu = wait = 0
        if not self.ok:
            return 0, 0
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/schedstat") as f:
                    a, b, _ = f.read().split()
                cpu += int(a)
                wait += int(b)
            except (OSError, ValueError):
                pass
        return cpu, wait


def measure(be: Backend, template: str, n_hist: int, n_active: int, args, profile_this: bool) -> dict:
    from sqlalchemy import func, select

    from watchdog.daemon.stops.killer import Killer
    from watchdog.store.engine import make_engine
    from watchdog.store.schema import events, runs
    from watchdog.daemon.tick.ticker import Ticker

    rng = random.Random(n_active * 7919 + n_hist)
    tag = f"r{n_active}_h{n_hist}"
    where = be.copy(template, tag)
    res = {"backend": be.name, "active": n_active, "history": n_hist}
    engine = lease = None
    try:
        now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        clock = Clock(be.name, now)
        active = ActiveRuns(n_active, now, clock, rng, args.local)
        t0 = time.perf_counter()
        rr, er = active.initial_rows()
        be.insert(where, rr, er)
        be.analyze(where)
        res["add_active_s"] = time.perf_counter() - t0

        config = bench_config(args.tick_s)
        engine = make_engine(be.url(where))
        sched = SchedClock()
        sched.watch(engine)
        with engine.connect() as conn:
            res["events_total"] = conn.execute(select(func.count()).select_from(events)).scalar()
        # The same store, the same writes, two daemons' ticks: `base` is the tick without the money
        # work (what main ran before prices, the ledger, period budgets and drift), `ticker` has it.
        # A daemon ticks under its lease (watchdog.daemon.leases.lease): the leader's per-tick lease work is
        # part of its tick. Both tickers share one, so both pay it.
        from watchdog.daemon.leases.cluster import Membership
        from watchdog.daemon.leases.lease import lease_for

        killer = Killer()
        lease = lease_for(engine, killer.host, tick_s=args.tick_s)
        lease.acquire()
        # ...and freezes its heap after a full tick (watchdog.daemon.tick.heap): one freezer, as one daemon.
        try:
            from watchdog.daemon.tick.heap import HeapFreezer

            heap: dict = {"heap": HeapFreezer()}
        except ImportError:  # a version before it (this script measures before and after alike)
            heap = {}
        ticker = Ticker(engine, config, killer, membership=Membership(engine, killer.host, lease), **heap)
        base = Ticker(engine, config, Killer(), money=False, membership=Membership(engine, killer.host, lease),
                      **heap)

        def checked_tick(tk, at, acc):
            c0, w0 = sched.read()
            t = time.perf_counter()
            rep = tk.tick(at)
            el = time.perf_counter() - t
            c1, w1 = sched.read()
            acc["cpu"].append((c1 - c0) / 1e6)
            acc["wait"].append((w1 - w0) / 1e6)
            acc["net"].append(ms(el) - (w1 - w0) / 1e6)
            if rep.active != n_active or rep.stops or rep.lost or rep.alarms:
                raise RuntimeError(f"{tag} on {be.name}: the tick did unexpected work: active {rep.active}, "
                                   f"stops {len(rep.stops)}, lost {len(rep.lost)}, alarms {len(rep.alarms)}")
            return el, rep

        def sched_acc():
            return {"cpu": [], "wait": [], "net": []}

        # Per tick: CPU time of the tick's thread and (PostgreSQL) its server backend; their run-queue
        # wait; wall minus that wait.
        res["loadavg_before"] = os.getloadavg()[0]
        el, rep = checked_tick(base, now, sched_acc())
        res["base_cold_ms"] = ms(el)
        el, rep = checked_tick(ticker, now, sched_acc())
        res["cold_ms"] = ms(el)
        res["cold_folded"] = rep.new_events

        writer = be.raw(where)
        try:
            def step(k):
                at = now + dt.timedelta(seconds=args.tick_s * k)
                ev, upd = active.burst(args.new_events, at)
                be.write_burst(writer, ev, upd)
                if args.churn:
                    ended, rr, er = active.churn(args.churn, at)
                    be.write_churn(writer, ended, rr, er, clock.at(at - dt.timedelta(seconds=1)))
                return at

            warm, folded, base_warm, booked = [], [], [], []
            acc, base_acc = sched_acc(), sched_acc()
            k = 0
            at = now
            for _ in range(args.warm_ticks):
                k += 1
                at = step(k)
                # Both tickers fold the same new events; which goes first alternates (cache warmth).
                order = ((base, base_warm, base_acc), (ticker, warm, acc))
                for tk, times, sacc in (order if k % 2 else order[::-1]):
                    el, rep = checked_tick(tk, at, sacc)
                    times.append(ms(el))
                    if tk is ticker:
                        folded.append(rep.new_events)
                        booked.append(rep.booked)
            res["warm_ms"] = warm
            res["warm_median_ms"] = statistics.median(warm)
            res["warm_max_ms"] = max(warm)
            res["warm_min_ms"] = min(warm)
            res["warm_cpu_median_ms"] = statistics.median(acc["cpu"])
            res["warm_wait_median_ms"] = statistics.median(acc["wait"])
            res["warm_net_median_ms"] = statistics.median(acc["net"])
            res["base_warm_median_ms"] = statistics.median(base_warm)
            res["base_warm_min_ms"] = min(base_warm)
            res["base_warm_cpu_median_ms"] = statistics.median(base_acc["cpu"])
            res["base_warm_net_median_ms"] = statistics.median(base_acc["net"])
            res["loadavg_after"] = os.getloadavg()[0]
            res["warm_folded"] = statistics.median(folded)
            res["warm_booked"] = statistics.median(booked)

            # Idle: the same daemon, time going on, nothing written (agents waiting on models). The
            # runs that ended in the warm ticks are booked and sealed first, at their own 30 s pace
            # (watchdog.daemon.money.money, watchdog.daemon.leases.cluster.SEAL_EVERY_S): that is their churn's
            # work, not an idle tick's. These settling ticks are not measured.
            try:
                from watchdog.daemon.leases.cluster import SEAL_EVERY_S
            except ImportError:  # a version that sealed every tick
                SEAL_EVERY_S = 30.0
            k += int(SEAL_EVERY_S // args.tick_s) + 1
            for _ in range(2):
                k += 1
                at = now + dt.timedelta(seconds=args.tick_s * k)
                checked_tick(ticker, at, sched_acc())
            idle, idle_acc = [], sched_acc()
            for _ in range(args.idle_ticks):
                k += 1
                at = now + dt.timedelta(seconds=args.tick_s * k)
                el, rep = checked_tick(ticker, at, idle_acc)
                idle.append(ms(el))
            res["idle_median_ms"] = statistics.median(idle)
            res["idle_net_median_ms"] = statistics.median(idle_acc["net"])

            # The change feed (watchdog.store.changes), the new tick's first read: a restart's
            # start (the active runs), an idle read, and a read after --new-events new events.
            from watchdog.store.changes import ChangeFeed
            from watchdog.store.engine import read_connection

            feed = ChangeFeed()
            t = time.perf_counter()
            with read_connection(engine) as conn:
                started = feed.start(conn)
            res["feed_start_ms"] = ms(time.perf_counter() - t)
            if sum(c.active for c in started.changed) != n_active:
                raise RuntimeError(f"feed start: {len(started.changed)} runs, expected {n_active}")
            feed_idle, feed_new, feed_changed = [], [], []
            for _ in range(args.idle_ticks):
                t = time.perf_counter()
                with read_connection(engine) as conn:
                    got = feed.read(conn)
                feed_idle.append(ms(time.perf_counter() - t))
                if got.changed:
                    raise RuntimeError(f"feed idle read: {len(got.changed)} runs changed")
                k += 1
                at = now + dt.timedelta(seconds=args.tick_s * k)
                ev, upd = active.burst(args.new_events, at)
                be.write_burst(writer, ev, upd)
                t = time.perf_counter()
                with read_connection(engine) as conn:
                    got = feed.read(conn)
                feed_new.append(ms(time.perf_counter() - t))
                feed_changed.append(len(got.changed))
                if len(got.changed) != len(upd):
                    raise RuntimeError(f"feed read: {len(got.changed)} runs changed, {len(upd)} written")
            res["feed_idle_ms"] = statistics.median(feed_idle)
            res["feed_new_ms"] = statistics.median(feed_new)
            res["feed_changed"] = statistics.median(feed_changed)

            if profile_this:
                phases = PhaseTimer(ticker)
                for _ in range(args.profile_ticks):
                    k += 1
                    at = step(k)
                    with phases.tick():
                        ticker.tick(at)
                phases.remove()
                res["phases"] = phases.summary()
                prof = cProfile.Profile()
                ptimes = []
                for _ in range(args.profile_ticks):
                    k += 1
                    at = step(k)
                    prof.enable()
                    t = time.perf_counter()
                    ticker.tick(at)
                    ptimes.append(ms(time.perf_counter() - t))
                    prof.disable()
                res["profile"] = prof
                res["profile_ticks_ms"] = ptimes

            naive = []
            for _ in range(args.naive_ticks):
                t = time.perf_counter()
                n_act, n_verdicts = naive_tick(engine, config, at)
                naive.append(ms(time.perf_counter() - t))
                if n_act != n_active or n_verdicts:
                    raise RuntimeError(f"naive tick: {n_act} active, {n_verdicts} verdicts")
            res["naive_median_ms"] = statistics.median(naive)

            # Breach: N runs over their cost budget; one tick later every one must be stopping.
            n = min(args.breach, n_active)
            victims = rng.sample(active.ids, n)
            ph = "?" if be.sqlite else "%s"
            sql = f"UPDATE runs SET cost_eur = cost_eur + 5000, last_seen_at = {ph} WHERE id = {ph}"
            k += 1
            at = now + dt.timedelta(seconds=args.tick_s * k)
            if be.sqlite:
                writer.execute("BEGIN IMMEDIATE")
                writer.executemany(sql, [(clock.at(at - dt.timedelta(seconds=1)), v) for v in victims])
                writer.execute("COMMIT")
            else:
                with writer.transaction():
                    writer.cursor().executemany(sql, [(at - dt.timedelta(seconds=1), v) for v in victims])
            t = time.perf_counter()
            rep = ticker.tick(at)
            res["breach_tick_ms"] = ms(time.perf_counter() - t)
            with engine.connect() as conn:
                stopping = conn.execute(select(func.count()).select_from(runs).where(
                    runs.c.id.in_(victims), runs.c.status == "stopping")).scalar()
                others = conn.execute(select(func.count()).select_from(runs).where(
                    runs.c.id.not_in(victims), runs.c.status != "running",
                    runs.c.status != "completed")).scalar()
            res["breach_n"] = n
            res["breach_stopping"] = stopping
            res["breach_reported"] = len(rep.stops)
            res["breach_collateral"] = others
            k += 1
            t = time.perf_counter()
            ticker.tick(now + dt.timedelta(seconds=args.tick_s * k))
            res["after_breach_tick_ms"] = ms(time.perf_counter() - t)
        finally:
            writer.close()
    finally:
        if lease is not None:
            lease.release()
        if engine is not None:
            engine.dispose()
        be.drop(where)
    return res


def build_template(be: Backend, n_hist: int) -> tuple[str, float]:
    t0 = time.perf_counter()
    where = be.create_empty(f"h{n_hist}")
    origin = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=3, hours=1)
    rr, er = history_rows(n_hist, Clock(be.name, origin), random.Random(n_hist))
    be.insert(where, rr, er)
    del rr, er
    book_history(be, where, origin + dt.timedelta(days=3))
    be.finish_template(where)
    return where, time.perf_counter() - t0


def book_history(be: Backend, where: str, now: dt.datetime) -> None:
    """Book the history into the spend ledger and the drift rollups, and seal its runs (their top
    tool on the row), as the daemon that watched those runs end did: the warm ticks then read a
    real baseline (3 days of 5-minute buckets), and do not drain a backlog of 20,000 unsealed
    runs 500 a tick (what a daemon does once after an upgrade, not in its steady state)."""
    from watchdog.core.periods import zone
    from watchdog.store import ledger, retention
    from watchdog.store.engine import make_engine

    engine = make_engine(be.url(where))
    try:
        while True:
            with engine.begin() as conn:
                rows = ledger.read_unbooked(conn, limit=20_000)
                if not rows:
                    break
                ledger.book(conn, rows, now, zone("UTC"), bench_config(5.0).budgets)
        while retention.seal_ended(engine, limit=5_000):
            pass
    finally:
        engine.dispose()


# --- output -----------------------------------------------------------------------------------


# Issue 25's goals (ms), at the largest active count: the warm tick at --new-events new events, the
# idle tick (nothing new), and the change feed's share of each (its read at --new-events changes,
# its read when nothing changed). Set from the command line (main).
TARGETS = {"changed": 25.0, "idle": 5.0, "feed": 5.0, "feed_idle": 1.0}


def _mark(value_ms: float, target_ms: float) -> str:
    return "ok" if value_ms <= target_ms else "MISS"


def fmt_table(rows: list[dict]) -> str:
    head = ("backend", "active runs", "history", "events in table", "cold ms", "base p50 ms", "warm p50 ms",
            "warm/base", f"changed tick p50 ms (<= {TARGETS['changed']:g})", f"idle tick p50 ms (<= {TARGETS['idle']:g})",
            f"feed read ms, N changed (<= {TARGETS['feed']:g})", f"feed idle ms (<= {TARGETS['feed_idle']:g})",
            "feed start ms", "booked/tick", "warm min ms",
            "warm max ms", "warm CPU p50 ms", "CPU-queue wait p50 ms", "wall-wait p50 ms", "naive p50 ms",
            "naive/warm", "breach -> stopping", "breach tick ms", "next tick ms", "load avg")
    lines = []
    for r in rows:
        lines.append((
            r["backend"], f"{r['active']:,}", f"{r['history']:,}", f"{r['events_total']:,}",
            f"{r['cold_ms']:.1f}", f"{r['base_warm_median_ms']:.1f}", f"{r['warm_median_ms']:.1f}",
            f"{r['warm_median_ms'] / r['base_warm_median_ms']:.2f}x",
            f"{r['warm_median_ms']:.1f} {_mark(r['warm_median_ms'], TARGETS['changed'])}",
            f"{r['idle_median_ms']:.1f} {_mark(r['idle_median_ms'], TARGETS['idle'])}",
            f"{r['feed_new_ms']:.2f}, {r['feed_changed']:g} {_mark(r['feed_new_ms'], TARGETS['feed'])}",
            f"{r['feed_idle_ms']:.2f} {_mark(r['feed_idle_ms'], TARGETS['feed_idle'])}",
            f"{r['feed_start_ms']:.1f}", f"{r['warm_booked']:g}",
            f"{r['warm_min_ms']:.1f}", f"{r['warm_max_ms']:.1f}",
            f"{r['warm_cpu_median_ms']:.1f}", f"{r['warm_wait_median_ms']:.1f}", f"{r['warm_net_median_ms']:.1f}",
            f"{r['naive_median_ms']:.1f}", f"{r['naive_median_ms'] / r['warm_median_ms']:.1f}x",
            f"{r['breach_stopping']}/{r['breach_n']}" + ("" if r["breach_collateral"] == 0 else
                                                         f" (+{r['breach_collateral']} others!)"),
            f"{r['breach_tick_ms']:.1f}", f"{r['after_breach_tick_ms']:.1f}",
            f"{r['loadavg_before']:.1f}-{r['loadavg_after']:.1f}",
        ))
    widths = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for x in lines:
        out.append("| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(x, widths)))
                   + " |")
    return "\n".join(out)


def verdicts(rows: list[dict], target_ms: float) -> list[str]:
    out = []
    by = {(r["backend"], r["active"], r["history"]): r for r in rows}
    top_active = max(r["active"] for r in rows)
    for r in rows:
        if r["active"] == top_active:
            if r["warm_median_ms"] < target_ms:
                verdict = "PASS"
            elif r["warm_net_median_ms"] < target_ms:
                verdict = "MISS on the wall clock, PASS without the CPU-queue wait (the machine is busy)"
            else:
                verdict = "MISS"
            out.append(f"- warm tick, {r['backend']}, {r['active']:,} active, {r['history']:,} history: "
                       f"{r['warm_median_ms']:.1f} ms (min {r['warm_min_ms']:.1f}, max {r['warm_max_ms']:.1f}; "
                       f"CPU {r['warm_cpu_median_ms']:.1f}, wall-wait {r['warm_net_median_ms']:.1f}) — {verdict} "
                       f"(target < {target_ms:g} ms)")
    for r in rows:
        if r["active"] != top_active:
            continue
        for key, what, target in (("idle_median_ms", "idle tick (nothing new)", TARGETS["idle"]),
                                  ("feed_new_ms", f"change feed read ({r['feed_changed']:g} runs changed)",
                                   TARGETS["feed"]),
                                  ("feed_idle_ms", "change feed read (nothing changed)", TARGETS["feed_idle"])):
            out.append(f"- {what}, {r['backend']}, {r['active']:,} active, {r['history']:,} history: "
                       f"{r[key]:.2f} ms — {'PASS' if r[key] <= target else 'MISS'} (target <= {target:g} ms)")
    for r in rows:
        if r["active"] != top_active:
            continue
        ratio = r["warm_median_ms"] / r["base_warm_median_ms"]
        ratio_min = r["warm_min_ms"] / r["base_warm_min_ms"]
        ratio_cpu = r["warm_cpu_median_ms"] / r["base_warm_cpu_median_ms"]
        if ratio <= 1.2:
            verdict = "PASS"
        elif ratio_cpu <= 1.2:
            verdict = "MISS on the wall clock, PASS on CPU (the machine is busy)"
        elif ratio_min <= 1.2:
            verdict = "MISS on the median, PASS on the fastest tick (noise? rerun, or raise --warm-ticks)"
        else:
            verdict = "MISS"
        out.append(f"- money work (prices, ledger, period budgets, drift), {r['backend']}, {r['active']:,} active, "
                   f"{r['history']:,} history: warm {r['warm_median_ms']:.1f} ms vs {r['base_warm_median_ms']:.1f} "
                   f"ms without = {ratio:.2f}x median, {ratio_min:.2f}x min, {ratio_cpu:.2f}x CPU — {verdict} "
                   f"(target <= 1.2x)")
    hist = sorted({r["history"] for r in rows})
    if len(hist) > 1:
        lo, hi = hist[0], hist[-1]
        for (backend, active, h), r in sorted(by.items()):
            if h != hi or (backend, active, lo) not in by:
                continue
            base = by[(backend, active, lo)]
            ratio = r["warm_median_ms"] / base["warm_median_ms"]
            ratio_min = r["warm_min_ms"] / base["warm_min_ms"]
            ratio_cpu = r["warm_cpu_median_ms"] / base["warm_cpu_median_ms"]
            ratio_net = r["warm_net_median_ms"] / base["warm_net_median_ms"]
            if ratio <= 1.2:
                verdict = "PASS"
            elif ratio_cpu <= 1.2 and ratio_net <= 1.2:
                verdict = "MISS on the wall clock, PASS on CPU and wall-wait (the machine is busy)"
            elif ratio_min <= 1.2:
                verdict = "MISS on the median, PASS on the fastest tick (noise? rerun, or raise --warm-ticks)"
            else:
                verdict = "MISS"
            out.append(f"- history independence, {backend}, {active:,} active: warm {hi:,} / {lo:,} history = "
                       f"{ratio:.2f}x median, {ratio_min:.2f}x min, {ratio_cpu:.2f}x CPU, {ratio_net:.2f}x "
                       f"wall-wait — {verdict} (target <= 1.2x)")
    bad = [r for r in rows if r["breach_stopping"] != r["breach_n"] or r["breach_collateral"]]
    total = sum(r["breach_n"] for r in rows)
    out.append(f"- breach -> stopping within one tick: {sum(r['breach_stopping'] for r in rows)}/{total} runs "
               f"over {len(rows)} configurations — {'PASS' if not bad else 'MISS'}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="100,1000,10000", help="active runs, comma-separated")
    p.add_argument("--events", default="10000,100000,1000000", help="history events, comma-separated")
    p.add_argument("--backends", default="sqlite,postgresql")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 100,1000 active x 10000,100000 history, fewer ticks")
    p.add_argument("--warm-ticks", type=int, default=15)
    p.add_argument("--new-events", type=int, default=300, help="events written between two warm ticks")
    p.add_argument("--naive-ticks", type=int, default=3)
    p.add_argument("--churn", type=int, default=20,
                   help="active runs that end (and as many new ones that start) between two warm ticks")
    p.add_argument("--breach", type=int, default=100, help="runs pushed over budget (capped at the active runs)")
    p.add_argument("--tick-s", type=float, default=5.0, help="simulated time between ticks")
    p.add_argument("--local", action="store_true",
                   help="register the active runs on this host with the benchmark's own pid (see the docstring)")
    p.add_argument("--target-ms", type=float, default=TARGETS["changed"],
                   help="warm tick at the largest active count, with --new-events new events (issue 25: 25 ms)")
    p.add_argument("--idle-target-ms", type=float, default=TARGETS["idle"],
                   help="idle tick at the largest active count, nothing new (issue 25: 5 ms)")
    p.add_argument("--idle-ticks", type=int, default=5, help="idle ticks (and change feed reads) measured")
    p.add_argument("--profile", action="store_true",
                   help="cProfile the warm tick at the largest active count and largest history, per backend")
    p.add_argument("--profile-ticks", type=int, default=5)
    p.add_argument("--profile-top", type=int, default=30)
    p.add_argument("--profile-out", default=None, help="directory for the .prof files")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.quick:
        if args.runs == p.get_default("runs"):
            args.runs = "100,1000"
        if args.events == p.get_default("events"):
            args.events = "10000,100000"
        args.warm_ticks = min(args.warm_ticks, 5)
        args.naive_ticks = min(args.naive_ticks, 2)
    TARGETS.update(changed=args.target_ms, idle=args.idle_target_ms)
    run_counts = [int(x) for x in args.runs.split(",") if x]
    hist_counts = [int(x) for x in args.events.split(",") if x]
    backends = [x for x in args.backends.split(",") if x]

    # The tick logs each stop (WARNING): keep that work, but send it nowhere instead of stderr.
    logging.getLogger("watchdog").addHandler(logging.NullHandler())
    started = time.perf_counter()
    print(f"# Tick benchmark: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {platform.platform()}")
    print(f"# active runs {run_counts}, history {hist_counts}, backends {backends}, warm ticks {args.warm_ticks} "
          f"with {args.new_events} new events each, tick_s {args.tick_s:g}, hosts "
          f"{'local (own pid)' if args.local else REMOTE_HOST}")
    import watchdog

    print(f"# watchdog imported from {os.path.dirname(watchdog.__file__)}; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    rows, profiles, loads = [], {}, {}
    for name in backends:
        be = Backend(name)
        print(f"\n## {be.version()}", flush=True)
        try:
            for n_hist in hist_counts:
                template, load_s = build_template(be, n_hist)
                loads[(name, n_hist)] = load_s
                print(f"  history {n_hist:>9,}: template built in {load_s:.1f} s", flush=True)
                for n_active in run_counts:
                    prof = args.profile and n_active == max(run_counts) and n_hist == max(hist_counts)
                    r = measure(be, template, n_hist, n_active, args, prof)
                    if "profile" in r:
                        profiles[name] = (r.pop("profile"), r.pop("profile_ticks_ms"), n_active, n_hist,
                                          r["phases"])
                    r["template_load_s"] = load_s
                    rows.append(r)
                    print(f"    {n_active:>6,} active: cold {r['cold_ms']:7.1f} ms, warm p50 "
                          f"{r['warm_median_ms']:6.1f} ms (without the money work {r['base_warm_median_ms']:6.1f}), idle "
                          f"{r['idle_median_ms']:6.1f} ms, feed {r['feed_new_ms']:.2f} ms ({r['feed_changed']:g} changed) / "
                          f"{r['feed_idle_ms']:.2f} ms idle, naive {r['naive_median_ms']:7.1f} ms, breach "
                          f"{r['breach_stopping']}/{r['breach_n']} stopping in one tick "
                          f"({r['breach_tick_ms']:.1f} ms)  [setup {r['add_active_s']:.1f} s]", flush=True)
                be.drop(template)
        finally:
            be.cleanup()

    print("\n## Results (times in ms; warm = median of "
          f"{args.warm_ticks} ticks, each after {args.new_events} new events)\n")
    print(fmt_table(rows))
    print()
    print("\n".join(verdicts(rows, args.target_ms)))
    print("\nhistory templates loaded: " + ", ".join(f"{b} {h:,}: {s:.1f} s" for (b, h), s in loads.items()))
    print(f"total wall time {time.perf_counter() - started:.0f} s")

    for name, (prof, ptimes, n_active, n_hist, phases) in profiles.items():
        print(f"\n## Profile: warm ticks on {name}, {n_active:,} active, {n_hist:,} history\n")
        order = ("load_active", "fold", "live_pids", "per_run", "lease", "m_read", "m_labels", "m_price", "m_judge",
                 "m_book", "m_after", "rest", "total", "gc")
        print("Phases (median of {} uninstrumented-by-cProfile ticks, ms): ".format(args.profile_ticks)
              + ", ".join(f"{k} {phases[k]:.1f}" for k in order if k in phases)
              + "  (gc overlaps the phases)")
        print(f"\ncProfile over {len(ptimes)} more ticks ({', '.join(f'{t:.0f}' for t in ptimes)} ms each "
              "under the profiler):\n")
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            st = pstats.Stats(prof, stream=buf)
            st.strip_dirs().sort_stats(key).print_stats(args.profile_top)
            text = buf.getvalue()
            print(text[text.find("   ncalls"):] if "   ncalls" in text else text)
        if args.profile_out:
            os.makedirs(args.profile_out, exist_ok=True)
            prof.dump_stats(os.path.join(args.profile_out, f"tick_{name}_{n_active}_{n_hist}.prof"))

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows,
                       "loads": {f"{b}:{h}": s for (b, h), s in loads.items()}}, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
