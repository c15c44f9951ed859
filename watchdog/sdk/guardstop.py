"""The SQL an in-process guard trip writes: running → stopping, an audit row, an alert.

Kept out of the per-record hot path: it runs once per run at most.
"""

from __future__ import annotations

import os

from watchdog.core import lifecycle as lc
from watchdog.core.messages import RunFacts, stop_alert
from watchdog.core.procid import hostname


def statements(run, stop, now) -> list:
    d = run.wd.writer.dialect
    ph = "?" if d.sqlite else "%s"
    json_ph = ph if d.sqlite else "%s::json"
    top = None
    if run.tool_counts:
        name, calls = run.tool_counts.most_common(1)[0]
        top = (name, calls, run.tool_error_counts.get(name, 0))
    facts = RunFacts(
        id=run.id, agent=run.agent, host=hostname(), pid=os.getpid(), kill_mode=run.kill_mode, steps=run.steps,
        tool_calls=run.tool_calls, tool_errors=run.tool_errors, cost_eur=run.cost_eur,
        duration_s=run.elapsed_s, top_tool=top, tokens=run.tokens_in + run.tokens_out)
    action = "in-process guard refused the call and raised RunKilled in the agent"
    title, body = stop_alert(facts, run.budgets, stop.reason, stop.detail, action)
    by = f"sdk@{hostname()}:{os.getpid()}"
    ts = d.ts(now)
    return [
        (f"UPDATE runs SET status = {ph}, stop_reason = {ph}, stop_detail = {ph}, stop_requested_at = {ph} "
         f"WHERE id = {ph} AND status = {ph}", (lc.STOPPING, stop.reason, stop.detail, ts, run.id, lc.RUNNING)),
        (f"INSERT INTO interventions (at, run_id, action, reason, detail, outcome, actor) "
         f"VALUES ({ph}, {ph}, {ph}, {ph}, {ph}, {ph}, {ph})",
         (ts, run.id, "guard_stop", stop.reason, stop.detail, "RunKilled raised in the agent", by)),
        # ON CONFLICT: the daemon may have stopped the run in the same instant; one alert per stop.
        (f"INSERT INTO alerts (dedupe_key, created_at, run_id, title, body, attempts, next_attempt_at, "
         f"delivered_targets) VALUES ({ph}, {ph}, {ph}, {ph}, {ph}, 0, {ph}, {json_ph}) ON CONFLICT DO NOTHING",
         (f"stop:{run.id}", ts, run.id, title[:500], body, ts, "[]")),
    ]
