#!/usr/bin/env python
"""Two versions of the tick, measured in turns: `bench_tick.py` of a "before" checkout and of an
"after" checkout, run alternately (before, after, before, after...) on the same machine, so that
the machine's own swings (a shared 2-core VM's speed moves by tens of percent within minutes)
fall on both versions alike. Each version runs its own copy of bench_tick.py (module paths move
between versions) with its own interpreter (`<checkout>/.venv/bin/python` when it exists).

It prints, per backend, the median and the range over the rounds of the changed tick, the idle
tick and the base tick (without the money work), and the ratio after/before of the medians: the
figure issue 34 asks to be within 1.05x.

Run:  python benchmarks/bench_versions.py --before /path/to/old --after . --rounds 5 \\
          [-- --runs 10000 --events 100000 --backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# The wall times, and the changed tick's CPU time (the bench thread's and its PostgreSQL backend's,
# from schedstat): on a loaded machine the CPU time moves far less than the wall time.
FIGURES = (("warm_median_ms", "changed tick p50 ms"), ("warm_cpu_median_ms", "changed tick CPU p50 ms"),
           ("idle_median_ms", "idle tick p50 ms"), ("base_warm_median_ms", "base tick p50 ms"))
DEFAULT_BENCH_ARGS = ["--runs", "10000", "--events", "100000", "--backends", "sqlite,postgresql"]


def python_of(checkout: Path) -> str:
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def one_round(checkout: Path, bench_args: list[str], out: Path) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [python_of(checkout), str(checkout / "benchmarks" / "bench_tick.py"), *bench_args, "--json", str(out)]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, cwd=checkout)
    return json.loads(out.read_text())["rows"]


def summary(rounds: dict[str, list[list[dict]]]) -> list[str]:
    lines = ["| backend | figure | before: median (range) | after: median (range) | after/before |",
             "|---|---|---:|---:|---:|"]
    backends = sorted({r["backend"] for rows in rounds["before"] for r in rows})
    for be in backends:
        for key, label in FIGURES:
            med = {}
            cells = []
            for version in ("before", "after"):
                vals = [r[key] for rows in rounds[version] for r in rows if r["backend"] == be and r.get(key)]
                med[version] = statistics.median(vals)
                cells.append(f"{med[version]:.1f} ({min(vals):.1f}-{max(vals):.1f})")
            lines.append(f"| {be} | {label} | {cells[0]} | {cells[1]} | {med['after'] / med['before']:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, type=Path, help="checkout of the older version")
    p.add_argument("--after", required=True, type=Path, help="checkout of the newer version")
    p.add_argument("--rounds", type=int, default=5, help="rounds per version")
    p.add_argument("--json", default=None, help="also write every round's rows here")
    p.add_argument("bench_args", nargs="*", help="bench_tick.py's arguments (after --)")
    args = p.parse_args(argv)
    bench_args = args.bench_args or DEFAULT_BENCH_ARGS
    rounds: dict[str, list[list[dict]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for version in ("before", "after"):
                checkout = getattr(args, version).resolve()
                rows = one_round(checkout, bench_args, Path(tmp) / f"{version}{i}.json")
                rounds[version].append(rows)
                print(f"round {i + 1}/{args.rounds} {version}: "
                      + ", ".join(f"{r['backend']} {r['warm_median_ms']:.1f} ms" for r in rows),
                      file=sys.stderr, flush=True)
    lines = summary(rounds)
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
