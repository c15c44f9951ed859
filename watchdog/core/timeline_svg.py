"""The tool-call timeline of one run as a standalone SVG (pure: facts in, text out).

One renderer for `postmortem --output DIR` and the web view's run page. Each tool is a lane
(the busiest first); each call a mark at its time since the run started, a red cross when it
failed; a band behind calls repeating the same tool with the same arguments in a row (the
loop signature); the run's cumulative cost as a line under the lanes. Every text comes from
a writer (tool names), so every text is escaped: the SVG is safe inline in HTML and as a file.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from html import escape

MAX_LANES = 12  # more tools share one lane, "(other tools)": the chart stays readable
MAX_MARKS = 4000  # a huge run is drawn from its first calls only, and says so
WIDTH_PX = 860
LANE_PX = 22
LABEL_PX = 170
COST_PX = 70
OTHER = "(other tools)"
STACK_OFFSETS_PX = (0, -6, 6, -3, 3)


@dataclass(frozen=True)
class Call:
    at: dt.datetime
    tool: str
    ok: bool | None
    args_hash: str | None


@dataclass(frozen=True)
class Spend:
    at: dt.datetime
    cost_eur: float


def _x(t: dt.datetime, start: dt.datetime, span_s: float) -> float:
    return LABEL_PX + (WIDTH_PX - LABEL_PX - 20) * max(0.0, (t - start).total_seconds()) / span_s


def _esc(text: object) -> str:
    return escape(str(text), quote=True)


def _short(name: str, n: int = 24) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def repeat_runs(calls: list[Call], min_len: int = 2) -> list[tuple[int, int]]:
    """Index ranges [i, j] of consecutive calls with the same tool and arguments, at least min_len long."""
    out, i = [], 0
    while i < len(calls):
        j = i
        key = (calls[i].tool, calls[i].args_hash)
        while j + 1 < len(calls) and calls[i].args_hash is not None and (calls[j + 1].tool, calls[j + 1].args_hash) == key:
            j += 1
        if j - i + 1 >= min_len:
            out.append((i, j))
        i = j + 1
    return out


def render(calls: list[Call], spend: list[Spend], start: dt.datetime, end: dt.datetime, *, title: str = "") -> str:
    """The SVG document. `start`/`end`: the run's start and its end (or now)."""
    truncated = len(calls) > MAX_MARKS
    calls = sorted(calls, key=lambda c: c.at)[:MAX_MARKS]
    counts = Counter(c.tool for c in calls)
    lanes = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    if len(lanes) > MAX_LANES:
        lanes = lanes[: MAX_LANES - 1] + [OTHER]
    lane_of = {t: i for i, t in enumerate(lanes)}
    span_s = max(1.0, (end - start).total_seconds(), *((c.at - start).total_seconds() for c in calls))
    top = 34
    lanes_h = max(1, len(lanes)) * LANE_PX
    height = top + lanes_h + 30 + COST_PX + 34
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}" '
           f'viewBox="0 0 {WIDTH_PX} {height}" font-family="sans-serif" font-size="11" role="img">',
           f'<title>{_esc(title or "tool-call timeline")}</title>',
           f'<rect x="0" y="0" width="{WIDTH_PX}" height="{height}" fill="#ffffff"/>',
           f'<text x="8" y="18" font-size="13" font-weight="bold">{_esc(title or "Tool calls over time")}</text>',
           f'<text x="{WIDTH_PX - 8}" y="18" text-anchor="end" fill="#555">{len(calls)} calls, '
           f'{sum(1 for c in calls if c.ok is False)} errors{" (first " + str(MAX_MARKS) + " shown)" if truncated else ""}'
           f'</text>']
    for i, tool in enumerate(lanes):
        y: float = top + i * LANE_PX
        fill = "#f4f6f8" if i % 2 == 0 else "#ffffff"
        n = counts[tool] if tool != OTHER else sum(v for k, v in counts.items() if k not in lane_of)
        out.append(f'<rect x="{LABEL_PX}" y="{y}" width="{WIDTH_PX - LABEL_PX - 20}" height="{LANE_PX}" fill="{fill}"/>')
        out.append(f'<text x="{LABEL_PX - 6}" y="{y + 15}" text-anchor="end"><title>{_esc(tool)}</title>'
                   f'{_esc(_short(tool))} ×{n}</text>')
    if not calls:
        out.append(f'<text x="{LABEL_PX + 10}" y="{top + 15}" fill="#555">no tool calls</text>')

    def lane_y(c: Call) -> float:
        return top + lane_of.get(c.tool, lane_of.get(OTHER, 0)) * LANE_PX + LANE_PX / 2

    for i, j in repeat_runs(calls):
        x0, x1 = _x(calls[i].at, start, span_s), _x(calls[j].at, start, span_s)
        y = lane_y(calls[i])
        out.append(f'<rect class="repeat" x="{x0 - 4:.1f}" y="{y - 9:.1f}" width="{x1 - x0 + 8:.1f}" height="18" '
                   f'rx="4" fill="#ffb74d" fill-opacity="0.55"><title>{j - i + 1} identical calls to '
                   f'{_esc(calls[i].tool)}</title></rect>')
    first_of: dict[tuple[str, str | None], int] = {}  # (tool, args hash) -> the call that first had them
    last_x: dict[float, float] = {}  # per lane: where its last mark went
    stack: dict[float, int] = {}
    for n, c in enumerate(calls):
        x, y = _x(c.at, start, span_s), lane_y(c)
        # Calls closer than a mark's width (a burst) are stacked in the lane instead of hidden under each other.
        stack[y] = stack.get(y, 0) + 1 if x - last_x.get(y, -1e9) < 4 else 0
        last_x[y] = x
        y += STACK_OFFSETS_PX[stack[y] % len(STACK_OFFSETS_PX)]
        key = (c.tool, c.args_hash)
        if c.args_hash is not None and key in first_of:  # the loop signature, even with other calls between
            out.append(f'<circle class="again" cx="{x:.1f}" cy="{y:.1f}" r="6.5" fill="none" stroke="#ef6c00" '
                       f'stroke-width="1.5"><title>same arguments as call {first_of[key] + 1}</title></circle>')
        first_of.setdefault(key, n)
        if c.ok is False:
            out.append(f'<path class="error" d="M{x - 4:.1f},{y - 4:.1f}L{x + 4:.1f},{y + 4:.1f}M{x - 4:.1f},{y + 4:.1f}'
                       f'L{x + 4:.1f},{y - 4:.1f}" stroke="#d32f2f" stroke-width="2"/>')
        else:
            out.append(f'<circle class="call" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="#1976d2"/>')
    # The time axis.
    axis_y = top + lanes_h + 14
    for k in range(6):
        at_s = span_s * k / 5
        x = LABEL_PX + (WIDTH_PX - LABEL_PX - 20) * k / 5
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis_y - 10}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y}" text-anchor="middle" fill="#555">{_seconds(at_s)}</text>')
    # Cumulative cost.
    base = axis_y + 16 + COST_PX
    total = 0.0
    points: list[tuple[float, float]] = [(LABEL_PX, base)]
    spends = sorted(spend, key=lambda s: s.at)
    peak = max(1e-9, sum(max(0.0, s.cost_eur) for s in spends))
    for s in spends:
        total += max(0.0, s.cost_eur)
        point = (_x(s.at, start, span_s), base - COST_PX * total / peak)
        if len(points) > 1 and point[0] - points[-1][0] < 0.5:  # same pixel column: keep its last value only
            points[-1] = point
        else:
            points.append(point)
    points.append((_x(end, start, span_s) if end >= start else LABEL_PX, points[-1][1]))
    out.append(f'<text x="{LABEL_PX - 6}" y="{base - COST_PX / 2:.0f}" text-anchor="end">cost (cumulative)</text>')
    out.append(f'<line x1="{LABEL_PX}" y1="{base}" x2="{WIDTH_PX - 20}" y2="{base}" stroke="#999"/>')
    out.append('<polyline class="cost" fill="none" stroke="#388e3c" stroke-width="2" points="'
               + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>')
    out.append(f'<text x="{WIDTH_PX - 20}" y="{base - COST_PX - 4}" text-anchor="end" fill="#388e3c">'
               f'{total:.4f} EUR</text>')
    out.append(f'<text x="8" y="{height - 8}" fill="#555">● call  ✕ error  ○ same arguments again  '
               f'▭ identical calls in a row;'
               f' time since the run started</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _seconds(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 120:
        return f"{s / 60:.1f} min"
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
