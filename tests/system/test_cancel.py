"""Cancellation that reaches a running tool, tool deadlines, partial results, the JSONL trace.

A real agent process runs a tool that would work for 60 s polling `run.cancelled`; the
stop (by the CLI, carried out by the real tick) reaches it within a tick and a second.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from click.testing import CliRunner

from daemon_support import ME, SEALER, alerts_of, config, run_row
from watchdog import RunKilled, ToolTimeout
from watchdog.cli import main
from watchdog.core import lifecycle as lc
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.schema import utcnow

TICK_S = config().daemon.tick_s


def cli(db_url, *args):
    return CliRunner().invoke(main, ["--db", db_url, *args])


def _events(engine, run_id):
    from sqlalchemy import select

    from watchdog.store.schema import events

    with engine.connect() as conn:
        return conn.execute(select(events).where(events.c.run_id == run_id).order_by(events.c.seq)).all()


@pytest.mark.parametrize("child", [False, True], ids=["run", "child-run"])
def test_a_stop_reaches_a_tool_that_polls_run_cancelled_within_a_tick_and_a_second(engine, db_url, procs, child):
    agent = procs.start("long_tool", db_url, child=child)
    rid = agent.info["run_id"]
    time.sleep(1.5)  # the tool is well under way
    assert agent.alive()
    t0 = time.time()
    res = cli(db_url, "kill", rid[:8], "--reason", "operator wants it back")
    assert res.exit_code == 0, res.output
    Ticker(engine, config(), Killer(allowed_users=[ME]), sealer=SEALER).tick(utcnow())  # the daemon's next tick: nothing to add for a cooperative run
    assert agent.wait() == 0
    out = agent.result()
    assert out["cancelled"] is True and out["reason"] == lc.MANUAL
    assert out["at"] - t0 <= TICK_S + 1.0, f"the tool returned {out['at'] - t0:.2f} s after the stop"
    target = agent.info["child_id"] or rid
    (tool,) = [e for e in _events(engine, target) if e.kind == lc.EV_TOOL]
    assert (tool.tool, tool.ok) == ("scan_archive", True)  # the call is recorded, then the stop raised
    row = run_row(engine, target)
    assert row.status == lc.KILLED and row.partial.startswith("scanned ")
    shown = cli(db_url, "show", target[:8])
    assert "stopped at manual with a partial answer: scanned " in shown.output


def test_tool_call_timeout_s_records_the_timeout_as_the_tools_error(engine, wd):
    release = threading.Event()
    with wd.run("bot") as run:
        with pytest.raises(ToolTimeout, match="no answer within 0.3 s"):
            run.tool_call("slow", {"n": 1}, lambda n: release.wait(30), timeout_s=0.3)
        release.set()
        assert run.tool_call("fast", {"n": 2}, lambda n: n * 2, timeout_s=5) == 4
        with pytest.raises(ValueError, match="timeout_s"):
            run.tool_call("fast", {"n": 2}, lambda n: n, timeout_s=0)
        with pytest.raises(KeyError):  # the tool's own exception comes through the worker thread
            run.tool_call("broken", {}, lambda: {}["x"], timeout_s=5)
    slow, fast, broken = [e for e in _events(engine, run.id) if e.kind == lc.EV_TOOL]
    assert (slow.ok, slow.error_class) == (False, "ToolTimeout") and slow.duration_s >= 0.3
    assert (fast.ok, fast.error_class) == (True, None)
    assert (broken.ok, broken.error_class) == (False, "KeyError")


def test_a_stop_does_not_wait_for_a_tool_called_with_timeout_s(engine, db_url, wd):
    stuck = threading.Event()
    with pytest.raises(RunKilled) as stopped:
        with wd.run("bot") as run:
            threading.Timer(1.2, lambda: cli(db_url, "kill", run.id)).start()
            t0 = time.monotonic()
            try:
                run.tool_call("hangs", {}, lambda: stuck.wait(60), timeout_s=60)
            finally:
                waited = time.monotonic() - t0
    stuck.set()
    assert stopped.value.reason == lc.MANUAL
    assert waited < 1.2 + 1.0 + 2.0  # the kill, then the in-flight poll (1 s), with slack for a loaded box
    assert run.cancelled.is_set()
    (tool,) = [e for e in _events(engine, run.id) if e.kind == lc.EV_TOOL]
    assert (tool.ok, tool.error_class) == (False, "RunKilled")


def test_partial_is_in_the_stop_alert_and_in_show(engine, db_url, wd):
    with pytest.raises(RunKilled):
        with wd.run("bot", guards=False) as run:
            run.partial({"answer": "refund approved", "confidence": 0.7})
            for _ in range(13):
                run.step()
            assert Ticker(engine, config(), Killer(allowed_users=[ME]), sealer=SEALER).tick(utcnow()).stops == [(run.id, lc.MAX_STEPS)]
            run.step()
    (alert,) = alerts_of(engine, run.id)
    assert 'stopped at max_steps with a partial answer: «{"answer": "refund approved", "confidence": 0.7}»' in alert.body
    record = json.loads(cli(db_url, "show", run.id, "--json").output)
    assert json.loads(record["partial"]) == {"answer": "refund approved", "confidence": 0.7}


def test_show_jsonl_of_a_killed_run_with_a_child_parses_line_by_line(engine, db_url, wd):
    with pytest.raises(RunKilled):
        with wd.run("planner", kill_mode="cooperative") as parent:
            parent.step(model="gpt-x", tokens_in=10, tokens_out=2, cost_eur=0.01)
            with pytest.raises(RunKilled):
                with parent.child("researcher") as child:
                    child.step(model="gpt-x", tokens_in=5, tokens_out=1, cost_eur=0.02)
                    child.record_tool("search", {"q": "refund"}, ok=False, error=TimeoutError("slow"), duration_s=0.4)
                    child.heartbeat("reading")
                    assert cli(db_url, "kill", parent.id).exit_code == 0
                    child.heartbeat("still reading")
            parent.heartbeat()
    res = cli(db_url, "show", parent.id[:8], "--jsonl")
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.output.splitlines()]  # every line is one JSON object
    assert all(line["run_id"] in (parent.id, child.id) for line in lines)
    first_child = next(i for i, line in enumerate(lines) if line["run_id"] == child.id)
    assert all(line["run_id"] == parent.id for line in lines[:first_child])  # children follow their parent
    assert all(line["run_id"] == child.id and line["parent_id"] == parent.id for line in lines[first_child:])
    kinds = [(line["run_id"] == child.id, line["event"]) for line in lines]
    assert kinds[:first_child] == [(False, "run_started"), (False, "model_call"), (False, "stop_requested"),
                                   (False, "heartbeat"), (False, "run_ended")]
    assert [k for c, k in kinds if c] == ["run_started", "model_call", "tool_call", "heartbeat", "stop_requested",
                                          "heartbeat", "run_ended"]
    model = next(line for line in lines if line["event"] == "model_call" and line["run_id"] == child.id)
    assert (model["model"], model["tokens_in"], model["tokens_out"], model["cost_eur"]) == ("gpt-x", 5, 1, 0.02)
    tool = next(line for line in lines if line["event"] == "tool_call")
    assert (tool["tool"], tool["ok"], tool["error_class"], tool["duration_s"]) == ("search", False, "TimeoutError", 0.4)
    assert len(tool["args_hash"]) == 64 and "args" not in tool
    ended = [line for line in lines if line["event"] == "run_ended"]
    assert [(e["status"], e["reason"]) for e in ended] == [(lc.KILLED, lc.MANUAL), (lc.KILLED, lc.MANUAL)]
    stop = next(line for line in lines if line["event"] == "stop_requested" and line["run_id"] == parent.id)
    assert stop["by"].startswith("cli@") and stop["reason"] == lc.MANUAL
