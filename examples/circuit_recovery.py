"""A broken tool's circuit opens, other runs fail fast, and it closes when the tool recovers.

    python examples/circuit_recovery.py

Runs the real daemon (`agent-watchdog run`) and real agent processes on a
temporary SQLite store. The tool `verify_iban` fails while a flag file exists;
the script removes the flag half-way, as an operator fixing the upstream would.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

AGENT = r'''
import os, sys, time
from watchdog import Watchdog, ToolUnavailable, RunKilled
db, flag, name, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def verify_iban(iban):
    if os.path.exists(flag):
        raise RuntimeError("500 Internal Server Error")
    return "valid"

wd = Watchdog(db)
with wd.run(agent=name) as run:
    for i in range(calls):
        try:
            print(name, run.tool_call("verify_iban", {"iban": f"IT{i}"}, verify_iban), flush=True)
        except ToolUnavailable as exc:
            print(name, exc, flush=True)
        except RuntimeError as exc:
            print(name, "tool error:", exc, flush=True)
        time.sleep(0.3)
'''


def main() -> int:
    # Everything lives in one temporary folder, removed on the way out (even on Ctrl-C).
    with tempfile.TemporaryDirectory(prefix="aw-circuit-") as folder:
        return _run(Path(folder))


def _run(tmp: Path) -> int:
    db = f"sqlite:///{tmp / 'runs.db'}"
    flag = tmp / "upstream-down"
    flag.touch()
    (tmp / "agent.py").write_text(AGENT)
    (tmp / "wd.toml").write_text(
        "[daemon]\ntick_s = 0.5\n[defaults]\nmax_tool_calls = 100\n"
        "[circuit]\nerrors = 5\nwindow_s = 60\nopen_s = 4\n")
    cli = [sys.executable, "-m", "watchdog.cli", "--db", db, "--config", str(tmp / "wd.toml")]
    subprocess.run([*cli, "db", "upgrade"], check=True, stdout=subprocess.DEVNULL)
    daemon = subprocess.Popen([*cli, "run"], stderr=subprocess.PIPE, text=True)
    agents: list[subprocess.Popen] = []
    try:
        time.sleep(1.0)
        agents = [subprocess.Popen([sys.executable, str(tmp / "agent.py"), db, str(flag), f"agent-{n}", "12"],
                                   text=True) for n in range(3)]
        time.sleep(5.0)
        print("--- operator: the upstream is fixed ---", flush=True)
        flag.unlink()
        for a in agents:
            a.wait(timeout=60)
        time.sleep(6.0)  # the probe, then the daemon's next tick closes the circuit
        later = subprocess.run([sys.executable, str(tmp / "agent.py"), db, str(flag), "agent-late", "2"])
        daemon.terminate()
        _, err = daemon.communicate(timeout=30)
    finally:
        for proc in (*agents, daemon):  # nothing outlives the folder it runs from
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print(subprocess.run([*cli, "circuits"], capture_output=True, text=True).stdout)
    print("daemon log (circuit lines):")
    for line in err.splitlines():
        if "circuit" in line.lower() or "ALERT" in line:
            print("  ", line)
    subprocess.run([sys.executable, "-c", f"""
from sqlalchemy import create_engine, text
e = create_engine({db!r})
with e.connect() as c:
    for r in c.execute(text("select at, action, tool, detail, outcome from interventions where tool is not null order by id")):
        print("  ", *r)
"""])
    return later.returncode

if __name__ == "__main__":
    sys.exit(main())
