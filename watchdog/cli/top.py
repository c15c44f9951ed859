"""`agent-watchdog top`: the active runs, closest to a budget first, in 80 columns."""

from __future__ import annotations

import datetime as dt

from watchdog.core import messages, lifecycle as lc
from watchdog.core.config import Config
from watchdog.cli.render import short
from watchdog.core.text import duration, one_line
from watchdog.core.budgets import BUDGETS, Totals, effective_budgets
from watchdog.store.engine import Connection
from watchdog.store.viewer import active_runs, tool_calls_since
from watchdog.store.views import tool_stats

# The measures that only grow while a run runs (the loop and rate measures come from events).
_RUNNING_TOTALS = ("steps", "tool_calls", "cost_eur", "tokens", "age_s", "silent_s")

WIDTH = 80


def rows(conn: Connection, config: Config, now: dt.datetime) -> list[dict]:
    active = active_runs(conn)
    ids = [r.id for r in active]
    per_min = tool_calls_since(conn, ids, now - dt.timedelta(seconds=60))
    stats = tool_stats(conn, ids)
    out = []
    for r in active:
        b = effective_budgets(config.profile(r.agent), r)
        age_s = (now - r.started_at).total_seconds()
        used = Totals(steps=r.steps, tool_calls=r.tool_calls, cost_eur=r.cost_eur, tokens=r.tokens_in + r.tokens_out,
                      age_s=age_s, silent_s=(now - r.last_seen_at).total_seconds())
        # How close to its nearest budget the run is: 1.0 = at the limit.
        closeness = max(getattr(used, x.measure) / getattr(b, x.key) for x in BUDGETS if x.measure in _RUNNING_TOTALS)
        top = stats[r.id][0] if stats[r.id] else None
        out.append(dict(id=r.id, agent=r.agent, status=r.status, age_s=age_s, steps=r.steps, max_steps=b.max_steps,
                        calls=r.tool_calls, max_calls=b.max_tool_calls, cost=r.cost_eur, max_cost=b.max_cost_eur,
                        per_min=per_min.get(r.id, 0), top=top, closeness=closeness,
                        eur_per_min=messages.per_min(r.cost_eur, age_s),
                        burn=messages.run_line(r.cost_eur, b.max_cost_eur, age_s)))
    out.sort(key=lambda d: (d["status"] != lc.STOPPING, -d["closeness"]))
    return out


BURN_LINES = 3  # the fastest-burning runs shown under the table
PERIOD_LINES = 5  # the period budgets closest to running out


def frame(records: list[dict], now: dt.datetime, title: str = "", periods=(), tz=dt.timezone.utc) -> str:
    head = f"agent-watchdog top — {len(records)} active — {now.astimezone():%H:%M:%S}"
    if title:
        head += f" — {title}"
    lines = [head[:WIDTH],
             f"{'RUN':8} {'AGENT':10} {'AGE':>5} {'STEPS':>6} {'CALLS':>6} {'EUR':>9} {'C/MIN':>5} {'TOP TOOL':14} STATUS"]
    for d in records:
        top = f"{one_line(d['top'].name, 1000)[:9]}×{d['top'].calls}" if d["top"] else "-"
        eur = f"{d['cost']:.2f}/{d['max_cost']:.2f}"
        line = (f"{short(d['id']):8} {one_line(d['agent'], 1000)[:10]:10} {duration(d['age_s']):>5} "
                f"{d['steps']:>3}/{d['max_steps']:<2} {d['calls']:>3}/{d['max_calls']:<2} {eur:>9} "
                f"{d['per_min']:>5} {top[:14]:14} {'STOP' if d['status'] == lc.STOPPING else 'run'}")
        lines.append(line[:WIDTH])
    if not records:
        lines.append("no active runs")
    burning = sorted((d for d in records if d.get("burn")), key=lambda d: -(d["eur_per_min"] or 0))[:BURN_LINES]
    if burning:
        lines.append("")
        lines += [f"{short(d['id'])} {d['burn'].replace('this run ', '')}"[:WIDTH] for d in burning]
    shown = sorted((s for s in periods if s.budget_eur > 0),
                   key=lambda s: (not s.closed, s.runs_out_at is None, -s.spent_eur / s.budget_eur))[:PERIOD_LINES]
    if shown:
        if not records:  # issue 19: nothing runs, so nothing is burning: no run-out forecast
            import dataclasses

            shown = [dataclasses.replace(s, runs_out_at=None, rate_eur_per_min=None) for s in shown]
        lines.append("")
        lines += [messages.period_line(s, now, tz)[:WIDTH] for s in shown]
    return "\n".join(lines)
