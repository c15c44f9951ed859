#!/usr/bin/env python
"""Scale benchmark (issue 35): fleets of active runs on one PostgreSQL with partitioned events.

For each fleet size (--fleets, default 10,000 / 30,000 / 100,000 active runs) a fresh database
`aw_bench_scale_<pid>_<n>` (dropped at the end) is migrated to head, gets the shipped roles
script and one agent login, and the fleet is bulk-loaded (COPY, triggers off: a fixture, not a
measurement) with EVENTS_PER_RUN events per run, owned by that login. Then, in the same run:

  ingest  --writers processes, each its own slice of the runs, record flat out for --ingest-s
          seconds through the SDK's own statement (watchdog.store.agent_writes.AgentSQL.record:
          the event and its run's counters, one autocommit statement) as the agent login, so
          row-level security, the checks, the server-time trigger, the seq-once trigger and the
          change feed all run: events/s stored (counted in the store afterwards).
  copy    the COPY baseline: as many events in one COPY by the tables' owner (a confined login
          may not COPY into a table with row-level security), triggers on, into COPY_SINKS ended
          runs (events no active run's row counts would get every run judged whole): events/s.
  tick    one judge (a real Ticker, the daemon's lease held) ticks every --tick-s while the
          writers record at --rate events/s in total (paced): the cold tick, then the p50 / p99
          of --ticks changed ticks (every tick has new events). With --judges N, N Tickers share
          the runs by shard (watchdog.daemon.leases.shards, advisory locks), ticked one after the other
          in each period: p50 / p99 per judge's tick.
  breach  during those ticks, --breaches runs (max_steps = their steps) each get one step more,
          one at a time at a random moment of a tick period: the latency from that record's
          commit to the run read back `stopping`, and how many ticks that took.

Retention (once, on a database of its own): two past days of ended runs, --drop-events events
each, loaded into their day partitions. Day A is pruned by the DELETE path the partitions
replace (watchdog.store.retention.prune with the partition drop off: batches of deletes by run),
then day B by the partition drop (the same prune, as `db prune` runs it): the time of each
whole prune and of the drop's own transaction.

Not a test: it asserts nothing about times; it prints a markdown table (and --json).
Server: AW_BENCH_PG (default postgresql+psycopg://postgres@127.0.0.1:5432, a superuser).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PG_SERVER = os.environ.get("AW_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
SCRIPT = ROOT / "sql" / "postgres-roles.sql"
AGENT = "bench-agent"
HOST = "bench-elsewhere"  # not this machine: the judge never reads /proc for them nor signals
EVENTS_PER_RUN = 5
COPY_SINKS = 1000  # ended runs the COPY baseline writes its events to
AW_BURST = True  # the stores have revision 0017's aw_burst (main: False for an older --revision)
SEQ_PHASE = {"ingest": 1_000, "tick": 10_000_000, "breach": 500_000_000}
RUN_COLS = ("id", "agent", "status", "kill_mode", "host", "pid", "pid_create_time", "steps", "tool_calls",
            "last_seq", "started_at", "last_seen_at", "ended_at", "owner", "max_steps", "source", "tokens_in",
            "tokens_out", "cost_eur")
EV_COLS = ("run_id", "seq", "at", "kind", "tool", "args_hash", "ok", "duration_s", "tokens_in", "tokens_out",
           "cost_eur", "stored_at")


def conninfo(db: str, user: str | None = None) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(PG_SERVER)
    s = f"host={u.host or '127.0.0.1'} port={u.port or 5432} user={user or u.username or 'postgres'} dbname={db}"
    return s + (f" password={u.password}" if u.password else "")


def url(db: str, user: str | None = None) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(PG_SERVER).set(database=db)
    return (u.set(username=user) if user else u).render_as_string(hide_password=False)


def admin(sql: str) -> None:
    with psycopg.connect(conninfo("postgres"), autocommit=True) as conn:
        conn.execute(sql)


class Store:
    """One fresh database, migrated, with the roles script and one agent login."""

    def __init__(self, tag: str, revision: str = "head"):
        self.db = f"aw_bench_scale_{os.getpid()}_{tag}"
        self.login = f"aw_bsa_{os.getpid()}_{tag}"
        admin(f'CREATE DATABASE "{self.db}"')
        from watchdog.store import access
        from watchdog.store.engine import make_engine

        eng = make_engine(url(self.db))
        access.upgrade(eng, revision)
        eng.dispose()
        u = psycopg.conninfo.conninfo_to_dict(conninfo(self.db))
        done = subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", "-h", u["host"], "-p", str(u["port"]),
                               "-U", u["user"], "-d", self.db, "-f", str(SCRIPT)], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(done.stderr)
        admin(f'DROP ROLE IF EXISTS "{self.login}"')
        admin(f'CREATE ROLE "{self.login}" LOGIN IN ROLE agent_watchdog_agents')

    def drop(self) -> None:
        admin(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
        admin(f'DROP ROLE IF EXISTS "{self.login}"')

    def load(self, run_rows, event_rows) -> None:
        with psycopg.connect(conninfo(self.db)) as conn, conn.cursor() as cur:
            parted = cur.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'events' "
                                 "AND column_name = 'stored_at'").fetchone()[0]
            cols = EV_COLS if parted else EV_COLS[:-1]
            cur.execute("SET session_replication_role = replica")  # a fixture: no triggers
            with cur.copy(f"COPY runs ({', '.join(RUN_COLS)}) FROM STDIN") as cp:
                for r in run_rows:
                    cp.write_row(r)
            with cur.copy(f"COPY events ({', '.join(cols)}) FROM STDIN") as cp:
                for r in event_rows:
                    cp.write_row(r[:len(cols)])
            # Revision 0018's index of the change numbers (and 0020's copy of the light columns in
            # it), as the triggers would have filled it.
            if cur.execute("SELECT to_regclass('run_changes') IS NOT NULL").fetchone()[0]:
                light = [c for (c,) in cur.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = 'run_changes'::regclass AND attnum > 3 "
                    "AND NOT attisdropped ORDER BY attnum").fetchall()]
                cols = ", ".join(["change_seq", "shard", *light])
                cur.execute(f"INSERT INTO run_changes (run_id, {cols}) SELECT id, {cols} FROM runs "
                            f"ON CONFLICT (run_id) DO UPDATE SET ({cols}) = ROW(EXCLUDED.{cols.replace(', ', ', EXCLUDED.')})")
        with psycopg.connect(conninfo(self.db), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")


def judge_hosts(judges: int) -> list[str]:
    """The hosts of several judges: each the daemon of a host of its own."""
    return [f"bench-judge-{i}" for i in range(judges)]


def fleet_rows(n: int, login: str, now: dt.datetime, breaches: int, hosts: list[str] | None = None):
    """`hosts`: the runs' hosts, round robin (default: HOST, one host no daemon holds)."""
    hosts = hosts or [HOST]
    runs, evs = [], []
    ids = [uuid.uuid4().hex for _ in range(n)]
    for i, rid in enumerate(ids):
        started = now - dt.timedelta(seconds=60 + i % 240)
        steps = (EVENTS_PER_RUN + 1) // 2
        # The row's counters are its events' sums (as the SDK keeps them): a row behind its events
        # is judged whole every tick.
        runs.append((rid, AGENT, "running", "process", hosts[i % len(hosts)], 20_000 + i, 1.7e9 + i, steps, EVENTS_PER_RUN - steps,
                     EVENTS_PER_RUN, started, now, None, login, steps if i < breaches else None, "sdk",
                     900 * steps, 120 * steps, 0.0002 * steps))
        for seq in range(1, EVENTS_PER_RUN + 1):
            at = started + dt.timedelta(seconds=seq)
            if seq % 2:
                evs.append((rid, seq, at, "step", None, None, None, 1.0, 900, 120, 0.0002, at))
            else:
                evs.append((rid, seq, at, "tool", "search", f"{i:08x}{seq:08x}", True, 0.2, None, None, None, at))
    return ids, runs, evs


def writer(db: str, login: str, ids: list[str], seq0: int, rate: float, seconds: float, out, burst: int = 1,
           per_run: int = 1) -> None:
    """One writer process: records for its runs, round robin, through the SDK's statement; with
    `burst` > 1, that many records at a time through the SDK's burst (watchdog.store.bursts: what
    the SDK writes when that many of its threads' records meet at the store), `per_run` consecutive
    records of each run (1: every record of a burst another run's; > 1: runs of several threads)."""
    from watchdog.store.agent_writes import AgentSQL
    from watchdog.store.bursts import burst_statements
    from watchdog.store.dialects import for_name

    sql = AgentSQL(for_name("postgresql"))
    seq = {rid: seq0 for rid in ids}
    n, k = 0, 0
    with psycopg.connect(conninfo(db, login), autocommit=True, prepare_threshold=None) as conn:
        cur = conn.cursor()
        t0 = time.perf_counter()
        while True:
            now = time.perf_counter() - t0
            if now >= seconds:
                break
            if rate and n >= rate * now:
                time.sleep(min(0.005, n / rate - now))
                continue
            records = []
            for _ in range(burst):
                rid = ids[(k // per_run) % len(ids)]
                k += 1
                seq[rid] += 1
                event = (rid, seq[rid], None, "tool", "search", uuid.uuid4().hex[:16], None, True, None, None, 0.2,
                         None, None, None, None, None, None, None, None, None)
                records.append((event, (0, 1, 0, 0, 0, 0.0, 0, 0, 0, seq[rid], None, None, rid)))
            # (Before revision 0017 there is no aw_burst: the burst as 0015's multi-row VALUES.)
            for statement, params in (sql.record(*records[0]) if burst == 1
                                      else burst_statements(sql, records, arrays=AW_BURST)):
                cur.execute(statement, params)
                cur.fetchall()  # the runs' statuses, as the SDK reads them back
            n += burst
    out.put(n)


def start_writers(st: Store, ids, n_writers, seq0, rate, seconds, burst: int = 1, per_run: int = 1):
    q: mp.Queue = mp.Queue()
    share = [ids[i::n_writers] for i in range(n_writers)]
    procs = [mp.Process(target=writer, args=(st.db, st.login, share[i], seq0, rate / n_writers if rate else 0.0,
                                             seconds, q, burst, per_run)) for i in range(n_writers)]
    for p in procs:
        p.start()
    return procs, q


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else float("nan")


def ingest(st: Store, ids, args) -> dict:
    with psycopg.connect(conninfo(st.db), autocommit=True) as conn:
        top = conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
    procs, q = start_writers(st, ids, args.writers, SEQ_PHASE["ingest"], 0.0, args.ingest_s, args.burst,
                             args.burst_per_run)
    for p in procs:
        p.join()
    with psycopg.connect(conninfo(st.db), autocommit=True) as conn:
        stored = conn.execute("SELECT count(*) FROM events WHERE id > %s", (top,)).fetchone()[0]
        # Into ended runs of their own: events the runs' rows do not count would make every active
        # run "behind its events" and judged whole each tick after.
        sinks = [uuid.uuid4().hex for _ in range(COPY_SINKS)]
        with conn.cursor() as cur, cur.copy(f"COPY runs ({', '.join(RUN_COLS)}) FROM STDIN") as cp:
            t = dt.datetime.now(dt.timezone.utc)
            for rid in sinks:
                cp.write_row((rid, AGENT, "completed", "process", HOST, 1, 1.0, 0, 0, 0, t, t, t, st.login, None,
                              "sdk", 0, 0, 0.0))
        rows = [(sinks[i % COPY_SINKS], 1 + i // COPY_SINKS, "tool", "search", f"c{i:015x}", True)
                for i in range(stored)]
        t0 = time.perf_counter()
        with conn.cursor() as cur, cur.copy("COPY events (run_id, seq, kind, tool, args_hash, ok, at) FROM STDIN") as cp:
            stamp = dt.datetime.now(dt.timezone.utc)
            for r in rows:
                cp.write_row((*r, stamp))
        copy_s = time.perf_counter() - t0
    return {"sdk_eps": stored / args.ingest_s, "copy_eps": stored / copy_s, "ingest_events": stored,
            "burst": args.burst, "burst_per_run": args.burst_per_run, "writers": args.writers}


def ticks(st: Store, ids, args) -> dict:
    from watchdog.core.config import Budgets, Config, DaemonConfig, StoreConfig
    from watchdog.daemon.leases.cluster import Membership
    from watchdog.daemon.stops.killer import Killer
    from watchdog.daemon.leases.lease import lease_for
    from watchdog.daemon.leases.shards import ShardSet
    from watchdog.daemon.tick.ticker import Ticker
    from watchdog.store.agent_writes import AgentSQL
    from watchdog.store.dialects import for_name
    from watchdog.store.engine import make_engine
    from watchdog.store.schema import utcnow

    budgets = Budgets(max_wall_s=7 * 86400.0, max_steps=10_000_000, max_tool_calls=10_000_000, max_cost_eur=1e6,
                      max_identical_calls=10_000, heartbeat_timeout_s=3600.0, max_tool_calls_per_min=1_000_000,
                      max_cost_eur_per_day=1e9, max_cost_eur_per_month=1e9)
    def config() -> Config:  # a state directory per judge
        return Config(daemon=DaemonConfig(tick_s=args.tick_s, state_dir=tempfile.mkdtemp(prefix="aw-bench-scale-")),
                      store=StoreConfig(keep_days=0), defaults=budgets, agents={AGENT: budgets})

    eng = make_engine(url(st.db))
    killer = Killer()
    # One judge: this machine's daemon. Several: each the daemon of a host of its own (its own
    # lease, as `agent-watchdog run` with [daemon] shards on each host), the first the leader
    # (the money, the cluster duties, the fleet's host adopted: it reads every run). With
    # --hosts-have-daemons the runs are on the judges' hosts: no host adopted, each judge carries
    # out its own host's runs (none are this machine's: the shared Killer never signals them).
    hosts = [killer.host] if args.judges == 1 else judge_hosts(args.judges)
    leases = [lease_for(eng, h, tick_s=args.tick_s) for h in hosts]
    for lease in leases:
        lease.acquire()
    judges = [Ticker(eng, config(), killer, membership=Membership(eng, h, lease)) for h, lease in zip(hosts, leases)]
    shards = [ShardSet(eng) for _ in judges] if args.judges > 1 else []
    for s in shards:  # every judge present before any takes its share
        s.rebalance()
    per_judge: list[list[float]] = [[] for _ in judges]

    prof = cProfile.Profile() if args.profile else None

    def tick(i: int) -> float:
        if shards:
            shards[i].before_tick(judges[i])
        this = judges[i].this
        profiled = (prof is not None and bool(per_judge[0]) and this is not None
                    and (i == follower if args.profile_follower else this.rep.leader))
        t = time.perf_counter()
        if profiled:
            prof.enable()
        judges[i].tick(utcnow())
        if profiled:
            prof.disable()
        ms = (time.perf_counter() - t) * 1000
        per_judge[i].append(ms)
        return ms

    follower = -1  # the judge whose ticks --profile-follower profiles: set after the cold ticks
    cold_ms = max(tick(i) for i in range(len(judges)))
    follower = next((i for i, j in enumerate(judges) if j.this is not None and not j.this.rep.leader), -1)
    for ms in per_judge:
        ms.clear()
    breach_ids = ids[:args.breaches]
    writing = ids[args.breaches:]
    procs, q = start_writers(st, writing, args.writers, SEQ_PHASE["tick"], args.rate, args.ticks * args.tick_s + 5)
    sql = AgentSQL(for_name("postgresql"))
    rng = random.Random(35)
    durations, latency, ticks_needed = [], [], []
    pending: dict[str, tuple[float, int]] = {}
    breach_at = {k: breach_ids[i] for i, k in enumerate(range(3, 3 + len(breach_ids)))}
    with psycopg.connect(conninfo(st.db, st.login), autocommit=True) as agent, \
            psycopg.connect(conninfo(st.db), autocommit=True) as watch:
        time.sleep(1.0)  # the writers connected and writing
        next_at = time.perf_counter()
        for k in range(args.ticks):
            if k in breach_at:  # one record over the run's max_steps, at a random moment of this period
                time.sleep(rng.uniform(0, args.tick_s * 0.9))
                rid = breach_at[k]
                event = (rid, SEQ_PHASE["breach"], None, "step", None, None, None, None, None, None, 1.0, "gpt-x",
                         10, 1, 0.0, None, None, None, None, None)
                update = (1, 0, 0, 10, 1, 0.0, 0, 0, 0, SEQ_PHASE["breach"], None, None, rid)
                for statement, params in sql.record(event, update):
                    agent.execute(statement, params)
                pending[rid] = (time.perf_counter(), k)
            next_at += args.tick_s
            time.sleep(max(0.0, next_at - time.perf_counter()))
            # The judges one after the other (rotating who goes first): each tick is one judge's alone.
            for j in range(len(judges)):
                durations.append(tick((j + k) % len(judges)))
            if pending:
                done = dict(watch.execute("SELECT id, status FROM runs WHERE id = ANY(%s)", (list(pending),)).fetchall())
                for rid in [r for r, s in done.items() if s == "stopping"]:
                    at, k0 = pending.pop(rid)
                    latency.append((time.perf_counter() - at) * 1000)
                    ticks_needed.append(k - k0 + 1)
    for p in procs:
        p.join()
    written = sum(q.get() for _ in procs)
    leader = [i for i, j in enumerate(judges) if j.this is not None and j.this.rep.leader]
    others = [ms for i, ms in enumerate(per_judge) if i not in leader]
    if prof is not None:  # the leader's changed ticks, by cumulative time
        prof.dump_stats(args.profile)
    for sh in shards:
        sh.close()
    for lease in leases:
        lease.release()
    eng.dispose()
    return {"judges": len(judges), "cold_ms": cold_ms, "tick_p50_ms": pct(durations, 50), "tick_p99_ms": pct(durations, 99),
            "leader_p50_ms": pct([m for i in leader for m in per_judge[i]], 50) if leader else float("nan"),
            "others_p50_ms": pct([m for ms in others for m in ms], 50) if others else float("nan"),
            "others_p99_ms": pct([m for ms in others for m in ms], 99) if others else float("nan"),
            "judge_p50_ms": [pct(ms, 50) for ms in per_judge], "leaders": len(leader),
            "adopted": sorted({h for j in judges if j.this is not None for h in j.this.rep.adopted}),
            "tick_max_ms": max(durations), "ticks": len(durations), "offered_eps": written / (args.ticks * args.tick_s + 5),
            "breach_p50_ms": pct(latency, 50), "breach_max_ms": max(latency) if latency else float("nan"),
            "breaches_stopped": len(latency), "breaches": len(breach_ids),
            "breach_max_ticks": max(ticks_needed) if ticks_needed else None}


def retention_bench(args) -> dict:
    from watchdog.store import partitions, retention
    from watchdog.store.engine import make_engine

    st = Store("ret")
    try:
        eng = make_engine(url(st.db))
        today = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        days = {"delete": today - dt.timedelta(days=41), "drop": today - dt.timedelta(days=40)}
        per_run = 100
        for day in days.values():
            with eng.begin() as conn:
                partitions._make_day(conn, day.date())
            n_runs = args.drop_events // per_run
            runs, evs = [], []
            for i in range(n_runs):
                rid = uuid.uuid4().hex
                t = day + dt.timedelta(seconds=i * 86000 / n_runs)
                runs.append((rid, AGENT, "completed", "process", HOST, 1, 1.0, per_run // 2, per_run // 2, per_run,
                             t, t, t + dt.timedelta(seconds=per_run), st.login, None, "sdk", 0, 0, 0.0))
                for seq in range(1, per_run + 1):
                    at = t + dt.timedelta(seconds=seq)
                    evs.append((rid, seq, at, "tool", "search", f"{i:08x}{seq:08x}", True, 0.2, None, None, None, at))
            st.load(runs, evs)
        # Day A: what `db prune` did before partitions (the drop switched off), cutoff past its runs only.
        cut_a = days["delete"] + dt.timedelta(days=1)
        t0 = time.perf_counter()
        rep_a = retention.prune(eng, cut_a, drop_partitions=False)
        delete_s = time.perf_counter() - t0
        partitions.drop_expired(eng, cut_a, retention._prunable(cut_a))  # its (now empty) day goes too, unmeasured
        cut_b = days["drop"] + dt.timedelta(days=1)
        t0 = time.perf_counter()
        rep_b = retention.prune(eng, cut_b)
        drop_s = time.perf_counter() - t0
        eng.dispose()
        return {"delete_events": rep_a.events, "delete_s": delete_s, "drop_events": rep_b.events,
                "drop_partitions": rep_b.partitions, "drop_prune_s": drop_s, "drop_txn_s": rep_b.partition_drop_s, "drop_lock_s": rep_b.partition_lock_s}
    finally:
        st.drop()


def machine() -> dict:
    with psycopg.connect(conninfo("postgres"), autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return {"cores": os.cpu_count(), "cpu": cpu, "postgres": version, "load": os.getloadavg()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleets", default="10000,30000,100000", help="active runs per fleet, comma-separated")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--ingest-s", type=float, default=8.0)
    ap.add_argument("--burst", type=int, default=1, help="records per transaction in the ingest phase "
                    "(> 1: the SDK's burst, watchdog.store.bursts, as its threads' records meeting at the store)")
    ap.add_argument("--burst-per-run", type=int, default=1, help="consecutive records of each run in a burst "
                    "(1: each record of a burst another run's; N: runs of N threads each)")
    ap.add_argument("--rate", type=float, default=1000.0, help="events/s the writers offer during the ticks")
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--tick-s", type=float, default=1.0)
    ap.add_argument("--breaches", type=int, default=10)
    ap.add_argument("--judges", type=int, default=1, help="judges sharing the runs by shard "
                    "(watchdog.daemon.leases.shards), ticked one after the other each period")
    ap.add_argument("--hosts-have-daemons", action="store_true", help="with --judges > 1: the runs spread "
                    "over the judges' own hosts (each host's daemon a judge, no host adopted) instead of one "
                    "host no daemon holds (which the leader adopts, carrying out every run)")
    ap.add_argument("--drop-events", type=int, default=1_000_000, help="events in the day partition dropped")
    ap.add_argument("--no-retention", action="store_true")
    ap.add_argument("--profile", type=Path, help="profile the leader's changed ticks (cProfile stats to this file)")
    ap.add_argument("--profile-follower", action="store_true", help="with --profile: profile one follower's "
                    "changed ticks instead (the first judge that does not lead)")
    ap.add_argument("--revision", default="head", help="migrate the fleets' stores to this revision "
                    "(0014: events unpartitioned, to compare in the same run)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.breaches = min(args.breaches, max(0, args.ticks - 5))
    if args.hosts_have_daemons and args.judges < 2:
        ap.error("--hosts-have-daemons needs --judges > 1 (one judge is this machine's daemon)")
    global AW_BURST
    AW_BURST = args.revision == "head" or args.revision >= "0017"  # (forked writers inherit it)
    out: dict = {"machine": machine(), "fleets": []}
    print(f"machine: {out['machine']}", flush=True)
    for n in [int(x) for x in args.fleets.split(",") if x]:
        st = Store(str(n), args.revision)
        try:
            t0 = time.perf_counter()
            ids, runs, evs = fleet_rows(n, st.login, dt.datetime.now(dt.timezone.utc), args.breaches,
                                        judge_hosts(args.judges) if args.hosts_have_daemons else None)
            st.load(runs, evs)
            row = {"active": n, "load_s": time.perf_counter() - t0, "hosts_have_daemons": args.hosts_have_daemons}
            row.update(ingest(st, ids[args.breaches:], args))
            row.update(ticks(st, ids, args))
            out["fleets"].append(row)
            print(json.dumps(row), flush=True)
        finally:
            st.drop()
    if not args.no_retention:
        out["retention"] = retention_bench(args)
        print(json.dumps(out["retention"]), flush=True)
    print(table(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


def _ms(v) -> str:
    return "-" if v is None or v != v else f"{v:.0f}"


def table(out: dict) -> str:
    lines = ["| active runs | judges | SDK events/s stored | COPY events/s | SDK/COPY | offered events/s | cold tick ms "
             "| changed tick p50 / p99 ms | leader p50 ms | others p50 / p99 ms | breach -> stopping p50 / max ms (ticks) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in out["fleets"]:
        lines.append(f"| {r['active']:,} | {r.get('judges', 1)} | {r['sdk_eps']:,.0f} | {r['copy_eps']:,.0f} | {r['sdk_eps'] / r['copy_eps']:.2f} "
                     f"| {r['offered_eps']:,.0f} | {r['cold_ms']:,.0f} | {r['tick_p50_ms']:.0f} / {r['tick_p99_ms']:.0f} "
                     f"| {_ms(r.get('leader_p50_ms'))} | {_ms(r.get('others_p50_ms'))} / {_ms(r.get('others_p99_ms'))} "
                     f"| {r['breach_p50_ms']:.0f} / {r['breach_max_ms']:.0f} ({r['breaches_stopped']}/{r['breaches']} "
                     f"stopped, <= {r['breach_max_ticks']} tick) |")
    ret = out.get("retention")
    if ret:
        lines += ["", "| retention of one day | events | time |", "|---|---:|---:|",
                  f"| DELETE by run (the path it replaces) | {ret['delete_events']:,} | {ret['delete_s']:.2f} s |",
                  f"| drop the day's partition: whole prune | {ret['drop_events']:,} | {ret['drop_prune_s']:.2f} s |",
                  f"| drop the day's partition: its transaction | | {ret['drop_txn_s'] * 1000:.0f} ms |",
                  f"| drop the day's partition: writers locked out (DETACH to commit) | | "
                  f"{ret['drop_lock_s'] * 1000:.0f} ms |"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
