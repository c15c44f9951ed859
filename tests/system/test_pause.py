"""Pause and approve, end to end: real agent processes, the real tick, the real CLI, both backends.

A run whose profile says on_breach = "pause" is held at max_steps (its process alive,
no further record, its keep-alive still beating), `resume --add-steps` lets it finish;
nobody answering stops it with its reason after approval_timeout_s; `kill` stops a
paused run; in a process shared by several runs only the paused one waits.
"""

from __future__ import annotations

import threading
import time

import pytest
from click.testing import CliRunner

from agent_procs import wait_until
from daemon_support import actions, alerts_of, config, interventions_of, later, run_row, ticker
from watchdog import RunKilled, Watchdog
from watchdog.cli import main
from watchdog.core import lifecycle as lc
from watchdog.daemon.process.service import Daemon
from watchdog.store.schema import utcnow

PAUSE = {"on_breach": "pause"}




def cli(db_url, *args):
    res = CliRunner().invoke(main, ["--db", db_url, *args])
    return res


def status_of(engine, run_id):
    from sqlalchemy import select

    from watchdog.store.schema import runs

    with engine.connect() as conn:
        return conn.execute(select(runs.c.status).where(runs.c.id == run_id)).scalar()


def _pauser(procs, db_url, tmp_path, *runs):
    for r in runs:
        r.setdefault("gate", str(tmp_path / f"{r['name']}.gate"))
    return procs.start("pauser", db_url, runs=list(runs))


def _held(engine, run_id, seconds: float = 2.5):
    """The run's row over `seconds`: (steps, last_seq, last_seen_at) before and after."""
    a = run_row(engine, run_id)
    time.sleep(seconds)
    b = run_row(engine, run_id)
    return a, b


def test_a_paused_run_is_held_alive_and_resume_lets_it_complete(engine, db_url, procs, tmp_path):
    cfg = config(agents={"bot": {**PAUSE, "heartbeat_timeout_s": 4.0}})
    agent = _pauser(procs, db_url, tmp_path, {"name": "migrate", "budgets": {"max_steps": 3}, "before": 4,
                                              "after": 3, "kill_mode": "process", "interval": 0.5})
    rid = agent.info["run_ids"]["migrate"]
    tk = ticker(engine, cfg)
    now = utcnow()
    rep = tk.tick(now)
    assert rep.pauses == [(rid, lc.MAX_STEPS)] and rep.stops == []
    row = run_row(engine, rid)
    assert (row.status, row.stop_reason, row.paused_at) == (lc.PAUSED, lc.MAX_STEPS, now)
    assert actions(engine, rid) == ["paused"]
    (alert,) = alerts_of(engine, rid)
    assert alert.title.startswith(f"agent-watchdog: paused run {rid[:8]} — max_steps: to resume, "
                                  f"agent-watchdog resume {rid} --add-steps ")
    assert f"agent-watchdog resume {rid} --add-steps" in alert.body
    assert f"agent-watchdog kill {rid}" in alert.body
    assert "--add-tool-calls N, --add-eur X, --add-s N" in alert.body

    # Let the agent go on: its next record finds the run paused and waits there.
    (tmp_path / "migrate.gate").touch()
    assert wait_until(lambda: run_row(engine, rid).steps == 5)
    before, after = _held(engine, rid)
    assert agent.alive()
    assert (after.steps, after.last_seq) == (before.steps, before.last_seq) == (5, 5)  # no further record
    assert after.last_seen_at > before.last_seen_at  # ...but kept alive: not mistaken for a hang
    assert tk.tick(later(now, 1)).stops == []  # still paused, still waiting

    res = cli(db_url, "resume", rid[:8], "--add-steps", "5")
    assert res.exit_code == 0, res.output
    assert "max_steps 3 → 8" in res.output
    tk.tick(later(now, 2))  # the daemon alerts the resume (the CLI writes no alert)
    assert agent.wait() == 0
    assert agent.result()["migrate"] == {"status": lc.COMPLETED, "reason": None, "records": 7}
    row = run_row(engine, rid)
    assert (row.status, row.stop_reason, row.steps, row.max_steps, row.resumes) == (lc.COMPLETED, None, 7, 8, 1)
    resumed = interventions_of(engine, rid)[-1]
    assert resumed.action == "resumed" and resumed.actor.startswith("cli@") and "(root" in resumed.actor
    assert "max_steps 3 → 8" in resumed.detail
    assert [a.title for a in alerts_of(engine, rid)][-1] == f"agent-watchdog: resumed run {rid[:8]} — max_steps"


def test_nobody_answers_a_paused_run_it_is_stopped_with_its_reason(engine, db_url, procs, tmp_path):
    cfg = config(agents={"bot": {**PAUSE, "approval_timeout_s": 30.0}})
    agent = _pauser(procs, db_url, tmp_path, {"name": "late", "budgets": {"max_steps": 2}, "before": 3, "after": 1})
    rid = agent.info["run_ids"]["late"]
    tk = ticker(engine, cfg)
    now = utcnow()
    assert tk.tick(now).pauses == [(rid, lc.MAX_STEPS)]
    (tmp_path / "late.gate").touch()
    assert wait_until(lambda: run_row(engine, rid).steps == 4)  # held at this record
    assert tk.tick(later(now, 29)).stops == []
    rep = tk.tick(later(now, 30))
    assert rep.stops == [(rid, lc.MAX_STEPS)]
    row = run_row(engine, rid)
    assert (row.status, row.stop_reason) == (lc.STOPPING, lc.MAX_STEPS)
    assert actions(engine, rid) == ["paused", "stop_requested"]
    stop = interventions_of(engine, rid)[-1]
    assert "nobody answered within approval_timeout_s 30 s" in stop.outcome
    assert agent.wait() == 0  # the held record sees the stop within a second
    assert agent.result()["late"]["reason"] == lc.MAX_STEPS
    assert run_row(engine, rid).status == lc.KILLED


def test_kill_stops_a_paused_run(engine, db_url, procs, tmp_path):
    cfg = config(agents={"bot": PAUSE})
    agent = _pauser(procs, db_url, tmp_path, {"name": "k", "budgets": {"max_steps": 2}, "before": 3, "after": 5})
    rid = agent.info["run_ids"]["k"]
    assert ticker(engine, cfg).tick(utcnow()).pauses == [(rid, lc.MAX_STEPS)]
    (tmp_path / "k.gate").touch()
    assert wait_until(lambda: run_row(engine, rid).steps == 4)
    res = cli(db_url, "kill", rid[:8])
    assert res.exit_code == 0, res.output
    assert agent.wait() == 0
    assert agent.result()["k"]["reason"] == lc.MANUAL
    row = run_row(engine, rid)
    assert (row.status, row.stop_reason, row.steps) == (lc.KILLED, lc.MANUAL, 4)
    stop = interventions_of(engine, rid)[-1]
    assert stop.action == "stop_requested" and "killed while paused for max_steps" in stop.outcome
    assert stop.actor.startswith("cli@")
    # resume of a run that is no longer paused: one line, exit 1
    res = cli(db_url, "resume", rid[:8], "--add-steps", "1")
    assert res.exit_code == 1 and "not paused" in res.output


def test_in_a_shared_process_only_the_paused_run_waits(engine, db_url, procs, tmp_path):
    cfg = config(agents={"bot": PAUSE})
    agent = _pauser(procs, db_url, tmp_path,
                    {"name": "over", "budgets": {"max_steps": 1}, "before": 2, "after": 2},
                    {"name": "busy1", "beat": True}, {"name": "busy2", "beat": True})
    ids = agent.info["run_ids"]
    rep = ticker(engine, cfg).tick(utcnow())
    assert rep.pauses == [(ids["over"], lc.MAX_STEPS)] and rep.stops == []
    (tmp_path / "over.gate").touch()
    assert wait_until(lambda: run_row(engine, ids["over"]).steps == 3)
    held = {name: _held(engine, rid, 0) for name, rid in ids.items()}
    time.sleep(2)
    for name in ("busy1", "busy2"):  # the others go on writing...
        assert run_row(engine, ids[name]).last_seq > held[name][1].last_seq
        assert run_row(engine, ids[name]).status == lc.RUNNING
    assert run_row(engine, ids["over"]).last_seq == held["over"][1].last_seq  # ...the paused one waits
    res = cli(db_url, "resume", ids["over"], "--add-steps", "3")
    assert res.exit_code == 0, res.output
    assert wait_until(lambda: run_row(engine, ids["over"]).status == lc.COMPLETED)
    (tmp_path / "agent0.ready.finish").touch()
    assert agent.wait() == 0
    out = agent.result()
    assert {n: o["status"] for n, o in out.items()} == {"over": lc.COMPLETED, "busy1": lc.COMPLETED,
                                                        "busy2": lc.COMPLETED}


def test_loops_and_silence_never_pause(engine, wd):
    cfg = config(agents={"bot": {**PAUSE, "heartbeat_timeout_s": 5.0}})
    tk = ticker(engine, cfg)
    with pytest.raises(RunKilled):
        with wd.run("bot", guards=False) as looping:
            for _ in range(3):
                looping.record_tool("verify_iban", {"iban": "DE00"}, ok=False, error="timeout")
            for _ in range(13):  # over max_steps too: the loop wins, it stops
                looping.step()
            assert tk.tick(utcnow()).stops == [(looping.id, lc.LOOP_DETECTED)]
            looping.heartbeat()
    with pytest.raises(RunKilled):
        with wd.run("bot", guards=False) as silent:
            silent.heartbeat()
            assert tk.tick(later(utcnow(), 6)).stops == [(silent.id, lc.HEARTBEAT_TIMEOUT)]
            silent.heartbeat()


def test_a_paused_run_that_goes_silent_or_loses_its_process_is_not_kept_waiting(engine, db_url, wd, procs, tmp_path):
    cfg = config(agents={"bot": {**PAUSE, "heartbeat_timeout_s": 5.0}})
    tk = ticker(engine, cfg)
    # Paused, then nothing more from it (the agent is inside a tool that hangs): silence stops it.
    run = wd.run("bot", guards=False, max_steps=1).start()
    run.step()
    run.step()
    now = utcnow()
    assert tk.tick(now).pauses == [(run.id, lc.MAX_STEPS)]
    rep = tk.tick(later(now, 6))
    assert rep.stops == [(run.id, lc.HEARTBEAT_TIMEOUT)]
    assert "stopped while paused for max_steps" in interventions_of(engine, run.id)[-1].outcome
    # Paused, then its process dies: lost, like a running run.
    agent = _pauser(procs, db_url, tmp_path, {"name": "dies", "budgets": {"max_steps": 1}, "before": 2})
    rid = agent.info["run_ids"]["dies"]
    assert tk.tick(utcnow()).pauses == [(rid, lc.MAX_STEPS)]
    agent.proc.kill()
    agent.wait()
    rep = tk.tick(later(utcnow(), 1))
    assert rep.lost == [rid]
    assert run_row(engine, rid).status == lc.LOST


def test_the_in_process_guard_pauses_too_and_the_daemon_alerts_it(engine, db_url):
    cfg = config(agents={"bot": PAUSE})
    Daemon(engine, cfg).publish(force=True)  # the SDK judges by the profiles the daemon published
    wd = Watchdog(db_url)
    out = {}
    run = wd.run("bot", max_steps=2)

    def agent():
        with run:
            for _ in range(4):
                run.check_budget()  # the third call would exceed max_steps: held here
                run.step(model="gpt-x", tokens_in=1, tokens_out=1)
        out["status"] = run.status

    t = threading.Thread(target=agent)
    t.start()
    try:
        assert wait_until(lambda: status_of(engine, run.id) == lc.PAUSED)
        row = run_row(engine, run.id)
        assert (row.steps, row.stop_reason) == (2, lc.MAX_STEPS)
        assert "in-process guard" in row.stop_detail
        assert actions(engine, run.id) == []  # the SDK writes the status only...
        tk = ticker(engine, cfg)
        tk.tick(utcnow())
        assert actions(engine, run.id) == ["paused"]  # ...the daemon records and alerts it, once
        tk.tick(utcnow())
        assert actions(engine, run.id) == ["paused"] and len(alerts_of(engine, run.id)) == 1
        assert "in-process guard paused the run" in interventions_of(engine, run.id)[0].outcome
        res = cli(db_url, "resume", run.id, "--add-steps", "2")
        assert res.exit_code == 0, res.output
        t.join(30)
        assert out == {"status": lc.COMPLETED}
        assert run_row(engine, run.id).steps == 4
    finally:
        t.join(30)
        wd.close()


def test_resume_refuses_an_amount_that_would_pause_it_again_at_once(engine, db_url, wd):
    cfg = config(agents={"bot": PAUSE})
    with pytest.raises(RunKilled):
        with wd.run("bot", guards=False, max_steps=2) as run:
            for _ in range(5):
                run.step()
            assert ticker(engine, cfg).tick(utcnow()).pauses == [(run.id, lc.MAX_STEPS)]
            res = cli(db_url, "resume", run.id, "--add-steps", "2")
            assert res.exit_code == 1
            assert "it would pause again at once: give --add-steps 3 or more" in res.output
            assert run_row(engine, run.id).status == lc.PAUSED
            res = cli(db_url, "resume", run.id)
            assert res.exit_code == 1 and "give at least one of --add-steps" in res.output
            res = cli(db_url, "resume", run.id, "--add-steps", "0")
            assert res.exit_code == 2
            assert cli(db_url, "kill", run.id).exit_code == 0
            run.heartbeat()


def test_without_a_daemon_a_paused_run_stops_itself_after_approval_timeout(engine, db_url):
    cfg = config(daemon={"tick_s": 0.5}, agents={"bot": {**PAUSE, "approval_timeout_s": 1.0}})
    Daemon(engine, cfg).publish(force=True)  # published once; no daemon ticks afterwards
    wd = Watchdog(db_url)
    out = {}

    def agent():
        try:
            with wd.run("bot", max_steps=1) as run:
                out["id"] = run.id
                for _ in range(3):
                    run.check_budget()
                    run.step()
        except RunKilled as stop:
            out["stop"] = stop

    t = threading.Thread(target=agent)
    t0 = time.monotonic()
    t.start()
    try:
        t.join(60)
        assert not t.is_alive()
        assert out["stop"].reason == lc.MAX_STEPS and "nobody answered the pause" in out["stop"].detail
        assert time.monotonic() - t0 >= 1.0 + 3 * 0.5  # the daemon, had there been one, answered first
        row = run_row(engine, out["id"])
        assert (row.status, row.stop_reason, row.steps) == (lc.KILLED, lc.MAX_STEPS, 1)
    finally:
        wd.close()
