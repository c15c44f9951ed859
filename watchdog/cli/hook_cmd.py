"""`agent-watchdog hook claude-code|codex|gemini` and `hook install …` (watchdog.gateways.hooks).

The hook itself is normally reached through the fast path in watchdog.cli.main (no click, no
command modules: it runs once per tool call); these click commands give it its --help and the
same behaviour when called through the group.
"""

from __future__ import annotations

import sys

import click

from watchdog.cli.app import main

CLIS = ("claude-code", "codex", "gemini")


@main.group("hook")
def hook_group():
    """A coding CLI's tool-call hooks: hook claude-code|codex|gemini, hook install."""


def _hook_command(cli: str):
    @hook_group.command(cli, context_settings={"ignore_unknown_options": True})
    @click.option("--agent", help=f"Agent name (profile) of the session's run (default {cli}).")
    @click.option("--fail-closed", is_flag=True, help="Refuse the call when the store cannot be reached.")
    @click.option("--db", help="Store URL (else $AGENT_WATCHDOG_DB, else [store] url).")
    @click.option("--config", "config_path", help="Config file (else $AGENT_WATCHDOG_CONFIG).")
    def cmd(agent, fail_closed, db, config_path):
        from watchdog.gateways.hooks.main import run

        argv = [cli] + (["--agent", agent] if agent else []) + (["--fail-closed"] if fail_closed else [])
        argv += (["--db", db] if db else []) + (["--config", config_path] if config_path else [])
        sys.exit(run(argv))

    cmd.__doc__ = f"The hook {cli} runs before and after each tool call (event JSON on stdin)."
    return cmd


for _cli in CLIS:
    _hook_command(_cli)


@hook_group.command("install")
@click.argument("cli", type=click.Choice(CLIS))
@click.option("--project", "project", type=click.Path(file_okay=False), help="Install into this project's settings.")
@click.option("--user", is_flag=True, help="Install into your user settings (the default without --project).")
@click.option("--agent", help="Agent name (profile) the hook records sessions under.")
@click.option("--fail-closed", is_flag=True, help="The installed hook refuses calls when the store is unreachable.")
@click.option("--hook-db", "hook_db", help="Store URL written into the hook command (else the CLI's environment).")
@click.option("--otlp", help="OTLP/HTTP base URL of the daemon's receiver (e.g. http://127.0.0.1:4318): "
                             "also turns the CLI's OpenTelemetry log export on.")
@click.option("--otlp-token", "otlp_token", envvar="AGENT_WATCHDOG_OTLP_TOKEN", metavar="TOKEN",
              help="A token of the daemon's [otlp] tokens_file: the CLI's log export sends it as "
                   "`Authorization: Bearer` (Claude Code's settings env, Codex's exporter headers, Gemini's .gemini/.env).")
@click.option("--exe", default="agent-watchdog", show_default=True, help="The command the CLI runs.")
@click.option("--dry-run", is_flag=True, help="Print what would change; write nothing.")
def install_cmd(cli, project, user, agent, fail_closed, hook_db, otlp, otlp_token, exe, dry_run):
    """Merge agent-watchdog's hooks (and OTel export) into CLI's settings, never clobbering."""
    from watchdog.gateways.hooks import install

    if project and user:
        raise click.UsageError("give --project DIR or --user, not both")
    command = install.hook_command(cli, agent=agent, fail_closed=fail_closed, db=hook_db, exe=exe)
    try:
        p = install.plan(cli, project=project, user=user, command=command, otlp=otlp, agent=agent,
                         token=otlp_token)
    except ValueError as exc:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
        raise click.ClickException(str(exc)) from None
    plans = [p]
    extra = install.env_plan(cli, project=project, user=user, token=otlp_token)
    if extra is not None:
        plans.append(extra)
    for p in plans:
        _report(p, dry_run)
        if not dry_run:
            install.apply(p)


def _report(p, dry_run: bool) -> None:
    verb = "would change" if dry_run else "changed"
    if not p.changed:
        click.echo(f"{p.path}: nothing to change (already installed)")
    else:
        click.echo(f"{p.path}: {verb}" + ("" if p.before is not None else " (new file)"))
    for line in p.changes:
        click.echo(f"  + {line}")
    for line in p.kept:
        click.echo(f"  = {line}")
    if p.secret and p.changed:
        click.echo(f"  ! {p.path} holds the bearer token: written mode 0600; keep it out of version control "
                   "(or leave --otlp-token out and export OTEL_EXPORTER_OTLP_LOGS_HEADERS in the CLI's environment)")
