"""The pages: runs (active first, then recent), one run, the period budgets, a run's postmortem.

Each page is a function of the records the store's read verbs return; every text is escaped
(watchdog.web.html). Cells the refresh script updates carry `data-k` (a record's field).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from watchdog.core.interventions import LADDER_ACTIONS
from watchdog.core import messages
from watchdog.core.text import scrub
from watchdog.web.html import bar, esc, href, page, run_href, status_badge, table, when

# The ladder's rungs among a run's interventions, in the order they happen.
LADDER = LADDER_ACTIONS  # the steps of a stop, as the ladder writes them
FILTERS = ("agent", "status", "label", "host")
STATUS_CHOICES = ("", "running", "paused", "stopping", "completed", "failed", "killed", "lost")


def top_text(record: dict) -> str:
    t = record.get("top_tool")
    if not t:
        return "-"
    return f"{t['name']} ×{t['calls']}" + (f" ({t['errors']} errors)" if t.get("errors") else "")


def budget_cells(r: dict) -> str:
    b = r["budgets"]
    cost = f"{r['cost_eur']:.2f}/{(b.get('max_cost_eur') or 0):.2f} EUR"
    wall = messages.duration(r["duration_s"])
    return (f"<td>{bar(r['steps'], b.get('max_steps'))}</td>"
            f"<td>{bar(r['tool_calls'], b.get('max_tool_calls'))}</td>"
            f"<td>{bar(r['cost_eur'], b.get('max_cost_eur'), text=cost)}</td>"
            f"<td>{bar(r['duration_s'], b.get('max_wall_s'), text=wall)}</td>")


def _run_row(r: dict) -> str:
    return (f'<tr data-run="{esc(r["id"])}"><td><a href="{run_href(r["id"])}"><code>{esc(r["id"][:8])}</code></a></td>'
            f"<td>{esc(r['agent'])}</td><td>{status_badge(r['status'])}</td>"
            f'<td data-k="stop_reason">{esc(r["stop_reason"])}</td><td data-k="top_tool">{esc(top_text(r))}</td>'
            f"{budget_cells(r)}<td>{esc(r['host'])}</td><td>{when(r['started_at'])}</td></tr>")


RUN_HEADERS = ("run", "agent", "status", "stop reason", "top tool", "steps", "tool calls", "cost", "wall", "host",
               "started (UTC)")


def runs_page(active: list[dict], recent: list[dict], filters: dict[str, str], *, next_before: str | None,
              api: str | None) -> str:
    fields = []
    for name in FILTERS:
        value = filters.get(name, "")
        if name == "status":
            opts = "".join(f'<option value="{esc(s)}"{" selected" if s == value else ""}>{esc(s or "any")}</option>'
                           for s in STATUS_CHOICES)
            fields.append(f'<label>status <select name="status">{opts}</select></label>')
        else:
            hint = ' placeholder="key=value"' if name == "label" else ""
            fields.append(f'<label>{esc(name)} <input name="{esc(name)}" value="{esc(value)}"{hint}></label>')
    form = f'<form method="get" action="/" class="filters">{"".join(fields)}<button>filter</button></form>'
    more = (f'<p><a href="{href("/", **filters, before=next_before)}">older runs →</a></p>' if next_before else "")
    body = (f"<h1>Runs</h1>{form}<p id=\"notice\" class=\"notice\"></p>"
            f"<h2>Active ({len(active)})</h2>"
            + table(RUN_HEADERS, map(_run_row, active), empty="no active runs", cls="runs")
            + "<h2>Recent</h2>"
            + table(RUN_HEADERS, map(_run_row, recent), empty="no ended runs", cls="runs") + more)
    return page("Runs", body, api=api)


def _kv(rows: list[tuple[str, Any]]) -> str:
    return "<table class=\"kv\">" + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def run_page(r: dict, *, svg: str, alerts: list[dict]) -> str:
    b = r["budgets"]
    rid = r["id"]
    tokens = r["tokens_in"] + r["tokens_out"]
    counters = table(("measure", "used", "budget"), [
        f'<tr><td>steps</td><td data-k="steps">{esc(r["steps"])}</td><td>{bar(r["steps"], b.get("max_steps"))}</td></tr>',
        f'<tr><td>tool calls</td><td data-k="tool_calls">{esc(r["tool_calls"])}</td>'
        f'<td>{bar(r["tool_calls"], b.get("max_tool_calls"))}</td></tr>',
        f'<tr><td>tool errors</td><td data-k="tool_errors">{esc(r["tool_errors"])}</td><td></td></tr>',
        f"<tr><td>tokens</td><td>{tokens:,}</td><td>{bar(tokens, b.get('max_tokens'))}</td></tr>",
        f'<tr><td>cost (EUR)</td><td data-k="cost_eur">{r["cost_eur"]:.4f}</td><td>{_cost_bar(r)}</td></tr>',
        f'<tr><td>wall (s)</td><td data-k="duration_s">{r["duration_s"]:.0f}</td>'
        f'<td>{bar(r["duration_s"], b.get("max_wall_s"), text=messages.duration(r["duration_s"]))}</td></tr>',
    ], cls="counters")
    labels = ", ".join(f"{k}={v}" for k, v in (r.get("labels") or {}).items()) if isinstance(r.get("labels"), dict) else ""
    facts = _kv([
        ("agent", esc(r["agent"])), ("status", status_badge(r["status"])),
        ("stop reason", f'<span data-k="stop_reason">{esc(r["stop_reason"])}</span>'),
        ("stop detail", esc(scrub(r.get("stop_detail")))), ("top tool", f'<span data-k="top_tool">{esc(top_text(r))}</span>'),
        ("host / pid", f"{esc(r['host'])} / {esc(r['pid'])}"), ("kill mode", esc(r["kill_mode"])),
        ("source", esc(r["source"])), ("labels", esc(labels or "-")),
        ("parent", f'<a href="{run_href(r["parent_id"])}">{esc(r["parent_id"][:8])}</a>' if r.get("parent_id") else "-"),
        ("started", when(r["started_at"])), ("stop requested", when(r.get("stop_requested_at"))),
        ("ended", f'<span data-k="ended_at">{when(r["ended_at"])}</span>'),
        ("progress", esc(scrub(r.get("progress")))), ("resumes", esc(r.get("resumes"))),
    ])
    start = dt.datetime.fromisoformat(r["started_at"])
    ivs = r.get("interventions") or []

    def since(iso: str | None) -> str:
        return f"+{(dt.datetime.fromisoformat(iso) - start).total_seconds():.1f} s" if iso else "-"

    ladder = table(("at (UTC)", "since start", "step", "reason", "outcome", "decided by"), [
        f"<tr><td>{when(i['at'])}</td><td>{since(i['at'])}</td><td><strong>{esc(i['action'])}</strong></td>"
        f"<td>{esc(i['reason'])}</td><td>{esc(i['outcome'])}</td><td>{esc(i['actor'])}</td></tr>"
        for i in ivs if i["action"] in LADDER], empty="no stop: the ladder was not climbed")
    others = table(("at (UTC)", "action", "reason", "detail", "outcome", "actor"), [
        f"<tr><td>{when(i['at'])}</td><td>{esc(i['action'])}</td><td>{esc(i['reason'])}</td><td>{esc(scrub(_detail(i['detail'])))}</td>"
        f"<td>{esc(i['outcome'])}</td><td>{esc(i['actor'])}</td></tr>" for i in ivs], empty="no interventions")
    tools = table(("tool", "calls", "errors"), [
        f"<tr><td>{esc(t['name'])}</td><td>{esc(t['calls'])}</td><td>{esc(t['errors'])}</td></tr>"
        for t in r.get("tools") or []], empty="no tool calls")
    children = table(("run", "agent", "status", "stop reason", "steps", "tool calls", "cost EUR"), [
        f'<tr><td><a href="{run_href(c["id"])}"><code>{esc(c["id"][:8])}</code></a></td><td>{esc(c["agent"])}</td>'
        f"<td>{esc(c['status'])}</td><td>{esc(c['stop_reason'])}</td><td>{esc(c['steps'])}</td>"
        f"<td>{esc(c['tool_calls'])}</td><td>{c['cost_eur']:.4f}</td></tr>" for c in r.get("children") or []],
        empty="no child runs")
    sent = table(("created (UTC)", "alert", "state", "attempts", "delivered to (target ids)", "last error"), [
        f"<tr><td>{when(a['created_at'])}</td><td>{esc(a['title'])}</td><td>{esc(a['state'])}</td>"
        f"<td>{esc(a['attempts'])}</td><td>{esc(', '.join(a['delivered_targets']) or '-')}</td>"
        f"<td>{esc(scrub(a['last_error']))}</td></tr>" for a in alerts], empty="no alerts for this run")
    links = (f'<p class="links"><a href="{run_href(rid, "/postmortem")}">postmortem</a> · '
             f'<a href="{run_href(rid, "/postmortem.md")}">postmortem (Markdown)</a> · '
             f'<a href="{run_href(rid, "/timeline.svg")}">timeline (SVG)</a> · '
             f'<a href="{esc("/api/runs/" + rid)}">JSON</a></p>')
    body = (f'<div data-run="{esc(rid)}"><h1>{esc(r["agent"])} · run <code>{esc(rid[:8])}</code> {status_badge(r["status"])}</h1>'
            f"{links}<p id=\"notice\" class=\"notice\"></p><div class=\"cols\"><section><h2>Counters against budgets</h2>{counters}"
            f"</section><section><h2>Run</h2>{facts}</section></div>"
            f"<h2>Stop ladder</h2>{ladder}<h2>Tool-call timeline</h2><div class=\"chart\">{svg}</div>"
            f"<h2>Tools</h2>{tools}<h2>Children</h2>{children}<h2>Interventions</h2>{others}"
            f"<h2>Alerts</h2>{sent}</div>")
    return page(f"{r['agent']} run {rid[:8]}", body, api=f"/api/runs/{rid}")


def _detail(detail: str | None) -> str | None:
    """A signal's sealed target list (JSON with the daemon's MAC) as the pids it names; other details as written."""
    if not detail or not detail.startswith("{"):
        return detail
    import json

    try:
        value = json.loads(detail)
    except ValueError:
        return detail
    if isinstance(value, dict) and "mac" in value and isinstance(value.get("targets"), list):
        pids = ", ".join(f"pid {t.get('pid')} on {t.get('host')}" for t in value["targets"] if isinstance(t, dict))
        return f"sealed by the daemon: {pids or 'no process'}"
    return detail


def _cost_bar(r: dict) -> str:
    budget = r["budgets"].get("max_cost_eur")
    return bar(r["cost_eur"], budget, text=f"{r['cost_eur']:.2f}/{(budget or 0):.2f}")


def budgets_page(states: list, now: dt.datetime, tz: dt.tzinfo) -> str:
    rows = []
    for s in states:
        name = s.scope.name if s.scope.kind == "agent" else f"[{s.scope.name}]"
        rate = ("-" if not s.rate_eur_per_min else "< 0.0001" if s.rate_eur_per_min < 0.0001
                else f"{s.rate_eur_per_min:.4f}")
        out = "spent" if s.closed else messages.when(s.runs_out_at, now, tz) if s.runs_out_at else "-"
        state = "CLOSED" if s.closed else "WARN" if s.warned else "ok" if s.budget_eur else "-"
        budget = f"{s.budget_eur:.2f}" if s.budget_eur else "-"
        rows.append(f"<tr><td>{esc(name)}</td><td>{esc(s.scope.kind)}</td><td>{esc(s.period)} {esc(s.key)}</td>"
                    f"<td>{s.spent_eur:.4f}</td><td>{esc(budget)}</td>"
                    f"<td>{bar(s.spent_eur, s.budget_eur, text=f'{s.spent_eur:.2f}/{budget}')}</td>"
                    f"<td>{esc(rate)}</td><td>{esc(out)}</td><td>{esc(state)}</td></tr>")
    body = ("<h1>Period budgets</h1><p>Spend today and this month per agent and per label budget, the burn rate the "
            "daemon measured (EUR per minute; none while no daemon publishes) and when the budget runs out at that rate.</p>"
            + table(("scope", "kind", "period", "spent EUR", "budget EUR", "use", "burn EUR/min", "runs out", "state"),
                    rows, empty="no period budgets and no spend yet"))
    return page("Budgets", body)


def postmortem_page(run_id: str, agent: str, html_body: str) -> str:
    body = (f'<h1>Postmortem · {esc(agent)} run <code>{esc(run_id[:8])}</code></h1>'
            f'<p class="links"><a href="{run_href(run_id)}">the run</a> · '
            f'<a href="{run_href(run_id, "/postmortem.md")}">Markdown</a></p><article>{html_body}</article>')
    return page(f"postmortem {run_id[:8]}", body)


def error_page(status: str, message: str) -> str:
    return page(status, f"<h1>{esc(status)}</h1><p>{esc(message)}</p><p><a href=\"/\">all runs</a></p>")
