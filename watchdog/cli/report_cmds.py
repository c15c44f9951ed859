"""CLI commands for people at 3 a.m.: top (live view) and postmortem (Markdown report)."""

from __future__ import annotations

import time

import click

from watchdog.cli.app import fail_cleanly, main, pass_app, shared_options
from watchdog.core.periods import utcnow
from watchdog.core.text import terminal_safe


@main.command("top")
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts).")
@click.option("--interval", "interval_s", type=click.FloatRange(0.1, 3600), default=None,
              help="Refresh period in seconds (default: the daemon's tick_s).")
@shared_options
@pass_app
@fail_cleanly
def top_cmd(app, once, interval_s):
    """Live view of the active runs, closest to a budget first (80 columns)."""
    from watchdog.cli import top
    from watchdog.store.viewer import published_state
    from watchdog.core.periods import zone
    from watchdog.store.ledger import period_report
    from watchdog.store.settings import banner

    interval_s = interval_s or app.config.daemon.tick_s
    while True:
        now = utcnow()
        with app.reader() as conn:
            profiles = app.judge_by(conn)
            periods = period_report(conn, profiles, now, published_state(conn, now))
            # Writers chose the agents' and tools' names: no escape sequence of theirs reaches the terminal.
            text = terminal_safe(top.frame(top.rows(conn, profiles, now), now, periods=periods,
                                           tz=zone(profiles.pricing.budget_tz)))
            warning = banner(conn)  # issue 36: on stderr (the frame's 80 columns stay the frame's)
        if once:
            if warning:
                click.echo(warning, err=True)
            click.echo(text)
            return
        click.clear()
        if warning:
            click.echo(warning, err=True)  # above the frame, as its first line on the terminal
        click.echo(text + "\n\n(ctrl-c to quit)")
        try:
            time.sleep(interval_s)
        except KeyboardInterrupt:
            return


@main.command("postmortem")
@click.argument("run_id")
@click.option("--output", "-o", type=click.Path(writable=True),
              help="Write the report and its SVG tool-call timeline into DIR (a path ending in .md: that file, "
                   "the SVG beside it).")
@shared_options
@pass_app
@fail_cleanly
def postmortem_cmd(app, run_id, output):
    """A Markdown postmortem of one run: what happened, impact, probable cause, actions, chaos test."""
    import os

    from watchdog.cli import postmortem
    from watchdog.store.views import resolve_run_id

    now = utcnow()
    with app.reader() as conn:
        rid = resolve_run_id(conn, run_id)
        if not output:
            click.echo(terminal_safe(postmortem.render(conn, rid, app.judge_by(conn), now)))
            return
        if output.endswith(".md") or os.path.isfile(output):  # a file named, as before: the SVG beside it
            folder, name = os.path.split(os.path.abspath(output))
            svg_name = os.path.splitext(name)[0] + postmortem.TIMELINE_SUFFIX
            svg = os.path.join(folder, svg_name)
            with open(svg, "w", encoding="utf-8") as fh:
                fh.write(postmortem.timeline_svg_of(conn, rid, now))
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(postmortem.render(conn, rid, app.judge_by(conn), now, timeline_file=svg_name))
            md = output
        else:
            md, svg = postmortem.write_report(conn, rid, app.judge_by(conn), now, output)
    click.echo(f"postmortem written to {md} (timeline: {svg})")
