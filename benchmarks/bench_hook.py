#!/usr/bin/env python
"""What `agent-watchdog hook claude-code` costs a coding CLI per tool call, interpreter start
included: the wall time of the whole command (a PreToolUse event on stdin, as Claude Code runs
it), measured from outside.

Three ways, alternating ABC so drift and load hit all alike:
- resident: the normal path, answered by the warm resident helper (started before measuring);
- in-process: AGENT_WATCHDOG_HOOK_RESIDENT=0, every call imports the store and connects;
- python -c pass: the interpreter's own start, the floor.

Each call is a distinct tool call of one session (so nothing is refused) on a fresh SQLite store
(or --db URL). Goal (issue 33): p50 <= 50 ms, p99 <= 150 ms.

Run:  python benchmarks/bench_hook.py [--calls 200] [--db URL]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AW = str(Path(sys.executable).with_name("agent-watchdog"))


def fresh_store(folder: str) -> str:
    from watchdog.store import access
    from watchdog.store.engine import make_engine

    url = f"sqlite:///{folder}/runs.db"
    engine = make_engine(url)
    access.upgrade(engine)
    engine.dispose()
    return url


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--db")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="awbh")
    url = args.db or fresh_store(folder)
    # A profile no call of the benchmark reaches.
    cfg = Path(folder) / "watchdog.toml"
    cfg.write_text(f"[defaults]\nmax_tool_calls = {args.calls * 4}\nmax_wall_s = 86400\n")
    base = {**os.environ, "XDG_RUNTIME_DIR": folder, "AGENT_WATCHDOG_CONFIG": str(cfg)}
    ways = {
        "resident": ([AW, "hook", "claude-code", "--db", url], base),
        "in-process": ([AW, "hook", "claude-code", "--db", url], {**base, "AGENT_WATCHDOG_HOOK_RESIDENT": "0"}),
        "python -c pass": ([sys.executable, "-c", "pass"], base),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    n = 0

    def one(way: str) -> None:
        nonlocal n
        n += 1
        argv, env = ways[way]
        event = json.dumps({"session_id": "bench", "hook_event_name": "PreToolUse", "tool_name": "Bash",
                            "tool_input": {"command": f"echo {n}"}, "tool_use_id": f"toolu_{n}"})
        t0 = time.perf_counter()
        done = subprocess.run(argv, input=event, capture_output=True, text=True, env=env, timeout=60)
        times[way].append((time.perf_counter() - t0) * 1000)
        if done.returncode or done.stdout:
            raise SystemExit(f"{way}: unexpected answer {done.returncode} {done.stdout!r} {done.stderr!r}")

    one("resident")  # starts the helper
    for _ in range(100):
        if list(Path(folder).rglob("*.sock.pid")):
            break
        time.sleep(0.05)
    for k in times:
        times[k].clear()
    order = list(ways)
    for i in range(args.calls):
        for way in order if i % 2 == 0 else reversed(order):
            one(way)
    print(f"{args.calls} calls each, ms per hook call (wall, interpreter start included):")
    for way, ts in times.items():
        print(f"  {way:15s} p50 {statistics.median(ts):7.1f}  p90 {pct(ts, 0.90):7.1f}  p99 {pct(ts, 0.99):7.1f}"
              f"  max {max(ts):7.1f}")
    for pid_file in Path(folder).rglob("*.sock.pid"):
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
    return 0


if __name__ == "__main__":
    sys.exit(main())
