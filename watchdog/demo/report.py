"""What the demo prints: the live feed read from the store, and the final table.

Everything here is read from the shared store (runs, interventions, alerts),
exactly what the daemon and the agents wrote: the demo process itself decides
nothing and stops nothing.
"""

from __future__ import annotations

import datetime as dt
import textwrap
from dataclasses import dataclass

from watchdog.core import lifecycle as lc
from watchdog.core.periods import utcnow
from watchdog.store import viewer as store
from watchdog.store.engine import Engine
from watchdog.store.rows import AlertRow, InterventionRow, RunRow
from watchdog.store.views import run_record
from watchdog.demo.agents import CIRCUIT, COOPERATIVE, GUARD, NONE, SIGKILL, SIGTERM, BEHAVIOURS

LABEL_W = 12
WIDTH = 100  # columns: every line the demo prints fits
# Lines are held this long before printing, so that rows committed a moment
# apart by different processes still print in timestamp order.
SETTLE_S = 0.35
# A run that ended with a stop the daemon has not recorded yet: its end line waits this long.
HOLD_END_S = 5.0
# Interventions the feed leaves out: the `ended` row is folded into the run's
# end line; a circuit's half-open probe is bookkeeping, not news.
QUIET_ACTIONS = {"ended", "circuit_half_open"}
ACTION_TEXT = {"sigterm": "SIGTERM", "sigkill": "SIGKILL", "not_signalled": "not signalled",
               "signal_refused": "signal refused", "stop_failed": "STOP FAILED", "lost": "lost",
               "rate_alarm": "rate alarm"}


class Feed:
    """Polls the store and prints one line per event that matters (plus each alert, Slack-style)."""

    def __init__(self, engine: Engine, names: dict[str, str], echo):
        self.engine = engine
        self.names = names  # run id -> agent
        self.t0: dt.datetime | None = None  # the first run's start: "+0.0s"
        self.echo = echo
        self.status: dict[str, str] = {}
        self.ended_how: dict[str, str] = {}  # run id -> the ladder's last word
        self.guarded: set[str] = set()  # runs stopped by their own in-process guard
        self.stop_seen: set[str] = set()  # runs whose stop's intervention was printed
        self.iv_at: dict[int, dt.datetime] = {}  # intervention id -> its time: where its alert prints
        self.iv_seen = 0
        self.alert_seen = 0
        self.pending: list[tuple] = []

    def poll(self, flush: bool = False) -> dict[str, RunRow]:
        """Read what is new, print what has settled; return the demo's run rows by id."""
        rows, ivs, als = store.news(self.engine, self.names, interventions_after=self.iv_seen,
                                    alerts_after=self.alert_seen)
        for i in ivs:
            self.iv_seen = i.id
            self._intervention(i)
        for a in als:
            self.alert_seen = a.id
            # Right under the intervention it reports (same transaction, same timestamp); the SDK's
            # guard-stop alert names no intervention: after those of its instant.
            at = self.iv_at.get(a.intervention_id, a.created_at) if a.intervention_id is not None else a.created_at
            self.pending.append(((at, 1, a.intervention_id or float("inf"), 1), self._alert(a)))
        if rows and self.t0 is None:
            self.t0 = min(r.started_at for r in rows.values())
        for rid, r in rows.items():
            self._run(r)
        self.pending.sort(key=lambda p: p[0])
        horizon = utcnow() - dt.timedelta(seconds=SETTLE_S)
        while self.pending and (flush or self.pending[0][0][0] <= horizon):
            self.echo(self.pending.pop(0)[1])
        return rows

    def _line(self, at: dt.datetime, label: str, text: str) -> str:
        since = (at - self.t0).total_seconds() if self.t0 else 0.0
        head = f"{since:+6.1f}s  {label[:LABEL_W]:{LABEL_W}} "
        # At most WIDTH columns (issue 19): a long detail goes on indented lines of its own.
        return "\n".join(textwrap.wrap(text, WIDTH, initial_indent=head,
                                        subsequent_indent=" " * (len(head) + 11), break_on_hyphens=False)
                         ) if len(head) + len(text) > WIDTH else head + text

    def _run(self, r: RunRow) -> None:
        before = self.status.get(r.id)
        if before is None:
            self.pending.append(((r.started_at, 0, 0, 0),
                                 self._line(r.started_at, r.agent, f"started    pid {r.pid}, run {r.id[:8]}")))
        if r.status in lc.END_STATUSES and before not in lc.END_STATUSES:
            at = r.ended_at or utcnow()
            if (r.stop_requested_at is not None and r.id not in self.stop_seen
                    and (utcnow() - at).total_seconds() < HOLD_END_S):
                return  # a stop the daemon hears after the end: its STOP line comes first

            self.pending.append(((at, 2, 0, 0), self._line(at, r.agent, self._end_text(r))))
        self.status[r.id] = r.status

    def _end_text(self, r: RunRow) -> str:
        counts = f"{_n(r.steps, 'step')}, {_n(r.tool_calls, 'tool call')}, {r.cost_eur:.4f} EUR"
        if r.status == lc.COMPLETED:
            return f"COMPLETED  {counts}"
        how = self.ended_how.get(r.id)
        if how is None and r.id in self.guarded:
            how = "the guard raised RunKilled in the agent, which left"
        elif how is None and r.stop_requested_at is not None:
            how = "it saw the stop on its next write and left"
        # The detail was on the STOP line already (every stop writes one, daemon or guard).
        why = r.stop_reason or "-"
        if r.stop_reason == lc.HEARTBEAT_TIMEOUT and r.progress:
            why += f" (last progress: {r.progress})"
        return f"{r.status.upper():10} {why} — {counts}" + (f"; {how}" if how else "")

    def _intervention(self, i: InterventionRow) -> None:
        rid = i.run_id or ""  # "": a circuit's intervention (no run)
        if i.action == "ended" and i.outcome is not None:
            self.ended_how[rid] = i.outcome
        if i.action in QUIET_ACTIONS:
            return
        label = self.names.get(rid, "?") if rid else (i.tool or "?")
        self.iv_at[i.id] = i.at
        if i.action in ("stop_requested", "guard_stop"):
            self.stop_seen.add(rid)
        if i.action == "stop_requested" and acknowledged(i):
            self.guarded.add(rid)  # the demo's agents: only their own guards ask for stops in the store
            text = f"STOP       by its own in-process guard — {i.reason}"
        elif i.action == "stop_requested":
            text = f"STOP       requested by the daemon — {i.reason}: {i.detail}"
        elif i.action == "guard_stop":
            self.guarded.add(rid)
            text = f"STOP       by its own in-process guard — {i.reason}: {i.detail}"
        elif i.action == "circuit_open":
            text = f"CIRCUIT    OPEN — {i.detail}; {i.outcome}"
        elif i.action == "circuit_closed":
            text = f"CIRCUIT    closed — {i.detail}"
        else:
            text = f"{ACTION_TEXT.get(i.action, i.action):10} {i.outcome or i.detail or ''}"
        self.pending.append(((i.at, 1, i.id, 0), self._line(i.at, label, text)))

    def _alert(self, a: AlertRow) -> str:
        pad = " " * 9
        lines = [ln for ln in textwrap.wrap(f"┌ ALERT  {a.title}", WIDTH - len(pad), subsequent_indent="│        ")]
        for ln in a.body.splitlines() or [""]:
            lines += textwrap.wrap(ln, WIDTH - len(pad) - 2, break_on_hyphens=False) or [""] if ln else [""]
        out = [f"{pad}{lines[0]}"] + [f"{pad}│ {ln}".rstrip() if not ln.startswith("│") else f"{pad}{ln}"
                                        for ln in lines[1:]]
        return "\n".join(out + [f"{pad}└"])


def acknowledged(i: InterventionRow | store.Action) -> bool:
    """A stop the daemon recorded but did not decide (watchdog.daemon.stops.acknowledge, ticker)."""
    return isinstance(i.outcome, str) and "not by this daemon" in i.outcome


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


# -- the final table ----------------------------------------------------------


@dataclass
class Outcome:
    agent: str
    run_id: str | None
    record: dict | None  # views.run_record, None if the run never registered
    defense: str
    circuit: bool

    def problems(self) -> list[str]:
        b = BEHAVIOURS[self.agent]
        want = f"{b.status} / {b.reason or '-'} / {b.defense}" + (f" + {CIRCUIT}" if b.circuit else "")
        if self.record is None:
            return [f"{self.agent}: never registered its run (see its log); expected {want}"]
        r = self.record
        got = f"{r['status']} / {r['stop_reason'] or '-'} / {self.defense}" + (f" + {CIRCUIT}" if self.circuit else "")
        ok = (r["status"], r["stop_reason"], self.defense) == (b.status, b.reason, b.defense) and (
            self.circuit or not b.circuit)
        return [] if ok else [f"{self.agent}: expected {want}, got {got}"]


def defense(status: str, actions: set[str]) -> str:
    """Which defense ended the run, from the interventions it received (the strongest wins)."""
    if status == lc.COMPLETED:
        return NONE
    for action, name in (("sigkill", SIGKILL), ("sigterm", SIGTERM), ("guard_stop", GUARD),
                         ("stop_requested", COOPERATIVE)):
        if action in actions:
            return name
    if status == lc.KILLED:
        return GUARD  # killed with no audit row at all: the SDK stopped itself (and could not say so)
    return f"none ({status})"


def outcomes(engine: Engine, config, names: dict[str, str]) -> list[Outcome]:
    now = utcnow()
    rows, stats, done = store.ending(engine, names)
    acts = [(a.run_id, "guard_stop" if a.action == "stop_requested" and acknowledged(a) else a.action, a.tool)
            for a in done]
    opened = {tool for rid, action, tool in acts if action == "circuit_open"}
    out = []
    for rid, agent in names.items():
        row = rows.get(rid)
        if row is None:
            out.append(Outcome(agent, rid, None, "-", False))
            continue
        actions = {action for r, action, _ in acts if r == rid}
        failing = {t.name for t in stats[rid] if t.errors}
        out.append(Outcome(agent, rid, run_record(row, stats[rid], config, now), defense(row.status, actions),
                           bool(failing & opened)))
    return out


def _to_stop(r: dict) -> str:
    """Seconds from the stop request (or, without one, from the start) to the end."""
    since, end = r["stop_requested_at"] or r["started_at"], r["ended_at"]
    if not end:
        return "-"
    return f"{(dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(since)).total_seconds():.1f}s"


# Short names of the defenses for the table (the live feed above it spells them out).
_SHORT_DEFENSE = {GUARD: "guard", COOPERATIVE: "cooperative", CIRCUIT: "circuit"}
TABLE_WIDTH = 100


def table(results: list[Outcome]) -> str:
    """The closing table, at most TABLE_WIDTH columns: one row per agent."""
    budget = next((o.record["budgets"]["max_cost_eur"] for o in results if o.record), None)
    rows = [("AGENT", "OUTCOME", "STOP REASON", "STEP", "CALL", "EUR", "STOPPED BY", "IN", "TOP TOOL")]
    for o in results:
        r = o.record
        if r is None:
            rows.append((o.agent, "never registered", *("-",) * 7))
            continue
        top = r["top_tool"]
        top_txt = f"{top['name']} ×{top['calls']}" + (f" {top['errors']}err" if top["errors"] else "") if top else "-"
        if r["stop_reason"] == lc.HEARTBEAT_TIMEOUT and (r["progress"] or "").startswith("calling "):
            top_txt += f"; hung in {r['progress'][8:]}"  # a call that never returned left no tool event
        defense = _SHORT_DEFENSE.get(o.defense, o.defense) + ("+circuit" if o.circuit else "")
        rows.append((o.agent, r["status"], r["stop_reason"] or "-", str(r["steps"]), str(r["tool_calls"]),
                     f"{r['cost_eur']:.3f}", defense, _to_stop(r), top_txt))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {3, 4, 5, 7}  # numbers
    tight = {4, 5}  # STEP CALL EUR: numbers side by side need one space
    lines = ["".join(("" if i == 0 else " " if i in tight else "  ") + (c.rjust(w) if i in right else c.ljust(w))
                     for i, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in rows]
    lines = [line if len(line) <= TABLE_WIDTH else line[: TABLE_WIDTH - 1] + "…" for line in lines]
    lines.insert(1, "-" * min(TABLE_WIDTH, max(len(line) for line in lines)))
    spent = f"EUR: spent (budget {budget:.2f} per run). " if budget is not None else ""
    lines.append(f"{spent}IN: from the stop request (daemon or guard) to the end,")
    lines.append("graces included; no request: from its start. guard: in-process guard; cooperative: daemon's stop")
    return "\n".join(lines)
