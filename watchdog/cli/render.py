"""Text renderings for humans (80 columns; JSON is in views.py)."""

from __future__ import annotations

from watchdog.core.budgets import BUDGETS, PROFILE_KEYS, Totals
from watchdog.core.config import Config
from watchdog.core.text import duration, url_without_password


def short(run_id: str) -> str:
    return run_id[:8]


def top_tool_text(top: dict | None) -> str:
    if not top:
        return "-"
    err = f" {top['errors']}err" if top["errors"] else ""
    return f"{top['name']}×{top['calls']}{err}"


def runs_table(records: list[dict]) -> str:
    if not records:
        return "no runs"
    lines = [f"{'RUN':8} {'AGENT':14} {'STATUS':9} {'REASON':13} {'STEP':>4} {'CALL':>4} {'EUR':>6} {'AGE':>6} TOP TOOL"]
    for r in records:
        lines.append(
            f"{short(r['id']):8} {r['agent'][:14]:14} {r['status']:9} {(r['stop_reason'] or '-')[:13]:13} "
            f"{r['steps']:>4} {r['tool_calls']:>4} {r['cost_eur']:>6.2f} {duration(r['duration_s']):>6} "
            f"{top_tool_text(r['top_tool'])[:18]}"
        )
    return "\n".join(lines)


def run_detail(r: dict) -> str:
    b = r["budgets"]
    used = Totals(steps=r["steps"], tool_calls=r["tool_calls"], cost_eur=r["cost_eur"],
                  tokens=(r.get("tokens_in") or 0) + (r.get("tokens_out") or 0), age_s=r["duration_s"])
    lines = [
        f"run {r['id']}  agent {r['agent']}",
        f"  status      {r['status']}" + (f"  ({r['stop_reason']}: {r['stop_detail']})" if r["stop_reason"] else
                                         (f"  ({r['stop_detail']})" if r.get("stop_detail") else "")),
        f"  where       {r['host']} pid {r['pid']}  kill_mode {r['kill_mode']}",
        f"  started     {r['started_at']}   ended {r['ended_at'] or '-'}",
    ]
    for budget in BUDGETS:  # each counter against its budget, as the registry renders it
        if budget.measure not in ("steps", "tool_calls", "cost_eur", "tokens", "age_s"):
            continue
        line = f"  {budget.label:11} {budget.against(getattr(used, budget.measure), b.get(budget.key))}"
        if budget.measure == "tool_calls":
            line += f"  ({r['tool_errors']} errors)"
        elif budget.measure == "cost_eur":
            line += f"  (tokens {r['tokens_in']} in / {r['tokens_out']} out)"
        lines.append(line)
    if r.get("progress"):
        lines.append(f"  progress    {r['progress']}")
    if r.get("tools"):
        lines.append("  tools")
        total = sum(t["calls"] for t in r["tools"]) or 1
        for t in r["tools"][:8]:
            lines.append(f"    {t['name'][:28]:28} {t['calls']:>5} calls ({100 * t['calls'] // total:>3}%) {t['errors']:>5} errors")
    if r.get("interventions"):
        lines.append("  interventions")
        for i in r["interventions"]:
            lines.append(f"    {i['at'][11:19]} {i['action']:16} {i['reason'] or '':16} {i['outcome'] or ''}")
    if r.get("last_events"):
        lines.append("  last events")
        for e in r["last_events"]:
            lines.append("    " + event_line(e))
    return "\n".join(lines)


def event_line(e: dict) -> str:
    t = e["at"][11:19]
    if e["kind"] == "tool":
        status = "ok" if e["ok"] else f"ERR {e['error_class']}: {e['error_msg']}"
        return f"#{e['seq']:<4} {t} tool {e['tool']} [{(e['args_hash'] or '')[:8]}] {status}"[:110]
    if e["kind"] == "step":
        return f"#{e['seq']:<4} {t} step {e['model'] or '-'} {e['tokens_in']}→{e['tokens_out']} tok {e['cost_eur'] or 0:.4f} EUR"
    return f"#{e['seq']:<4} {t} heartbeat {e['progress'] or ''}"[:110]


def config_summary(config: Config) -> str:
    keys = PROFILE_KEYS
    lines = [f"config {config.path or '(built-in defaults)'}: OK",
             f"  store {url_without_password(config.store.url) or '(from --db / AGENT_WATCHDOG_DB)'}",
             f"  daemon tick {config.daemon.tick_s:g}s, cancel grace {config.daemon.cancel_grace_s:g}s, "
             f"term grace {config.daemon.term_grace_s:g}s, allowed users {list(config.daemon.allowed_users) or '(own user)'}",
             f"  alerts {len(config.alert_urls)} URL(s), prices for {len(config.prices)} model(s)"]
    profiles = {"[defaults]": config.defaults, **{f"[agents.{k}]": v for k, v in config.agents.items()}}
    for name, b in profiles.items():
        lines.append(f"  {name}")
        lines.append("    " + ", ".join(f"{k}={getattr(b, k)}" for k in keys))
    return "\n".join(lines)
