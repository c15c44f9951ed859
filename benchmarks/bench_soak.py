#!/usr/bin/env python
"""Soak: 10,000 runs over three daemons on one PostgreSQL; daemon RSS and tick time must stay
flat from the first thousand runs to the last.

Three real `agent-watchdog run` daemons, each in a UTS namespace of its own (hosts s1, s2,
s3; `unshare --uts`, so run as root), tick every --tick-s on a fresh database
`aw_bench_soak_<pid>` (dropped at the end). On each host --workers agent processes (in
that host's namespace) open runs through the SDK, --open at a time each, and play them:
steps and tool calls, then complete. One run in 10 goes over its step budget and is
stopped by its host's daemon (the worker sees RunKilled and goes on); one in 50 calls a
failing tool, so the leader's circuits have work.

Every thousand runs ended, the script samples each daemon: its RSS (/proc/PID/status)
and its mean tick time since the previous sample (from its Prometheus endpoint,
`agent_watchdog_tick_seconds` sum / count), plus the active runs and the leader.
The table ends with last / first thousand ratios, the flatness this is about.

Run (root):  python benchmarks/bench_soak.py [--runs 10000] [--workers 2] [--open 20] [--tick-s 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PG_SERVER = os.environ.get("AW_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
HOSTS = ("s1", "s2", "s3")
AGENT_WATCHDOG = os.path.join(os.path.dirname(sys.executable), "agent-watchdog")


def as_host(host, argv):
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *argv]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the agent worker (runs inside a host's namespace) -------------------------------------------


def worker(url: str, n_runs: int, n_open: int, seed: int, pause_s: float = 0.01) -> int:
    """Plays n_runs runs, n_open at a time, one record every pause_s (an agent's pace, not a flood)."""
    import warnings

    warnings.simplefilter("ignore", RuntimeWarning)
    from watchdog import RunKilled, Watchdog

    rnd = random.Random(seed)
    wd = Watchdog(url)
    started = 0
    live: list[dict] = []

    def open_one():
        nonlocal started
        started += 1
        run = wd.run("soak", kill_mode="cooperative", guards=False, max_steps=3)
        run.__enter__()
        over = started % 10 == 0  # 4 steps against a budget of 3: its daemon stops it
        live.append({"run": run, "steps": 4 if over else 3, "tools": rnd.randint(1, 4), "over": over,
                     "fails": started % 50 == 0, "next_at": 0.0})

    while live or started < n_runs:
        while len(live) < n_open and started < n_runs:
            open_one()
        item = live[rnd.randrange(len(live))]
        run = item["run"]
        try:
            if item["tools"]:
                item["tools"] -= 1
                run.record_tool("flaky" if item["fails"] else rnd.choice(("search", "fetch", "read")),
                                {"i": rnd.random()}, ok=not item["fails"], error="timeout" if item["fails"] else None)
            elif item["steps"]:
                item["steps"] -= 1
                run.step(model="gpt-x", tokens_in=100, tokens_out=20)
            elif item["over"]:  # waits for its stop, heartbeating now and then
                if time.monotonic() >= item["next_at"]:
                    item["next_at"] = time.monotonic() + 0.25
                    run.heartbeat("over budget, waiting for the stop")
            else:
                live.remove(item)
                run.__exit__(None, None, None)
        except RunKilled as stop:
            live.remove(item)
            run.__exit__(type(stop), stop, None)
        time.sleep(pause_s)
    wd.close()
    return 0


# --- the parent ---------------------------------------------------------------------------------


def scrape(port: int) -> tuple[float, float]:
    """(sum, count) of agent_watchdog_tick_seconds."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("agent_watchdog_tick_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("agent_watchdog_tick_seconds_count"):
            count = float(line.split()[-1])
    return total, count


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=2, help="agent processes per host")
    ap.add_argument("--open", type=int, default=20, help="runs each worker keeps open at once")
    ap.add_argument("--tick-s", type=float, default=1.0)
    ap.add_argument("--every", type=int, default=1000, help="sample every this many ended runs")
    ap.add_argument("--worker", nargs=4, metavar=("URL", "N", "OPEN", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        url, n, n_open, seed = args.worker
        return worker(url, int(n), int(n_open), int(seed))
    if os.geteuid() != 0:
        print("bench_soak needs root: each daemon is a host of its own (unshare --uts)", file=sys.stderr)
        return 2

    from sqlalchemy import create_engine, text

    from watchdog.store import access
    from watchdog.store.engine import make_engine

    dbname = f"aw_bench_soak_{os.getpid()}"
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
        c.execute(text(f'CREATE DATABASE "{dbname}"'))
    url = f"{PG_SERVER}/{dbname}"
    engine = make_engine(url)
    access.upgrade(engine)
    tmp = tempfile.mkdtemp(prefix="aw_soak_")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    daemons, workers = {}, []
    print(f"# agent-watchdog soak: {args.runs:,} runs over {len(HOSTS)} daemons (tick {args.tick_s:g} s), "
          f"{args.workers} workers x {args.open} open runs per host; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    try:
        for h in HOSTS:
            port = free_port()
            cfg = os.path.join(tmp, f"{h}.toml")
            with open(cfg, "w") as f:
                f.write(f'[store]\nurl = "{url}"\n\n[daemon]\ntick_s = {args.tick_s}\ncancel_grace_s = 5\n\n'
                        f'[circuit]\nerrors = 5\nwindow_s = 60\nopen_s = 30\n\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
            log = open(os.path.join(tmp, f"{h}.log"), "w")
            proc = subprocess.Popen(as_host(h, [AGENT_WATCHDOG, "run", "--config", cfg]), env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            daemons[h] = (proc, port)
        for h, (proc, port) in daemons.items():
            for _ in range(300):
                try:
                    scrape(port)
                    break
                except OSError:
                    time.sleep(0.1)
        per_worker = -(-args.runs // (len(HOSTS) * args.workers))
        seed = 0
        for h in HOSTS:
            for _ in range(args.workers):
                seed += 1
                workers.append(subprocess.Popen(
                    as_host(h, [sys.executable, os.path.abspath(__file__), "--worker", url, str(per_worker),
                                str(args.open), str(seed)]), env=env, stdin=subprocess.DEVNULL))
        total = per_worker * len(HOSTS) * args.workers
        samples = []
        last = {h: scrape(port) for h, (_, port) in daemons.items()}
        last_cpu = {h: cpu_s(proc.pid) for h, (proc, _) in daemons.items()}
        t0 = time.monotonic()
        mark = args.every
        while mark <= total:
            with engine.connect() as c:
                ended = c.execute(text("SELECT count(*) FROM runs WHERE ended_at IS NOT NULL")).scalar()
            if ended < mark:
                time.sleep(0.2)
                if time.monotonic() - t0 > 3600:
                    raise SystemExit("soak did not finish within an hour")
                continue
            row = {"ended": ended, "t": time.monotonic() - t0}
            with engine.connect() as c:
                row["active"] = c.execute(text("SELECT count(*) FROM runs WHERE status IN ('running', 'stopping')")).scalar()
                row["leader"] = c.execute(text("SELECT host FROM daemons WHERE leader_since IS NOT NULL")).scalar()
            for h, (proc, port) in daemons.items():
                s, n = scrape(port)
                ps, pn = last[h]
                row[f"{h}_rss"] = rss_mb(proc.pid)
                row[f"{h}_tick_ms"] = (s - ps) / (n - pn) * 1000 if n > pn else float("nan")
                row[f"{h}_ticks"] = n - pn
                c_now = cpu_s(proc.pid)
                # The daemon's own CPU per tick: unlike wall time, not inflated by the other
                # processes of a busy machine (it includes alert delivery and the metrics server).
                row[f"{h}_cpu_ms"] = (c_now - last_cpu[h]) / (n - pn) * 1000 if n > pn else float("nan")
                last_cpu[h] = c_now
                last[h] = (s, n)
            samples.append(row)
            print(f"  {ended:>6,} ended at {row['t']:6.0f} s, {row['active']:4} active, leader {row['leader']}: "
                  + ", ".join(f"{h} {row[f'{h}_rss']:.1f} MB {row[f'{h}_tick_ms']:.1f} ms/tick "
                              f"({row[f'{h}_cpu_ms']:.1f} CPU)" for h in HOSTS),
                  flush=True)
            mark += args.every
        for w in workers:
            w.wait(timeout=600)
        with engine.connect() as c:
            by_status = dict(c.execute(text("SELECT status, count(*) FROM runs GROUP BY status")).all())
            stops = c.execute(text("SELECT count(*) FROM interventions WHERE action = 'stop_requested'")).scalar()
            foreign = c.execute(text(
                "SELECT count(*) FROM interventions i JOIN runs r ON r.id = i.run_id "
                "WHERE i.action = 'stop_requested' AND i.actor NOT LIKE 'daemon@' || r.host || ':%'")).scalar()
            circuits = c.execute(text("SELECT count(*) FROM interventions WHERE action = 'circuit_open'")).scalar()
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        for proc, _ in daemons.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in daemons.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        engine.dispose()
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
        admin.dispose()
    print()
    head = (["runs ended", "s", "active"] + [f"{h} RSS MB" for h in HOSTS] + [f"{h} tick ms" for h in HOSTS]
            + [f"{h} CPU ms/tick" for h in HOSTS] + ["leader"])
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---:" for _ in head) + "|")
    for r in samples:
        cells = [f"{r['ended']:,}", f"{r['t']:.0f}", str(r["active"])]
        cells += [f"{r[f'{h}_rss']:.1f}" for h in HOSTS] + [f"{r[f'{h}_tick_ms']:.1f}" for h in HOSTS]
        cells += [f"{r[f'{h}_cpu_ms']:.1f}" for h in HOSTS]
        print("| " + " | ".join(cells + [str(r["leader"])]) + " |")
    first, lastrow = samples[0], samples[-1]
    print("\nlast / first thousand: " + "; ".join(
        f"{h} RSS {lastrow[f'{h}_rss'] / first[f'{h}_rss']:.2f}x, tick {lastrow[f'{h}_tick_ms'] / first[f'{h}_tick_ms']:.2f}x, "
        f"CPU/tick {lastrow[f'{h}_cpu_ms'] / first[f'{h}_cpu_ms']:.2f}x" for h in HOSTS))
    print(f"runs by status: {json.dumps(by_status)}; stops requested {stops} (by another host's daemon: {foreign}); "
          f"circuit openings {circuits}; load average {os.getloadavg()[0]:.1f} at the end")
    return 0 if foreign == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
