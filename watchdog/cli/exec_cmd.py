"""`agent-watchdog exec`: any command as one watched run (watchdog.gateways.exec does the work).

Thin: parse, resolve the store, the config and the socket, hand over. Every failure of exec
itself, a bad option included, exits 125 (timeout(1)'s convention), never click's 2.
"""

from __future__ import annotations

import os
import sys

import click

from watchdog.cli.app import App, main, shared_options
from watchdog.core import lifecycle as lc
from watchdog.core import paths

EXIT_FAILED = 125


class _ExecCommand(click.Command):
    """A bad option is exec's own failure: 125, so a caller can tell it from the command's 2."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            exc.exit_code = EXIT_FAILED  # type: ignore[misc]  # click reads it per instance; typed a ClassVar
            raise


def _labels(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected k=v, got {v!r}", param_hint="--label")
        out[key.strip()] = value
    return out


def _socket(app: App) -> str:
    """$AGENT_WATCHDOG_SOCKET, else the config's [daemon] socket where one is listening, else
    the places an agent looks (watchdog.core.paths.agent_socket)."""
    if paths.ENV_SOCKET in os.environ:
        return os.environ[paths.ENV_SOCKET]
    if app.config_path:
        configured = app.config.daemon.socket
        if configured and os.path.exists(configured):
            return configured
    return paths.agent_socket(os.environ, os.path.expanduser("~"))


@main.command("exec", cls=_ExecCommand, context_settings={"allow_interspersed_args": False})
@click.option("--agent", required=True, help="The agent's name (its profile's budgets apply).")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="A label of the run (repeatable).")
@click.option("--max-steps", type=int, help="Lower the profile's max_steps for this run.")
@click.option("--max-tool-calls", type=int, help="Lower the profile's max_tool_calls for this run.")
@click.option("--max-cost-eur", type=float, help="Lower the profile's max_cost_eur for this run.")
@click.option("--max-wall-s", type=float, help="Lower the profile's max_wall_s for this run.")
@click.option("--kill-mode", type=click.Choice([lc.TREE.value, lc.CGROUP.value]), default=None,
              help="tree: exec holds the tree as its child subreaper; cgroup: a cgroup v2 of the run's own "
                   "(exit 125 if none can be made). Default: cgroup where possible, else tree.")
@click.option("-v", "--verbose", is_flag=True, help="Say on stderr how the run is held (cgroup or tree) and why.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@shared_options
@click.pass_context
def exec_cmd(ctx, agent, labels, max_steps, max_tool_calls, max_cost_eur, max_wall_s, kill_mode, verbose, command):
    """Run COMMAND as one watched run: agent-watchdog exec --agent NAME [options] -- COMMAND [ARGS...]

    Exit status as timeout(1): COMMAND's own, 128+N if it died of signal N, 124 when the
    watchdog stopped the run, 125 when exec failed, 126 / 127 when COMMAND cannot run / is
    not found."""
    from watchdog.gateways.exec import ExecOptions, run_exec
    from watchdog.gateways.exec.exits import say

    app = ctx.find_object(App)
    if app.config_path:  # the SDK exec opens the run with reads its profiles from there too
        os.environ["AGENT_WATCHDOG_CONFIG"] = os.path.abspath(app.config_path)
    try:
        opts = ExecOptions(
            agent=agent, argv=list(command), db_url=app.db_url, config=app.config, socket=_socket(app),
            config_path=os.path.abspath(app.config_path) if app.config_path else None, labels=_labels(labels),
            budgets={"max_steps": max_steps, "max_tool_calls": max_tool_calls, "max_cost_eur": max_cost_eur,
                     "max_wall_s": max_wall_s},
            kill_mode=kill_mode, verbose=verbose)
    except click.BadParameter as exc:
        exc.exit_code = EXIT_FAILED  # type: ignore[misc]  # click reads it per instance; typed a ClassVar
        raise
    except Exception as exc:  # noqa: BLE001 — a missing store URL, a broken config: exec's own failure
        text = str(exc).strip()
        say(f"error: {(text.splitlines() or [type(exc).__name__])[0] if text else type(exc).__name__}")
        sys.exit(EXIT_FAILED)
    # sys.exit, not ctx.exit: the group's main would turn click's Exit into 0 (standalone_mode=False).
    sys.exit(run_exec(opts))
