"""Text renderings for humans (80 columns; JSON is in views.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from watchdog.core.budgets import BUDGETS, Totals
from watchdog.core.text import command_id, duration, one_line

# What a record of the store can hold (writers chose its names): every string one line, without
# control, escape or bidi characters, before it is laid out for a terminal.
_LONG = 100_000


def clean(obj: object) -> object:
    if isinstance(obj, str):
        return one_line(obj, _LONG)
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean(v) for v in obj]
    return obj


def short(run_id: str) -> str:
    return run_id[:8]


def shorts(run_ids: Iterable[str]) -> dict[str, str]:
    """Each id as a listing shows it: its 8 first characters, or the whole id where another listed
    run shares them (a writer chooses its run's id: `show` would find both, ambiguous)."""
    ids = list(run_ids)
    taken = Counter(short(rid) for rid in ids)
    return {rid: rid if taken[short(rid)] > 1 else short(rid) for rid in ids}


def top_tool_text(top: dict | None) -> str:
    if not top:
        return "-"
    err = f" {top['errors']}err" if top["errors"] else ""
    return f"{top['name']}×{top['calls']}{err}"


def cut(text: str, width: int) -> str:
    """`text` in at most `width` characters; a cut one ends in "…", so it never reads as whole."""
    return text if len(text) <= width else text[: width - 1] + "…"


def runs_table(records: list[dict]) -> str:
    records = clean(records)  # type: ignore[assignment]
    if not records:
        return "no runs"
    reason_w = max(6, min(17, max(len(r["stop_reason"] or "-") for r in records)))
    lines = [f"{'RUN':8} {'AGENT':14} {'STATUS':9} {'REASON':{reason_w}} {'STEP':>4} {'CALL':>4} {'EUR':>6} "
             f"{'DURATION':>8} TOP TOOL"]
    shown = shorts(r["id"] for r in records)
    for r in records:
        lines.append(
            f"{shown[r['id']]:8} {cut(r['agent'], 14):14} {r['status']:9} {cut(r['stop_reason'] or '-', reason_w):{reason_w}} "
            f"{r['steps']:>4} {r['tool_calls']:>4} {r['cost_eur']:>6.2f} {duration(r['duration_s']):>8} "
            f"{cut(top_tool_text(r['top_tool']), 18)}"
        )
    return "\n".join(lines)


def _paused_line(r: dict) -> str:
    # The whole id in a command (watchdog.core.text.command_id): 8 characters may name two runs.
    rid = command_id(r["id"]) or "RUN"
    return (f"  paused      since {r['paused_at'] or '-'}: agent-watchdog resume {rid} "
            f"--add-... or agent-watchdog kill {rid}")


def run_detail(r: dict) -> str:
    r = clean(r)  # type: ignore[assignment]
    b = r["budgets"]
    used = Totals(steps=r["steps"], tool_calls=r["tool_calls"], cost_eur=r["cost_eur"],
                  tokens=(r.get("tokens_in") or 0) + (r.get("tokens_out") or 0), age_s=r["duration_s"])
    lines = [
        f"run {r['id']}  agent {r['agent']}",
        f"  status      {r['status']}" + (f"  ({r['stop_reason']}: {r['stop_detail']})" if r["stop_reason"] else
                                         (f"  ({r['stop_detail']})" if r.get("stop_detail") else "")),
        f"  where       {r['host']} pid {r['pid']}  kill_mode {r['kill_mode']}"
        + (f"  parent {short(r['parent_id'])}" if r.get("parent_id") else ""),
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
            if r.get("cost_unpriced_tokens"):
                line += f"  + {r['cost_unpriced_tokens']} tokens UNPRICED (not in the cost)"
        lines.append(line)
    if r.get("progress"):
        lines.append(f"  progress    {r['progress']}")
    if r["status"] == "paused":
        lines.append(_paused_line(r))
    if r.get("partial"):
        at = f"stopped at {r['stop_reason']} " if r.get("stop_reason") and r["status"] != "completed" else ""
        lines.append(f"  partial     {at}with a partial answer: {' '.join(r['partial'].split())[:200]}")
    if r.get("children"):
        lines.append("  children")
        for c in r["children"]:
            outcome = c["status"] + (f" ({c['stop_reason']})" if c["stop_reason"] else "")
            lines.append(f"    {short(c['id'])} {c['agent'][:16]:16} {outcome:26} {c['steps']:>4} steps "
                         f"{c['tool_calls']:>4} calls {c['cost_eur']:.4f} EUR")
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
    e = clean(e)  # type: ignore[assignment]
    t = e["at"][11:19]
    if e["kind"] == "tool":
        status = "ok" if e["ok"] else f"ERR {error_text(e['error_class'], e['error_msg'])}"
        return f"#{e['seq']:<4} {t} tool {e['tool']} [{(e['args_hash'] or '')[:8]}] {status}"[:110]
    if e["kind"] == "step":
        cost = "unpriced" if e["cost_eur"] is None else f"{e['cost_eur']:.4f} EUR"
        return f"#{e['seq']:<4} {t} step {e['model'] or '-'} {e['tokens_in']}→{e['tokens_out']} tok {cost}"
    return f"#{e['seq']:<4} {t} heartbeat {e['progress'] or ''}"[:110]


def error_text(error_class: str | None, error_msg: str | None) -> str:
    """`Class: message`, once: a message that already starts with its class (ToolUnavailable's
    does, it is worded for the model) is not prefixed again."""
    msg = error_msg or ""
    if not error_class or msg.startswith(f"{error_class}:") or msg == error_class:
        return msg or (error_class or "error")
    return f"{error_class}: {msg}" if msg else error_class


def circuit_line(r: dict, open_until, now) -> str:
    """One line of `circuits`: an open circuit whose time is up says so (the next call is its
    probe) instead of "open until" a time already past."""
    r = clean(r)  # type: ignore[assignment]
    state = r["state"]
    if state == "open" and open_until is not None:
        if open_until > now:
            state = f"open until {open_until.strftime('%H:%M:%S')} UTC"
        else:
            state = f"open, expired {open_until.strftime('%H:%M:%S')} UTC (the next call is the probe)"
    line = f"{cut(r['tool'], 30):30} {state}  {r['errors_in_window']} errors"
    return cut(line + (f"  {r['last_error']}" if r["last_error"] else ""), 120)


