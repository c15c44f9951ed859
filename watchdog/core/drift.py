"""Drift alarms: per agent, the last `[drift] window_s` against the trailing `baseline_days`.

Pure: the tick passes the two aggregates in (summed from the rolled-up per-agent
buckets, watchdog.store.ledger), this says what grew by `factor` and writes the line:

  "agent «support-bot»: tool calls/run 3.1 → 28.0 (×9.0) in the last hour; top tool «search.read» ×412; 61 runs"
"""

from __future__ import annotations

from dataclasses import dataclass

from watchdog.core.text import marked


@dataclass(frozen=True)
class DriftConfig:
    window_s: float = 3600.0
    baseline_days: float = 7.0
    factor: float = 3.0  # 0 = no drift alarms
    min_runs: int = 10


@dataclass(frozen=True)
class Totals:
    """Sums over ended runs of one agent in some span (a window or a baseline)."""

    runs: int = 0
    stopped: int = 0
    steps: int = 0
    tool_calls: int = 0
    cost_eur: float = 0.0

    def __add__(self, other: "Totals") -> "Totals":
        return Totals(self.runs + other.runs, self.stopped + other.stopped, self.steps + other.steps,
                      self.tool_calls + other.tool_calls, self.cost_eur + other.cost_eur)

    def __sub__(self, other: "Totals") -> "Totals":
        return Totals(self.runs - other.runs, self.stopped - other.stopped, self.steps - other.steps,
                      self.tool_calls - other.tool_calls, self.cost_eur - other.cost_eur)


# metric name, what is summed, how a per-run value is printed
METRICS = (
    ("tool calls/run", "tool_calls", lambda v: f"{v:.1f}"),
    ("cost/run", "cost_eur", lambda v: f"{v:.{2 if v >= 1 else 4}f} EUR"),
    ("steps/run", "steps", lambda v: f"{v:.1f}"),
    ("runs stopped", "stopped", lambda v: f"{100 * v:.0f}%"),
)


@dataclass(frozen=True)
class DriftVerdict:
    metric: str
    baseline: float  # per run
    window: float  # per run
    ratio: float
    shown_baseline: str
    shown_window: str


def evaluate(window: Totals, baseline: Totals, cfg: DriftConfig) -> list[DriftVerdict]:
    """Every metric that grew by at least `factor`, the largest growth first.

    Nothing without `min_runs` runs in the window and as many in the baseline (no
    baseline yet is no drift). A metric absent from the baseline (0 per run) is
    compared with one occurrence over the whole baseline, so it can still drift.
    """
    if cfg.factor <= 0 or window.runs < cfg.min_runs or baseline.runs < max(1, cfg.min_runs):
        return []
    out = []
    for name, attr, show in METRICS:
        w = getattr(window, attr) / window.runs
        b = getattr(baseline, attr) / baseline.runs
        floor = (1.0 / baseline.runs) if attr != "cost_eur" else 0.0
        ref = max(b, floor)
        if ref <= 0 or w <= 0:
            continue
        ratio = w / ref
        if ratio >= cfg.factor:
            out.append(DriftVerdict(name, b, w, ratio, show(b), show(w)))
    return sorted(out, key=lambda v: -v.ratio)


def window_phrase(window_s: float) -> str:
    if window_s == 3600:
        return "the last hour"
    if window_s % 3600 == 0:
        return f"the last {window_s / 3600:g} hours"
    if window_s % 60 == 0:
        return f"the last {window_s / 60:g} min"
    return f"the last {window_s:g} s"


def line(agent: str, v: DriftVerdict, window_s: float, top_tool: tuple[str, int] | None, runs: int) -> str:
    top = f"; top tool {marked(top_tool[0])} ×{top_tool[1]}" if top_tool else ""
    return (f"agent {marked(agent)}: {v.metric} {v.shown_baseline} → {v.shown_window} (×{v.ratio:.1f}) in {window_phrase(window_s)}"
            f"{top}; {runs} runs")


def alert(agent: str, verdicts: list[DriftVerdict], window: Totals, baseline: Totals, cfg: DriftConfig,
          top_tool: tuple[str, int] | None) -> tuple[str, str]:
    """Title (the largest drift) and body (every drifting metric, then both spans' numbers)."""
    first = line(agent, verdicts[0], cfg.window_s, top_tool, window.runs)
    v = verdicts[0]
    title = f"agent-watchdog: drift of an agent: {v.metric} ×{v.ratio:.1f} in {window_phrase(cfg.window_s)}"
    body = [first]
    body += [line(agent, v, cfg.window_s, top_tool, window.runs) for v in verdicts[1:]]
    body += [
        "",
        f"window   {window.runs} runs in {window_phrase(cfg.window_s)}: {window.tool_calls} tool calls, "
        f"{window.steps} steps, {window.cost_eur:.2f} EUR, {window.stopped} stopped",
        f"baseline {baseline.runs} runs over the {cfg.baseline_days:g} days before: {baseline.tool_calls} tool calls, "
        f"{baseline.steps} steps, {baseline.cost_eur:.2f} EUR, {baseline.stopped} stopped",
        f"(alarm at ×{cfg.factor:g} with at least {cfg.min_runs} runs in the window; [drift] in the config)",
        "",
        "agent-watchdog runs --all --agent NAME   # NAME: the agent above",
    ]
    return title, "\n".join(body)
