"""`agent-watchdog demo`, end to end: the console script, a real daemon, six real agent processes.

The demo's own verdict (exit 0) is checked, and then, independently, what it
left in the kept store: who completed, who was killed, why, and by which rung
of the ladder. Nothing is mocked; the timings have seconds of margin for a
loaded 2-core machine (the demo takes ~15 s; the timeout is 120 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select

from watchdog.demo.model import ScriptedModel
from watchdog.demo.tools import Catalogue, write_files
from watchdog.store.engine import make_engine
from watchdog.store.schema import daemons, interventions, runs, utcnow

TIMEOUT_S = 120
DAEMON_ACTIONS = {"stop_requested", "sigterm", "sigkill"}
AGENTS = ("plan", "recover", "runaway", "broken-tool", "hung", "stubborn")
# Stated here rather than imported from the demo, so the test does not merely mirror the code.
KILLED = {
    "runaway": ({"max_cost", "max_steps"}, "stop_requested"),  # guards=False: the daemon's budget check
    "broken-tool": ({"loop_detected"}, None),  # the in-process guard, before the daemon had to act
    "hung": ({"heartbeat_timeout"}, "sigterm"),
    "stubborn": ({"max_tool_calls", "max_steps"}, "sigkill"),  # ignores the stop and SIGTERM
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    keep = tmp_path_factory.mktemp("demo") / "kept"
    exe = Path(sys.executable).with_name("agent-watchdog")
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG")}
    proc = subprocess.run([str(exe), "demo", "--keep", str(keep)], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=env)
    engine = make_engine(f"sqlite:///{keep / 'runs.db'}")
    with engine.connect() as conn:
        rows = {r.agent: r for r in conn.execute(select(runs))}
        acts = conn.execute(select(interventions.c.run_id, interventions.c.action, interventions.c.tool,
                                   interventions.c.outcome)).all()
        # Released leases stay as rows naming their last holder, expired at the release.
        leases = conn.execute(select(daemons).where(daemons.c.expires_at > utcnow())).all()
    engine.dispose()
    return proc, rows, acts, leases


@pytest.mark.slow
def test_demo_exits_0_and_names_every_agent(demo):
    proc, rows, _, _ = demo
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for agent in AGENTS:
        assert agent in proc.stdout
    assert "OK: every agent ended as expected" in proc.stdout
    assert f"postmortem {rows['stubborn'].id[:8]}" in proc.stdout  # --keep prints the commands


@pytest.mark.slow
def test_every_line_the_demo_prints_fits_100_columns(demo):
    """Issue 19: nine lines were wider (up to 189); only the kept folder's own path may push one over."""
    proc, _, _, _ = demo
    wide = [line for line in proc.stdout.splitlines() if len(line) > 100 and "/kept" not in line]
    assert wide == []


@pytest.mark.slow
def test_the_closing_table_fits_100_columns_and_names_every_agent(demo):
    proc, _, _, _ = demo
    out = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("AGENT "))
    end = next(i for i, line in enumerate(out) if line.startswith("OK: every agent"))
    table = out[start:end + 2]
    assert max(len(line) for line in table) <= 100, "\n".join(line for line in table if len(line) > 100)
    assert {line.split()[0] for line in out[start + 2:start + 2 + len(AGENTS)]} == set(AGENTS)


@pytest.mark.slow
def test_healthy_runs_complete_and_runaways_are_killed_by_the_right_defense(demo):
    _, rows, acts, _ = demo
    assert set(rows) == set(AGENTS)
    for agent in ("plan", "recover"):
        assert (rows[agent].status, rows[agent].stop_reason) == ("completed", None), agent
        assert not [a for a in acts if a.run_id == rows[agent].id], f"{agent} was touched"
    for agent, (reasons, strongest) in KILLED.items():
        row = rows[agent]
        assert row.status == "killed", agent
        assert row.stop_reason in reasons, (agent, row.stop_reason, row.stop_detail)
        actions = {a.action for a in acts if a.run_id == row.id}
        if strongest is None:
            # The daemon only records (acknowledges) the guard's stop: it never decided or signalled it.
            assert actions & DAEMON_ACTIONS == {"stop_requested"} and "in-process guard" in row.stop_detail, actions
            (ack,) = [a for a in acts if a.run_id == row.id and a.action == "stop_requested"]
            assert "not by this daemon" in ack.outcome
        else:
            assert strongest in actions, (agent, actions)
    assert {a.action for a in acts if a.run_id == rows["runaway"].id}.isdisjoint({"sigterm", "sigkill"})  # it obeyed
    assert "sigkill" not in {a.action for a in acts if a.run_id == rows["hung"].id}
    assert ("circuit_open", "verify_iban") in {(a.action, a.tool) for a in acts}
    # Within budget where it matters: the runaway's overshoot is a few steps, not a bill.
    assert rows["runaway"].cost_eur < 0.2 and rows["runaway"].steps <= 16


@pytest.mark.slow
def test_demo_leaves_no_process_behind(demo):
    _, rows, _, leases = demo
    assert leases == [], "the daemon did not exit cleanly (its lease is still live)"
    for row in rows.values():
        try:
            alive = abs(psutil.Process(row.pid).create_time() - row.pid_create_time) < 1e-3
        except psutil.NoSuchProcess:
            alive = False
        assert not alive, f"{row.agent} (pid {row.pid}) is still running"


def test_scripted_model_is_a_function_of_the_transcript(tmp_path):
    write_files(tmp_path)
    tools = Catalogue(tmp_path).schema()
    start = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    model = ScriptedModel("recover")
    first = model.complete(start, tools)
    assert [(c.name, c.args) for c in first.tool_calls] == [("read_file", {"path": "timeout.log"})]
    assert ScriptedModel("recover").complete(start, tools) == first  # no state between calls
    turn1 = start + [first.message()]
    hint = "Error: FileNotFoundError: no such file: timeout.log. Call list_files to see what exists."
    told = turn1 + [{"role": "tool", "content": hint}]
    untold = turn1 + [{"role": "tool", "content": "Error: something went wrong"}]
    assert [c.name for c in model.complete(told, tools).tool_calls] == ["list_files"]
    assert model.complete(untold, tools).content == "I could not read the file, so I do not know."
    assert model.complete(told, tools).tokens_in > first.tokens_in  # every turn re-sends the transcript


@pytest.mark.slow
def test_demo_without_keep_deletes_its_store_and_points_at_keep(tmp_path):
    # TMPDIR: the demo's temporary folder is made here, so the test can see it is gone.
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG")}
    env["TMPDIR"] = str(tmp_path)
    exe = Path(sys.executable).with_name("agent-watchdog")
    proc = subprocess.run([str(exe), "demo"], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert list(tmp_path.iterdir()) == [], "the temporary store was left behind"
    *_, deleted, closing = proc.stdout.rstrip().splitlines()
    assert "deleted now" in deleted and "agent-watchdog demo --keep DIR" in closing
    assert "agent-watchdog --db" not in proc.stdout  # no command on a store that no longer exists
