"""`agent-watchdog postmortem RUN_ID`: the facts from the store, the Markdown from watchdog.core.postmortem
(shared with the web view), the tool-call timeline from watchdog.core.timeline_svg."""

from __future__ import annotations

import datetime as dt
import os

from watchdog.core import timeline_svg
from watchdog.core.config import Config
from watchdog.core.text import run_ref
from watchdog.core.postmortem import file_stem, render as render_facts
from watchdog.store.viewer import postmortem_facts, timeline

TIMELINE_SUFFIX = "-timeline.svg"


def render(conn, run_id: str, config: Config, now: dt.datetime, *, timeline_file: str | None = None) -> str:
    return render_facts(postmortem_facts(conn, run_id, now), config, now, timeline_file=timeline_file)


def timeline_svg_of(conn, run_id: str, now: dt.datetime) -> str:
    from watchdog.store.views import load_run

    row = load_run(conn, run_id)
    calls, spend = timeline(conn, row.id)
    return timeline_svg.render(calls, spend, row.started_at, row.ended_at or now,
                               title=f"{row.agent} {run_ref(row.id)}: tool calls over time")


def write_report(conn, run_id: str, config: Config, now: dt.datetime, folder: str) -> tuple[str, str]:
    """The Markdown and its SVG timeline, side by side in `folder` (made if missing)."""
    os.makedirs(folder, exist_ok=True)
    svg_name = f"{file_stem(run_id)}{TIMELINE_SUFFIX}"
    md_path = os.path.join(folder, f"{file_stem(run_id)}.md")
    svg_path = os.path.join(folder, svg_name)
    with open(svg_path, "w", encoding="utf-8") as fh:
        fh.write(timeline_svg_of(conn, run_id, now))
    with open(md_path, "w", encoding="utf-8") as fh:
        fh.write(render(conn, run_id, config, now, timeline_file=svg_name))
    return md_path, svg_path
