"""`agent-watchdog resume RUN --add-steps N ...`: answer a paused run with more budget."""

from __future__ import annotations

import click

from watchdog.cli.app import fail_cleanly, main, pass_app, shared_options
from watchdog.core.clock import utcnow


@main.command("resume")
@click.argument("run_id")
@click.option("--add-steps", type=click.IntRange(min=1), help="Raise the run's max_steps by N.")
@click.option("--add-tool-calls", type=click.IntRange(min=1), help="Raise the run's max_tool_calls by N.")
@click.option("--add-eur", type=click.FloatRange(min=0, min_open=True), help="Raise the run's max_cost_eur by X.")
@click.option("--add-s", type=click.FloatRange(min=0, min_open=True), help="Raise the run's max_wall_s by N seconds.")
@shared_options
@pass_app
@fail_cleanly
def resume_cmd(app, run_id, add_steps, add_tool_calls, add_eur, add_s):
    """Let a paused run go on, with its budgets raised by the given amounts (audited, with who ran it).

    The time it spent paused never counts against its max_wall_s. `agent-watchdog kill RUN` stops it instead.
    """
    from watchdog.core.pause import Grant
    from watchdog.core.budgets import effective_budgets
    from watchdog.errors import StoreError
    from watchdog.store.actions import facts
    from watchdog.store.pause import operator, resume
    from watchdog.store.views import load_run, resolve_run_id, tool_stats

    grant = Grant.from_options(add_steps=add_steps, add_tool_calls=add_tool_calls, add_eur=add_eur, add_s=add_s)
    now = utcnow()
    with app.engine.begin() as conn:
        rid = resolve_run_id(conn, run_id)
        row = load_run(conn, rid)
        stats = tool_stats(conn, [rid])[rid]
        top = (stats[0].name, stats[0].calls, stats[0].errors) if stats else None
        budgets = effective_budgets(app.judge_by(conn).profile(row.agent), row)
        try:
            granted = resume(conn, row, grant, now=now, by=operator(), budgets=budgets,
                             run_facts=facts(row, top, None, now))
        except ValueError as exc:
            raise StoreError(str(exc)) from None
        # issue 20: sealed with the daemon's key (root or its user), the raise may pass the
        # profile; anyone else's resume is a row the daemon clamps to the profile.
        from watchdog.cli.daemon_cmds import _operator_sealer
        from watchdog.store.trust_rows import seal_grant

        sealer = _operator_sealer(app)
        if sealer is not None:
            seal_grant(conn, rid, sealer)
    click.echo(f"resumed {row.agent} run {rid[:8]} ({row.stop_reason}): {granted}; "
               "it goes on at its next status read (within a second)")
