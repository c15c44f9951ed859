"""`agent-watchdog resume RUN --add-steps N ...`: answer a paused run with more budget.

The `--add-...` options are made from the budget registry (watchdog.core.budgets: each budget
with an `add_option`), so a budget that can pause appears here without an edit of the CLI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from watchdog.cli.app import fail_cleanly, main, pass_app, shared_options
from watchdog.core.budgets import PAUSABLE, Budget
from watchdog.core.periods import utcnow

F = TypeVar("F", bound=Callable[..., Any])


def add_option_help(budget: Budget) -> str:
    """ "Raise the run's max_steps by N." (X for money, N seconds for time)"""
    amount = "X" if budget.unit == "EUR" else "N seconds" if budget.unit == "s" else "N"
    return f"Raise the run's {budget.key} by {amount}."


def add_options(budgets: Iterable[Budget] = PAUSABLE) -> Callable[[F], F]:
    """One `--<add_option>` per budget, in the registry's order: a whole number >= 1 for a
    counted budget, a number > 0 otherwise."""

    def decorate(fn: F) -> F:
        for b in reversed(tuple(budgets)):  # the last decorator applied is listed first
            kind = click.IntRange(min=1) if b.integer else click.FloatRange(min=0, min_open=True)
            fn = click.option(f"--{b.add_option}", type=kind, help=add_option_help(b))(fn)
        return fn

    return decorate


@main.command("resume")
@click.argument("run_id")
@add_options()
@shared_options
@pass_app
@fail_cleanly
def resume_cmd(app, run_id, **adds):
    """Let a paused run go on, with its budgets raised by the given amounts (audited, with who ran it).

    The time it spent paused never counts against its max_wall_s. `agent-watchdog kill RUN` stops it instead.
    """
    from watchdog.core.policies import Grant
    from watchdog.core.budgets import effective_budgets
    from watchdog.errors import StoreError
    from watchdog.daemon.stops.stopping import facts
    from watchdog.store.pause import operator, resume
    from watchdog.store.views import load_run, resolve_run_id, tool_stats

    grant = Grant.from_options(**adds)
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
        from watchdog.store.alerts import seal_grant

        sealer = _operator_sealer(app)
        if sealer is not None:
            seal_grant(conn, rid, sealer)
    click.echo(f"resumed {row.agent} run {rid[:8]} ({row.stop_reason}): {granted}; "
               "it goes on at its next status read (within a second)")
