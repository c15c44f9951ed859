"""Every stop is heard once (issue 19, item 1): a run stopped by its in-process guard that
ends at once — well inside one tick, so the daemon never sees it `stopping` — still gets
exactly one intervention and one alert naming its top tool, also across a daemon restart;
many such stops are summarised past a rate, each still recorded.

Real agent processes write through the SDK and exit; a real Ticker (and, end to end, the
real `agent-watchdog run` daemon with a real HTTP target) hears them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from sqlalchemy import insert

from agent_procs import wait_until
from daemon_support import alerts_of, interventions_of, later, run_row, ticker
from watchdog.core import lifecycle as lc
from watchdog.daemon.stops import acknowledge
from watchdog.daemon.stops.killer import Killer
from test_daemon import _holds_lease, _toml, daemon_procs  # noqa: F401 — the fixture
from watchdog.store.schema import runs, utcnow

HERE = Path(__file__).resolve().parent

AGENT = textwrap.dedent("""
    import sys
    from watchdog import RunKilled, Watchdog
    wd = Watchdog(sys.argv[1])
    mode = sys.argv[2]
    with wd.run(agent="heard-bot", max_tool_calls=4) as run:
        print(run.id, flush=True)
        for i in range(10):
            args = {"q": "same"} if mode == "loop" else {"q": i}
            run.tool_call("search", args, lambda **kw: "x")
""")


def _agent(db_url: str, mode: str) -> str:
    """A real process whose in-process guard stops its run; it leaves at once (RunKilled)."""
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG")}
    env["AGENT_WATCHDOG_SOCKET"] = "/nonexistent/attest.sock"
    p = subprocess.run([sys.executable, "-c", AGENT, db_url, mode], capture_output=True, text=True, timeout=60,
                       env=env)
    assert p.returncode != 0 and "RunKilled" in p.stderr, p.stderr  # the guard's stop left the with block
    return p.stdout.split()[0]


def _stops(engine, run_id):
    return [i for i in interventions_of(engine, run_id) if i.action == "stop_requested"]


def test_guard_stops_of_runs_that_end_at_once_are_recorded_and_alerted_once(db_url, engine):
    tk = ticker(engine)
    tk.tick(utcnow())  # the daemon is up before the agents
    loop_id = _agent(db_url, "loop")
    calls_id = _agent(db_url, "calls")
    for rid, reason in ((loop_id, lc.LOOP_DETECTED), (calls_id, lc.MAX_TOOL_CALLS)):
        row = run_row(engine, rid)
        assert (row.status, row.stop_reason) == (lc.KILLED, reason)  # ended before any tick saw it stopping
    tk.tick(utcnow())
    tk.tick(later(utcnow(), 1))
    for rid, reason in ((loop_id, lc.LOOP_DETECTED), (calls_id, lc.MAX_TOOL_CALLS)):
        (iv,) = _stops(engine, rid)
        assert iv.reason == reason and iv.actor.startswith("daemon@")
        (alert,) = alerts_of(engine, rid)
        assert alert.title == f"agent-watchdog: stopped run {rid[:8]} — {reason}"
        assert "top tool: «search» ×" in alert.body  # the numbers and the top tool, as for its own stops
        assert "already ended (killed)" in alert.body
        assert alert.intervention_id == iv.id and alert.mac is not None
    # A restarted daemon (a fresh Ticker: no memory) hears nothing twice.
    again = ticker(engine)
    again.tick(later(utcnow(), 2))
    for rid in (loop_id, calls_id):
        assert len(_stops(engine, rid)) == 1 and len(alerts_of(engine, rid)) == 1


def test_a_stop_made_while_the_daemon_was_down_is_heard_once_after_its_restart(db_url, engine):
    rid = _agent(db_url, "calls")  # no daemon at all
    ticker(engine).tick(utcnow())
    ticker(engine).tick(later(utcnow(), 1))  # and a second restart
    assert len(_stops(engine, rid)) == 1
    (alert,) = alerts_of(engine, rid)
    assert "top tool: «search» ×4" in alert.body or "top tool: «search» ×" in alert.body


def test_many_stops_at_once_are_summarised_past_the_rate_and_each_recorded(db_url, engine):
    now = utcnow()
    n = acknowledge.PER_MIN + 25
    with engine.begin() as conn:  # a writer ending many runs as killed (plain SQL, the table contract)
        conn.execute(insert(runs), [dict(
            id=f"mass{i:04d}", agent="mass-bot", status=lc.KILLED, stop_reason=lc.MANUAL, kill_mode="cooperative",
            host=Killer().host, started_at=now, last_seen_at=now, stop_requested_at=now, ended_at=now)
            for i in range(n)])
    tk = ticker(engine)
    tk.tick(later(now, 1))
    tk.tick(later(now, 2))
    every = alerts_of(engine)
    per_run = [a for a in every if a.run_id is not None]
    assert len(per_run) == n  # each stop has its own alert row...
    sent = [a for a in per_run if a.delivered_at is None]
    assert len(sent) == acknowledge.PER_MIN  # ...but only the rate's worth go out one by one
    (summary,) = [a for a in every if a.dedupe_key.startswith("stops:")]
    assert summary.title == f"agent-watchdog: 25 more runs stopped (summarised past {acknowledge.PER_MIN} alerts/min)"
    assert "manual ×25" in summary.body and "«mass-bot» ×25" in summary.body
    for i in range(n):
        assert len(_stops(engine, f"mass{i:04d}")) == 1
    ticker(engine).tick(later(now, 3))  # a restart adds nothing
    assert len(alerts_of(engine)) == n + 1


def test_the_real_daemon_alerts_a_guard_stop_once_on_its_target(tmp_path, db_url, engine, http, daemon_procs):
    cfg = _toml(tmp_path / "wd.toml", db_url, alert_urls=[http.url()])
    d = daemon_procs(cfg)
    assert wait_until(lambda: _holds_lease(engine, d.proc.pid), 60), d.log()
    rid = _agent(db_url, "loop")
    assert http.wait_for(1, 60), d.log()
    (msg,) = http.received
    assert msg["title"] == f"agent-watchdog: stopped run {rid[:8]} — loop_detected"
    assert "top tool: «search» ×" in msg["message"]
    assert d.stop() == 0, d.log()
    d2 = daemon_procs(cfg, "again")  # a restart sends nothing twice...
    assert wait_until(lambda: _holds_lease(engine, d2.proc.pid), 60), d2.log()
    other = _agent(db_url, "calls")  # ...and hears the next stop: its ticks ran past the first one
    assert http.wait_for(2, 60), d2.log()
    assert d2.stop() == 0, d2.log()
    titles = [m["title"] for m in http.received]
    assert titles == [f"agent-watchdog: stopped run {rid[:8]} — loop_detected",
                      f"agent-watchdog: stopped run {other[:8]} — max_tool_calls"]


def test_the_real_daemon_sends_each_alert_once_in_order_to_a_slow_and_a_fast_target(tmp_path, db_url, engine,
                                                                                   http, daemon_procs):
    """Issue 19, item 3, end to end: a 3 s-slow webhook beside a fast one, tick_s 0.5 (each
    delivery pass waits 1 s at most): nothing abandoned, nothing sent twice, the same order."""
    from alertsinks import HttpSink

    with HttpSink() as slow:
        slow.delay_s = 3.0
        cfg = _toml(tmp_path / "wd.toml", db_url, alert_urls=[slow.url(), http.url()], tick_s=0.5)
        d = daemon_procs(cfg)
        assert wait_until(lambda: _holds_lease(engine, d.proc.pid), 60), d.log()
        ids = [_agent(db_url, mode) for mode in ("loop", "calls", "loop")]
        assert http.wait_for(3, 60) and slow.wait_for(3, 90), d.log()
        assert d.stop() == 0, d.log()  # the last pass on the way out sends nothing twice either
        fast_titles = [m["title"] for m in http.received]
        slow_titles = [m["title"] for m in slow.received]
        assert len(fast_titles) == 3 and slow_titles == fast_titles  # once each, in the same order
        assert [t.split(" run ")[1][:8] for t in fast_titles] == [i[:8] for i in ids]  # as the stops happened
        with engine.connect() as conn:
            from sqlalchemy import select

            from watchdog.store.schema import alerts

            rows = conn.execute(select(alerts.c.delivered_at, alerts.c.dead_at)).all()
        assert all(r.delivered_at is not None and r.dead_at is None for r in rows)
