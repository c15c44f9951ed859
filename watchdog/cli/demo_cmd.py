"""`agent-watchdog demo`: no arguments, no setup; see watchdog/demo/."""

from __future__ import annotations

import sys

import click

from watchdog.cli.app import fail_cleanly, main, pass_app


@main.command("demo")
@click.option("--keep", metavar="DIR", type=click.Path(file_okay=False),
              help="Keep the database, config and logs in DIR (for `show` and `postmortem` afterwards).")
@click.option("--tick-s", type=click.FloatRange(0.1, 1.0), default=0.5, show_default=True,
              help="The daemon's tick (the demo's timings assume under a second).")
@pass_app
@fail_cleanly
def demo_cmd(app, keep, tick_s):
    """Watch the watchdog stop four runaway agents and leave two healthy ones alone (~15 s).

    Starts a real daemon and six real agent processes on a temporary SQLite
    store. Alerts are printed; with a config that has [alerts] urls (--config
    or $AGENT_WATCHDOG_CONFIG) the daemon sends them there too. Exits 0 only if
    every agent ended as expected.
    """
    from watchdog.demo.runner import run_demo

    # Only the user's alert URLs are taken from their config: the demo's budgets and store are its own.
    sys.exit(run_demo(keep, tick_s, app.config.alert_urls))
