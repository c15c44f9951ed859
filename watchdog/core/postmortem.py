"""`agent-watchdog postmortem RUN_ID`: a short blameless postmortem in Markdown (pure: from the facts
watchdog.store.viewer.postmortem_facts reads; the CLI and the web view render the same text).

The template follows the incident article the project came from: what
happened, impact, probable cause (from the cause → log-signature table), what
worked and what did not, actions, and the chaos-test case that keeps this loop
from coming back.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from typing import Sequence

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets, effective_budgets
from watchdog.core.config import Config
from watchdog.core.text import NAME_CHARS, md_run_id, md_text, run_ref
from watchdog.core.postmortem_facts import AlertRow, CircuitRow, EventRow, InterventionRow, PostmortemFacts, RunRow

SCHEMA_RE = re.compile(r"schema|validat|invalid|malformed|required field|pydantic|jsondecode", re.I)
DOWN_RE = re.compile(r"\b5\d\d\b|internal server error|bad gateway|unavailable|timed? ?out|connection (refused|reset)", re.I)

CAUSES = {
    "schema": ("broken schema: the model keeps producing what the tool rejects",
               "validate the payload and give up after a bounded number of rejects; tell the model what is wrong"),
    "down": ("a tool that is down: the same tool keeps failing with server errors",
             "a per-tool circuit breaker (check [circuit] errors / window_s), and a fallback or an honest failure"),
    "stuck": ("stuck: identical calls repeated",
              "dedupe of identical read-only calls and a low max_identical_calls"),
    "insist": ('steps growing without convergence: an "insist" prompt or an impossible goal',
               "a low max_steps, and a prompt that admits failure (\"if you cannot, stop and report\")"),
    "hung": ("a hung tool or model call: no progress written",
             "timeouts on every tool and model call; heartbeats from long work"),
    "crash": ("the process died without ending the run", "find the crash in the agent's own logs; supervise it"),
    "manual": ("stopped by hand", "write down why the human had to step in, and which automatic defense should have"),
    # No row of the signature table matched: say so rather than name a cause the table denies.
    "unclassified": ("no loop signature of the table below: the run used up a budget in a way it does not describe",
                     "read the run's events (`agent-watchdog show RUN_ID --events 50`), then fit the budget to the "
                     "agent or add a guard for the pattern you find"),
}


def _ts(t: dt.datetime | None) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%H:%M:%S") if t else "-"


def signatures(row: RunRow, evs: Sequence[EventRow], budgets: Budgets) -> dict[str, bool]:
    """Which rows of the cause → log-signature table this run's log matches."""
    errors = [e for e in evs if e.kind == lc.EV_TOOL and e.ok is False]
    found = {"schema": False, "down": False}
    if errors:
        top_tool, n = Counter(e.tool for e in errors).most_common(1)[0]
        msgs = [f"{e.error_class} {e.error_msg}" for e in errors if e.tool == top_tool]
        found["schema"] = n >= 2 and sum(bool(SCHEMA_RE.search(m)) for m in msgs) * 2 >= len(msgs)
        # A call that failed fast on an open circuit is the same signature: the tool is down.
        found["down"] = n >= 2 and sum(bool(DOWN_RE.search(m)) or m.startswith("ToolUnavailable") for m in msgs) * 2 >= len(msgs)
    sigs = Counter((e.tool, e.args_hash) for e in evs if e.kind == lc.EV_TOOL)
    found["stuck"] = bool(sigs) and sigs.most_common(1)[0][1] >= min(budgets.max_identical_calls, 3)
    found["insist"] = row.steps >= budgets.max_steps or row.stop_reason in (lc.MAX_STEPS, lc.MAX_COST, lc.WALL_CLOCK)
    return found


def _cause(row: RunRow, sig: dict[str, bool]) -> str:
    if row.stop_reason == lc.MANUAL:
        return "manual"
    if row.stop_reason == lc.PROCESS_GONE:
        return "crash"
    if row.stop_reason == lc.HEARTBEAT_TIMEOUT:
        return "hung"
    for cause in ("schema", "down", "stuck", "insist"):  # the most specific signature names the cause
        if sig[cause]:
            return cause
    return "unclassified"


def _first_repeat(evs: Sequence[EventRow]) -> EventRow | None:
    seen: set[tuple[str | None, str | None]] = set()
    for e in evs:
        if e.kind != lc.EV_TOOL:
            continue
        key = (e.tool, e.args_hash)
        if key in seen:
            return e
        seen.add(key)
    return None


def file_stem(run_id: str) -> str:
    """The report's file name without its suffix: `postmortem-<the whole run id>`. The whole id, not
    its first 8 digits: a writer chooses its run's id, and a run sharing another's first 8 would
    overwrite that run's report. A character of a chosen id that could leave the folder, end the
    Markdown link to its timeline or a header's quoted file name reads `_`; bounded to 64."""
    return "postmortem-" + re.sub(r"[^0-9A-Za-z_-]", "_", run_id[:64])


def render(facts: PostmortemFacts, config: Config, now: dt.datetime, *, timeline_file: str | None = None) -> str:
    """The Markdown. `facts`: a watchdog.store.viewer.PostmortemFacts; `timeline_file`: the SVG
    timeline written beside the report, linked from it."""
    row, evs, ivs, circ, others, sent = facts.row, facts.events, facts.interventions, facts.circuit, \
        facts.others, facts.alerts
    budgets = effective_budgets(config.profile(row.agent), row)
    end = row.ended_at or now
    tools = Counter(e.tool for e in evs if e.kind == lc.EV_TOOL)
    errs = Counter(e.tool for e in evs if e.kind == lc.EV_TOOL and e.ok is False)
    top = tools.most_common(1)[0] if tools else None
    sig = signatures(row, evs, budgets)
    cause = _cause(row, sig)
    acted = _defense(row, ivs)

    # Every name and text a writer chose (or a store writer wrote) is md_text: it cannot add a
    # heading, a link, an image, HTML or a code fence to the file (watchdog.core.text).
    name, status = md_text(row.agent, NAME_CHARS), md_text(row.status, NAME_CHARS)
    out = [f"# Postmortem: {name} {run_ref(row.id)} — {md_text(row.stop_reason or row.status, NAME_CHARS)}", "",
           f"Run {md_run_id(row.id)} on {md_text(row.host, NAME_CHARS)} (pid {md_text(row.pid)}, kill_mode "
           f"{md_text(row.kill_mode, NAME_CHARS)}); status **{status}**.", "",
           "## What happened", "", f"- {_ts(row.started_at)} run started"]
    out += _happened(row, evs, circ, ivs)
    if timeline_file:
        out += ["", f"![Tool calls over time]({timeline_file})"]
    out += ["", f"Defense that acted: **{acted}**.", "", "## Impact", "",
            f"- steps {row.steps}/{budgets.max_steps}, tool calls {row.tool_calls}/{budgets.max_tool_calls} "
            f"({row.tool_errors} errors)",
            f"- tokens {row.tokens_in} in / {row.tokens_out} out; cost burned **{row.cost_eur:.2f} EUR** "
            f"(budget {budgets.max_cost_eur:.2f})",
            f"- duration {(end - row.started_at).total_seconds():.0f} s (budget {budgets.max_wall_s:g} s)",
            f"- top tool: {md_text(top[0], NAME_CHARS)} ×{top[1]} ({100 * top[1] // max(1, sum(tools.values()))}%), {errs[top[0]]} errors"
            if top else "- no tool calls",
            f"- other runs at the same time: {len(others)}; stopped among them: "
            f"{sum(1 for o in others if o.status in (lc.KILLED, lc.LOST, lc.STOPPING))}", ""]
    what, fix = CAUSES[cause]
    out += ["## Probable cause", "", f"{what}.", "", "| signature in the log | seen here |", "|---|---|",
            *(f"| {label} | {'**yes**' if sig[key] else 'no'} |" for key, label in (
                ("schema", "same tool, validation errors repeated"), ("down", "same tool, 5xx / timeouts repeated"),
                ("stuck", "same tool + same arguments repeated"), ("insist", "steps growing, no convergence"))),
            "",
            "## What worked and what did not", ""]
    out += _worked(row, ivs, circ, sent, budgets)
    out += ["", "## Actions", "", f"- {fix}.",
            "- add the case below to the chaos suite so this loop never comes back.", "",
            "## Chaos test to add", "", "```python", _chaos_case(row, cause, top, budgets), "```", ""]
    return "\n".join(out)


def _happened(row: RunRow, evs: Sequence[EventRow], circ: Sequence[CircuitRow], ivs: Sequence[InterventionRow]
              ) -> list[str]:
    """The timeline's lines after the start, each store text escaped (md_text)."""
    out: list[str] = []
    if _hung_in(row):
        out.append(f"- the run was stuck in a call to **{md_text(_hung_in(row), NAME_CHARS)}** "
                   f"({md_text(row.progress)})")
    rep = _first_repeat(evs)
    if rep is not None:
        out.append(f"- {_ts(rep.at)} first repeated call: {md_text(rep.tool, NAME_CHARS)} with identical arguments "
                   f"(event #{md_text(rep.seq)})")
    for c in circ:
        out.append(f"- {_ts(c.at)} circuit breaker: {md_text(c.action.replace('circuit_', ''), NAME_CHARS)} for "
                   f"{md_text(c.tool, NAME_CHARS)} — {md_text(c.detail or c.outcome)}")
    for i in ivs:
        detail = f" ({md_text(i.detail)})" if i.action == "stop_requested" else ""
        out.append(f"- {_ts(i.at)} {md_text(i.action, NAME_CHARS)}: {md_text(i.outcome)}{detail}")
    if row.ended_at:
        out.append(f"- {_ts(row.ended_at)} run ended: {md_text(row.status, NAME_CHARS)}"
                   + (f" ({md_text(row.stop_reason, NAME_CHARS)}: {md_text(row.stop_detail)})" if row.stop_reason else ""))
    return out


def _defense(row: RunRow, ivs: Sequence[InterventionRow]) -> str:
    actions = [i.action for i in ivs]
    if "sigkill" in actions:
        return "daemon: SIGKILL (the run ignored the cooperative stop and SIGTERM)"
    if "sigterm" in actions:
        return "daemon: SIGTERM after the cooperative stop"
    if "stop_requested" in actions:
        return "human: agent-watchdog kill" if row.stop_reason == lc.MANUAL else "daemon: cooperative stop"
    if "lost" in actions:
        return "daemon: process_gone (the process was already dead)"
    if row.status == lc.KILLED:
        return "in-process guard (the SDK refused the call that would exceed the budget)"
    return "none (the run ended by itself)"


def _worked(row: RunRow, ivs: Sequence[InterventionRow], circ: Sequence[CircuitRow], sent: Sequence[AlertRow],
            budgets: Budgets) -> list[str]:
    acts = {i.action: i for i in ivs}
    lines = []
    guard = row.status == lc.KILLED and "stop_requested" not in acts
    lines.append(f"- in-process guards: {'tripped first' if guard else 'did not stop it (off, or not the limit hit)'}")
    if "stop_requested" in acts:
        lines.append(f"- daemon: stop requested at {_ts(acts['stop_requested'].at)} "
                     f"({(acts['stop_requested'].at - row.started_at).total_seconds():.0f} s after the start)")
    if "sigterm" in acts:
        lines.append(f"- SIGTERM: {'ignored — SIGKILL was needed' if 'sigkill' in acts else 'the process exited'}")
    bad = acts.get("signal_refused") or acts.get("stop_failed") or acts.get("not_signalled")
    if bad is not None:
        lines.append(f"- **did not work**: {md_text(bad.action, NAME_CHARS)}: {md_text(bad.outcome)}")
    opened = [c for c in circ if c.action == "circuit_open"]
    tools = ", ".join(md_text(t, NAME_CHARS) for t in sorted({str(c.tool) for c in opened}))
    lines.append(f"- circuit breaker: {'opened for ' + tools if opened else 'did not open'}")
    lines += _alert_lines(sent)
    if not sent:
        lines.append("- alert: none was sent for this run")
    return lines


def _alert_lines(sent: Sequence[AlertRow]) -> list[str]:
    lines: list[str] = []
    for a in sent:
        state = (f"dead letter since {_ts(a.dead_at)}, never retried ({md_text(a.last_error)})" if a.dead_at else
                 "logged only (no alert URLs configured)" if a.delivered_at and a.last_error else
                 f"delivered {_ts(a.delivered_at)}" if a.delivered_at else
                 f"NOT delivered yet ({md_text(a.attempts)} attempts: {md_text(a.last_error or 'pending')})")
        lines.append(f"- alert “{md_text(a.title, 300)}”: {state}")
    return lines


def _hung_in(row: RunRow) -> str | None:
    """The tool a hung run was stuck in, from the SDK's in-flight note ("in X since ...")."""
    m = re.match(r"in (\S+) since ", row.progress or "")
    return m.group(1) if m else None


def _chaos_case(row: RunRow, cause: str, top: tuple[str | None, int] | None, budgets: Budgets) -> str:
    """A pytest test that replays the pattern against a store of its own, with public names
    only (watchdog.Watchdog, RunKilled and the CLI's `db upgrade`): valid Python as printed."""
    tool = (cause == "hung" and _hung_in(row)) or (top[0] if top else "some_tool")
    name = re.sub(r"\W", "_", f"{row.agent}_{cause}").lower()
    calls = budgets.max_tool_calls + 1
    return "\n".join([
        "import subprocess",
        "",
        "import pytest",
        "",
        "from watchdog import RunKilled, Watchdog",
        "",
        "",
        f"def test_{name}_is_stopped(tmp_path):",
        f"    # {tool!r} misbehaved every time in {run_ref(row.id)} ({cause}): the guards must stop it",
        "    url = f\"sqlite:///{tmp_path / 'runs.db'}\"",
        "    subprocess.run([\"agent-watchdog\", \"--db\", url, \"db\", \"upgrade\"], check=True)",
        "    wd = Watchdog(url)",
        "",
        "    def tool(**args):",
        "        raise RuntimeError(\"the upstream answers 500\")",
        "",
        "    with pytest.raises(RunKilled) as stop:",
        f"        with wd.run(agent={row.agent!r}, max_steps={budgets.max_steps}, "
        f"max_tool_calls={budgets.max_tool_calls}) as run:",
        f"            for _ in range({calls}):",
        "                run.step(model=\"gpt-x\", tokens_in=200, tokens_out=20, cost_eur=0.001)",
        "                try:",
        f"                    run.tool_call({tool!r}, {{\"same\": \"arguments\"}}, tool)",
        "                except RuntimeError:",
        "                    pass  # the agent retries, as in the incident",
        "    assert stop.value.reason in (\"loop_detected\", \"max_tool_calls\", \"max_steps\")",
        "    wd.close()",
    ])
