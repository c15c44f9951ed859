"""HTML building blocks: escaping, the page frame, budget bars, tables.

Every text that comes from the store goes through `esc` (agent, tool and host names, labels,
stop details, actors are a writer's text): never concatenate a store value unescaped.
"""

from __future__ import annotations

import datetime as dt
from html import escape
from typing import Any, Iterable
from urllib.parse import quote

NAV = (("/", "Runs"), ("/budgets", "Budgets"))


def esc(value: Any) -> str:
    return escape("-" if value is None else str(value), quote=True)


def href(path: str, **query: Any) -> str:
    """A link with its query string (values percent-encoded), escaped for an attribute."""
    q = "&".join(f"{quote(str(k))}={quote(str(v), safe='')}" for k, v in query.items() if v not in (None, ""))
    return esc(path + ("?" + q if q else ""))


def run_href(run_id: str, suffix: str = "") -> str:
    return esc(f"/runs/{quote(run_id, safe='')}{suffix}")


def when(iso: str | None) -> str:
    """An ISO timestamp of a record, shortened to what a person reads (UTC)."""
    if not iso:
        return "-"
    try:
        t = dt.datetime.fromisoformat(iso).astimezone(dt.timezone.utc)
    except ValueError:
        return esc(iso)
    return t.strftime("%Y-%m-%d %H:%M:%S")


def page(title: str, body: str, *, api: str | None = None, refresh_s: float = 5.0) -> str:
    """A whole page. `api`: the JSON the refresh script polls (it sets text only, with textContent)."""
    data = f' data-api="{esc(api)}" data-refresh-s="{refresh_s:g}"' if api else ""
    nav = " ".join(f'<a href="{esc(p)}">{esc(n)}</a>' for p, n in NAV)
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)} · agent-watchdog</title>"
            '<link rel="stylesheet" href="/static/style.css">'
            '<script src="/static/refresh.js" defer></script></head>'
            f"<body{data}><header><strong>agent-watchdog</strong> {nav}"
            '<span class="refreshed" id="refreshed"></span></header>'
            f"<main>{body}</main></body></html>\n")


def number(value: float) -> str:
    """12, 2,000,000, 0.25: integers with thousands separators, others as short as exact."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def closeness_colour(frac: float) -> str:
    """Green far from the budget, amber from 60 %, red from 85 %, dark red at or past it."""
    if frac >= 1.0:
        return "#b71c1c"
    if frac >= 0.85:
        return "#e53935"
    if frac >= 0.6:
        return "#fb8c00"
    return "#43a047"


def bar(used: float, budget: float | None, *, text: str | None = None, width_px: int = 90) -> str:
    """A budget bar (inline SVG: no style attribute, so the CSP can forbid inline styles) and its numbers."""
    if not budget or budget <= 0:
        return f'<span class="num">{esc(text if text is not None else used)}</span>'
    frac = max(0.0, used / budget)
    fill = min(1.0, frac) * width_px
    label = text if text is not None else f"{number(used)}/{number(budget)}"
    return (f'<span class="bar" title="{esc(f"{100 * frac:.0f}% of the budget")}">'
            f'<svg width="{width_px}" height="10" aria-hidden="true"><rect width="{width_px}" height="10" fill="#e0e0e0"/>'
            f'<rect class="fill" width="{fill:.1f}" height="10" fill="{closeness_colour(frac)}"/></svg> '
            f'<span class="num">{esc(label)}</span></span>')


def table(headers: Iterable[str], rows: Iterable[str], *, empty: str = "none", cls: str = "") -> str:
    rows = list(rows)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    if not rows:
        return f'<p class="empty">{esc(empty)}</p>'
    return f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def status_badge(status: str | None) -> str:
    return f'<span class="status status-{esc(status)}" data-k="status">{esc(status)}</span>'
