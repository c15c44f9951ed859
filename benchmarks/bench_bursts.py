#!/usr/bin/env python
"""Batched SDK ingest against COPY, in the same run, alternating rounds (issue 35: >= 0.8x COPY at 16 writers).

Two stores on one PostgreSQL, each a fresh database with the shipped roles script, one agent
login and a fleet of --runs active runs (bench_scale's fixture):

  before  migrated to revision 0015 (row triggers: seq-once per row, the change feed per row at
          COMMIT), the burst as 0015's multi-row VALUES in a data-modifying WITH;
  0017    migrated to revision 0017 (those two as statement triggers), the burst as the SDK
          writes it now (watchdog.store.bursts: one array per column, one statement shape);
  0019    migrated to revision 0019 (0018: the change feed's index out of the runs row, whose
          update by a record is then HOT), the same burst;
  after   migrated to head (revision 0020: that index also holds a copy of the feed's light
          columns), the same burst.

Each round, for each store in turn (the order alternates from round to round, so drift of a
shared machine weighs on both alike):

  sdk     --writers processes, each its own slice of the runs, logged in as the agent login, write
          --burst records a statement (--per-run consecutive records of each run: 1 is the worst
          case, every record of a burst another run's) flat out for --seconds, reading the runs'
          statuses back as the SDK does: events/s found in the store afterwards, and the share
          of the run rows' updates that were HOT (pg_stat_user_tables);
  copy    as many events in one COPY by the tables' owner (a login under row-level security may
          not COPY), every trigger on, into 1,000 ended runs of their own: events/s;
  single  one writer, one record a statement (AgentSQL.record: the SDK's record alone, which sees a
          stop committed before it): the p50 / p99 of its round trip, --single records.

Prints a markdown table, one row per store and round, with the load average at its start (the
machine's 2 cores are shared with other work), then the medians. Not a test: asserts nothing.
Server: AW_BENCH_PG (default postgresql+psycopg://postgres@127.0.0.1:5432, a superuser).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scale as bs  # noqa: E402  (the fleet fixture, the stores, the COPY baseline's rows)

VARIANTS = {"before": ("0015", False), "0017": ("0017", True), "0019": ("0019", True), "after": ("head", True)}
COPY_SINKS = 1000
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def backend_cpu_s(conn) -> float:
    """CPU seconds (user + system) the server process of this connection has used so far (the
    server is on this host: /proc), so that a loaded machine's waits do not count as cost."""
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def _records(ids, seq, k, burst, per_run):
    records = []
    for _ in range(burst):
        rid = ids[(k // per_run) % len(ids)]
        k += 1
        seq[rid] += 1
        event = (rid, seq[rid], None, "tool", "search", f"a{k:015x}", None, True, None, None, 0.2,
                 None, None, None, None, None, None, None, None, None)
        records.append((event, (0, 1, 0, 0, 0, 0.0, 0, 0, 0, seq[rid], None, None, rid)))
    return records, k


WARMUP_BURSTS = 20  # a writer's first statements, untimed: its server process's caches, plpgsql's compiles


def writer(db, login, ids, seq0, seconds, burst, per_run, arrays, out, gate) -> None:
    from watchdog.store.agent_writes import AgentSQL
    from watchdog.store.bursts import burst_statements
    from watchdog.store.dialects import for_name

    sql = AgentSQL(for_name("postgresql"))
    seq = {rid: seq0 for rid in ids}
    n, k = 0, 0
    with psycopg.connect(bs.conninfo(db, login), autocommit=True, prepare_threshold=None) as conn:
        cur = conn.cursor()

        def one() -> None:
            nonlocal k
            records, k = _records(ids, seq, k, burst, per_run)
            for statement, params in burst_statements(sql, records, arrays=arrays):
                cur.execute(statement, params)
                cur.fetchall()  # the runs' statuses, as the SDK reads them back

        for _ in range(WARMUP_BURSTS):
            one()
        gate.wait()  # every writer warm: they start together
        server0, client0 = backend_cpu_s(conn), time.process_time()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            one()
            n += burst
        out.put((n, backend_cpu_s(conn) - server0, time.process_time() - client0))


_RUNS_UPDATES = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'runs'::regclass"
STATS_FLUSH_S = 0.5  # the writers' server processes report their counts as they exit


def sdk_round(st, ids, seq0, args, arrays) -> tuple[int, float, float, float]:
    """Events stored in the timed part; the server's and the writers' CPU seconds for them; the
    share of the run rows' updates (warm-up included) that were HOT."""
    with psycopg.connect(bs.conninfo(st.db), autocommit=True) as conn:
        top = conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
        upd0, hot0 = conn.execute(_RUNS_UPDATES).fetchone()
    q: mp.Queue = mp.Queue()
    gate = mp.Barrier(args.writers)
    share = [ids[i::args.writers] for i in range(args.writers)]
    procs = [mp.Process(target=writer, args=(st.db, st.login, share[i], seq0, args.seconds, args.burst,
                                             args.per_run, arrays, q, gate)) for i in range(args.writers)]
    for p in procs:
        p.start()
    done = [q.get() for _ in procs]
    for p in procs:
        p.join()
    time.sleep(STATS_FLUSH_S)
    with psycopg.connect(bs.conninfo(st.db), autocommit=True) as conn:
        stored = conn.execute("SELECT count(*) FROM events WHERE id > %s", (top,)).fetchone()[0]
        upd, hot = conn.execute(_RUNS_UPDATES).fetchone()
    timed = sum(d[0] for d in done)
    if stored != timed + args.writers * WARMUP_BURSTS * args.burst:
        raise SystemExit(f"stored {stored} events, the writers wrote {timed} + their warm-up")
    return timed, sum(d[1] for d in done), sum(d[2] for d in done), (hot - hot0) / max(upd - upd0, 1)


def copy_round(st, n: int) -> tuple[float, float, float]:
    """n events in one COPY by the owner, triggers on, into ended runs of their own: events/s,
    the server's and this process's CPU seconds (the rows' tuples are made before the clock starts)."""
    with psycopg.connect(bs.conninfo(st.db), autocommit=True) as conn:
        sinks = [uuid.uuid4().hex for _ in range(COPY_SINKS)]
        t = dt.datetime.now(dt.timezone.utc)
        with conn.cursor() as cur, cur.copy(f"COPY runs ({', '.join(bs.RUN_COLS)}) FROM STDIN") as cp:
            for rid in sinks:
                cp.write_row((rid, bs.AGENT, "completed", "process", bs.HOST, 1, 1.0, 0, 0, 0, t, t, t, st.login,
                              None, "sdk", 0, 0, 0.0))
        rows = [(sinks[i % COPY_SINKS], 1 + i // COPY_SINKS, "tool", "search", f"c{i:015x}", True) for i in range(n)]
        server0, client0 = backend_cpu_s(conn), time.process_time()
        t0 = time.perf_counter()
        with conn.cursor() as cur, cur.copy("COPY events (run_id, seq, kind, tool, args_hash, ok, at) FROM STDIN") as cp:
            for r in rows:
                cp.write_row((*r, t))
        wall = time.perf_counter() - t0
        return n / wall, backend_cpu_s(conn) - server0, time.process_time() - client0


def single_round(st, rid: str, seq0: int, n: int) -> tuple[float, float]:
    from watchdog.store.agent_writes import AgentSQL
    from watchdog.store.dialects import for_name

    sql = AgentSQL(for_name("postgresql"))
    lat = []
    with psycopg.connect(bs.conninfo(st.db, st.login), autocommit=True, prepare_threshold=None) as conn:
        cur = conn.cursor()
        for i in range(n):
            event = (rid, seq0 + i, None, "tool", "search", uuid.uuid4().hex[:16], None, True, None, None, 0.2,
                     None, None, None, None, None, None, None, None, None)
            update = (0, 1, 0, 0, 0, 0.0, 0, 0, 0, seq0 + i, None, None, rid)
            t0 = time.perf_counter()
            for statement, params in sql.record(event, update):
                cur.execute(statement, params)
                cur.fetchall()
            lat.append(time.perf_counter() - t0)
    lat = sorted(lat[WARMUP_BURSTS:])  # the connection's first records warm its caches
    return lat[len(lat) // 2] * 1e6, lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10_000, help="active runs in each store's fleet")
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--burst", type=int, default=16, help="records a statement")
    ap.add_argument("--per-run", type=int, default=1, help="consecutive records of one run in a burst")
    ap.add_argument("--seconds", type=float, default=6.0, help="each SDK round's length")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--single", type=int, default=500, help="records of the single-record round")
    ap.add_argument("--variants", default="before,after")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    print(f"machine: {bs.machine()}", flush=True)
    stores, fleets = {}, {}
    try:
        for name in names:
            st = bs.Store(f"b{name}", VARIANTS[name][0])
            stores[name] = st
            ids, runs, evs = bs.fleet_rows(args.runs, st.login, dt.datetime.now(dt.timezone.utc), 0)
            st.load(runs, evs)
            fleets[name] = ids
        rows = []
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            for name in order:
                st, ids, arrays = stores[name], fleets[name], VARIANTS[name][1]
                load = os.getloadavg()[0]
                seq0 = 1_000 + rnd * 10_000_000
                stored, sdk_server, sdk_client, hot = sdk_round(st, ids[1:], seq0, args, arrays)
                sdk_eps = stored / args.seconds
                copy_eps, copy_server, copy_client = copy_round(st, stored)
                p50, p99 = single_round(st, ids[0], seq0, args.single)
                row = {"variant": name, "round": rnd + 1, "load": load, "sdk_eps": sdk_eps, "copy_eps": copy_eps,
                       "ratio": sdk_eps / copy_eps, "runs_hot": hot, "single_p50_us": p50, "single_p99_us": p99,
                       "sdk_server_us": 1e6 * sdk_server / stored, "sdk_client_us": 1e6 * sdk_client / stored,
                       "copy_server_us": 1e6 * copy_server / stored, "copy_client_us": 1e6 * copy_client / stored}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for st in stores.values():
            st.drop()
    print(table(rows, args))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def _cpu_ratio(r) -> float:
    """COPY's CPU an event over the SDK's: what the throughput ratio would be on idle cores."""
    return (r["copy_server_us"] + r["copy_client_us"]) / (r["sdk_server_us"] + r["sdk_client_us"])


def table(rows, args) -> str:
    lines = [f"writers {args.writers}, burst {args.burst} ({args.per_run} a run), {args.runs:,} active runs",
             "", "| store | round | load avg | SDK events/s | COPY events/s | SDK/COPY | CPU us an event: SDK server + "
             "writers / COPY server + client | CPU SDK/COPY | run updates HOT | single record p50 / p99 us |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['round']} | {r['load']:.1f} | {r['sdk_eps']:,.0f} | {r['copy_eps']:,.0f} "
                     f"| {r['ratio']:.2f} | {r['sdk_server_us']:.0f} + {r['sdk_client_us']:.0f} / "
                     f"{r['copy_server_us']:.0f} + {r['copy_client_us']:.0f} | {_cpu_ratio(r):.2f} | {100 * r['runs_hot']:.0f} % "
                     f"| {r['single_p50_us']:,.0f} / {r['single_p99_us']:,.0f} |")
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        med = {k: statistics.median(r[k] for r in mine) for k in ("sdk_eps", "copy_eps", "ratio", "single_p50_us")}
        cpu = statistics.median(_cpu_ratio(r) for r in mine)
        lines.append(f"| **{name}: median** | | | {med['sdk_eps']:,.0f} | {med['copy_eps']:,.0f} | "
                     f"**{med['ratio']:.2f}** | | **{cpu:.2f}** | | {med['single_p50_us']:,.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
