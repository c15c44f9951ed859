"""`agent-watchdog budgets`: each agent's and label set's period spend against its budgets."""

from __future__ import annotations

import datetime as dt

import click

from watchdog.cli.app import emit_json, fail_cleanly, main, pass_app, shared_options
from watchdog.store.engine import read_connection
from watchdog.core.periods import utcnow
from watchdog.core.text import terminal_safe

# The daemon's last published period state: shared with the web view (watchdog.store.viewer).
from watchdog.store.viewer import published_state  # noqa: E402,F401


def table(states, now: dt.datetime, tz) -> str:
    from watchdog.core import messages

    if not states:
        return "no period budgets and no spend yet"
    lines = [f"{'SCOPE':16} {'PERIOD':6} {'SPENT EUR':>9} {'BUDGET':>8} {'USE':>4} {'EUR/MIN':>8} {'RUNS OUT':>15} STATE"]
    for s in states:
        use = f"{100 * s.spent_eur / s.budget_eur:.0f}%" if s.budget_eur else "-"
        rate = f"{s.rate_eur_per_min:.3f}" if s.rate_eur_per_min else "-"
        out = "spent" if s.closed else messages.when(s.runs_out_at, now, tz)[5:] if (
            s.runs_out_at and s.runs_out_at.astimezone(tz).date() != now.astimezone(tz).date()) else (
            messages.when(s.runs_out_at, now, tz) if s.runs_out_at else "-")
        state = "CLOSED" if s.closed else "WARN" if s.warned else "ok" if s.budget_eur else "-"
        name = s.scope.name if s.scope.kind == "agent" else f"[{s.scope.name}]"
        lines.append(f"{name[:16]:16} {s.period:6} {s.spent_eur:>9.2f} "
                     f"{(f'{s.budget_eur:.2f}' if s.budget_eur else '-'):>8} {use:>4} {rate:>8} {out:>15} {state}")
    return "\n".join(lines)


@main.command("budgets")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
@shared_options
@pass_app
@fail_cleanly
def budgets_cmd(app, as_json):
    """Each agent's and label budget's spend today and this month, against its budgets."""
    from watchdog.core.periods import zone
    from watchdog.store.ledger import period_report

    now = utcnow()
    with read_connection(app.engine) as conn:
        config = app.judge_by(conn)
        states = period_report(conn, config, now, published_state(conn, now))
    if as_json:
        emit_json([s.to_json() for s in states])
    else:
        click.echo(terminal_safe(table(states, now, zone(config.pricing.budget_tz))))  # writers chose the names
