#!/usr/bin/env python
"""Instructions per warm tick, exact and noise-free: bench_tick.py's warm ticks under callgrind.

This VM has no hardware counters (`perf stat -e instructions:u` is not supported) and a shared
2-core machine moves wall and CPU time by tens of percent; callgrind counts the instructions
each tick runs. Each warm tick of both of bench_tick's tickers (the one with the money work and
the base one without it) runs inside `functools.reduce`, which nothing else on the tick calls:
callgrind collects only there and dumps one file per tick. The ticks are logged in order, so
`report` can say which dump is whose. Works on any checkout (module paths moved between versions).

Run (one checkout; ~8 minutes at 2,000 runs on this VM, about 50x the bench's native time):

    mkdir -p /tmp/cg && valgrind --tool=callgrind --collect-atstart=no --toggle-collect=functools_reduce \\
        --dump-after=functools_reduce --dump-instr=no --callgrind-out-file=/tmp/cg/cg.out \\
        python benchmarks/callgrind_ticks.py run CHECKOUT /tmp/cg/log.txt [--runs 2000 --events 20000 --warm 6]
    python benchmarks/callgrind_ticks.py report /tmp/cg

`report` prints each ticker's instructions per warm tick (millions) and their median; the
money work is the money ticker's less the base ticker's. Per C function:
`callgrind_annotate --inclusive=no /tmp/cg/cg.out.N` (Python frames all show as the
interpreter's `_PyEval_EvalFrameDefault`: compare totals, and SQLite's `sqlite3VdbeExec`).
"""

from __future__ import annotations

import argparse
import functools
import glob
import importlib
import os
import statistics
import sys


def run(checkout: str, log: str, runs: int, events: int, warm: int, backend: str) -> None:
    sys.path[:0] = [checkout, os.path.join(checkout, "benchmarks")]
    os.chdir(checkout)
    new = os.path.exists(os.path.join(checkout, "watchdog", "daemon", "tick"))
    ticker_cls = importlib.import_module("watchdog.daemon.tick.ticker" if new else "watchdog.daemon.ticker").Ticker
    seen = {"money": 0, "base": 0}
    orig = ticker_cls.tick
    out = open(log, "w")

    def tick(self, now, *a, **kw):
        who = "money" if self.money is not None else "base"
        seen[who] += 1
        if not 1 < seen[who] <= 1 + warm:  # the cold tick and those after the warm ones: not counted
            return orig(self, now, *a, **kw)
        box = []
        functools.reduce(lambda _x, _y: box.append(orig(self, now, *a, **kw)), [0, 0])  # (called once)
        rep = box[0]
        out.write(f"{who} {seen[who]} full={rep.full} new_events={rep.new_events} looked={rep.looked}\n")
        out.flush()
        return rep

    ticker_cls.tick = tick
    import bench_tick

    try:
        bench_tick.main(["--runs", str(runs), "--events", str(events), "--backends", backend,
                         "--warm-ticks", str(warm), "--idle-ticks", "1", "--breach", "1", "--naive-ticks", "1"])
    except SystemExit:
        pass


def report(where: str) -> None:
    dumps = sorted((f for f in glob.glob(os.path.join(where, "cg.out*")) if f.rsplit(".", 1)[1].isdigit()),
                   key=lambda f: int(f.rsplit(".", 1)[1]))
    ticks = [line.split()[0] for line in open(os.path.join(where, "log.txt"))]
    per: dict[str, list[float]] = {}
    for who, dump in zip(ticks, dumps):
        with open(dump) as f:
            n = next(int(line.split()[1]) for line in f if line.startswith("summary:"))
        per.setdefault(who, []).append(n / 1e6)
    for who, vals in per.items():
        print(f"{who}: median {statistics.median(vals):.2f} M, mean {statistics.mean(vals):.2f} M per warm tick "
              f"({', '.join(f'{v:.2f}' for v in vals)})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="under valgrind: bench_tick.py of CHECKOUT, each warm tick in a reduce")
    r.add_argument("checkout")
    r.add_argument("log")
    r.add_argument("--runs", type=int, default=2000)
    r.add_argument("--events", type=int, default=20000)
    r.add_argument("--warm", type=int, default=6)
    r.add_argument("--backend", default="sqlite")
    s = sub.add_parser("report", help="instructions per warm tick from the dumps and log of a run")
    s.add_argument("where")
    a = p.parse_args()
    if a.cmd == "run":
        run(os.path.abspath(a.checkout), os.path.abspath(a.log), a.runs, a.events, a.warm, a.backend)
    else:
        report(a.where)


if __name__ == "__main__":
    main()
