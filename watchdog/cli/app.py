"""The click group and what every command shares: the App (config + store, resolved once), errors, JSON.

Every error is one line on stderr and a non-zero exit; `--debug` shows the traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from watchdog.core.config import ENV_CONFIG, Config, load, resolve_db_url
from watchdog.core.text import scrub
from watchdog.errors import ConfigError, StoreError

if TYPE_CHECKING:
    from watchdog.store.engine import Connection, Engine

EXIT_ERROR = 1
EXIT_CONFIG = 2


class App:
    """What every command needs: the config and the store, resolved once, lazily."""

    def __init__(self, db: str | None, config_path: str | None, debug: bool):
        self.db_arg = db
        self.config_path = config_path
        self.debug = debug
        self._config: Config | None = None
        self._engine: Engine | None = None
        self._read_engine: Engine | None = None

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load(self.config_path)
        return self._config

    @property
    def db_url(self) -> str:
        url = resolve_db_url(self.db_arg, self.config)
        if not url:
            raise StoreError(f"no store: pass --db URL, set AGENT_WATCHDOG_DB, or set [store] url in the config (${ENV_CONFIG})")
        return url

    def judge_by(self, conn: Connection) -> Config:
        """The budgets runs are judged against: the config file if one is given, else what
        the daemon published in the store (so `show` agrees with the daemon).

        The one profile resolver of the CLI. It reads on the connection the command already
        holds: a second connection opened inside a write transaction (as `kill` once did)
        waits out SQLite's busy timeout for the lock its own command holds."""
        if self.config_path:
            return self.config
        from watchdog.store.views import published_profiles

        return published_profiles(conn, self.config)

    @property
    def engine(self) -> Engine:
        """The store for a command that writes: it must exist and have its tables."""
        if self._engine is None:
            self._engine = self.open_store(must_exist=True, tables=True)
        return self._engine

    def reader(self) -> Connection:
        """A read connection (one snapshot) for a command that only reads. SQLite is opened
        read-only: a mistyped path is an error naming the fix, never a new empty file."""
        from watchdog.store.engine import read_connection

        if self._read_engine is None:
            self._read_engine = self.open_store(read_only=True, tables=True)
        return read_connection(self._read_engine)

    def open_store(self, *, must_exist: bool = False, read_only: bool = False, tables: bool = False) -> Engine:
        """An engine on the store. `tables`: it must have been migrated (`db upgrade`)."""
        from watchdog.store.access import open_store

        return open_store(self.db_url, must_exist=must_exist, read_only=read_only, tables=tables)


def fail_cleanly(fn):
    """Turn expected failures into one line on stderr (the traceback only with --debug)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        app = ctx.find_object(App)
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError:  # issue 19: `top | head` — the reader left; no traceback, no error line
            closed_pipe()
        except ConfigError as exc:
            _die(app, exc, EXIT_CONFIG)
        except Exception as exc:  # noqa: BLE001 — the CLI's last line of defense
            _die(app, exc, EXIT_ERROR)

    return wrapper


def _die(app, exc, code):
    if app is not None and app.debug:
        raise exc
    msg = _database_error(app, exc)
    if msg is None:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not isinstance(exc, (ConfigError, StoreError, ValueError)):
            msg = f"{type(exc).__name__}: {msg}"
    msg = scrub(msg)  # an error may quote a URL with its password, or a token
    click.echo(f"agent-watchdog: error: {msg}", err=True)
    sys.exit(code)


def _database_error(app, exc) -> str | None:
    """A driver error as one line naming the store (never the SQL or its parameters), with the
    fix when a table or column is missing: the store is older than this agent-watchdog."""
    from watchdog.store.access import driver_error

    error = driver_error(exc)
    if error is None:
        return None
    from watchdog.core.text import url_without_password
    from watchdog.store.engine import upgrade_hint

    try:
        url = app.db_url
    except Exception:  # noqa: BLE001 — the error is about the store, whatever its URL
        url = "(unknown URL)"
    if error.missing_schema:
        return f"the store at {url_without_password(url)} lacks tables or columns this agent-watchdog needs " \
               f"({error.first_line}): {upgrade_hint(url)}"
    return f"the store at {url_without_password(url)}: {error.first_line}"


class _Group(click.Group):
    """click's own errors (a bad option, a ClickException) in the CLI's one error style:
    `agent-watchdog: error: ...`, one line on stderr, instead of click's `Error: ...`."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except BrokenPipeError:
            closed_pipe()
        except click.Abort:
            click.echo("agent-watchdog: error: aborted", err=True)
            sys.exit(1)
        except click.ClickException as exc:
            msg = " ".join(exc.format_message().split()).rstrip(".")
            if isinstance(exc, click.UsageError) and exc.ctx is not None:
                msg += f" (see `{exc.ctx.command_path} --help`)"
            click.echo(f"agent-watchdog: error: {msg}", err=True)
            sys.exit(exc.exit_code)
        sys.exit(0)


class _Summaries:
    """Command lists with each command's whole first sentence, wrapped (issue 36: click cuts a
    summary at the width left beside the name, ending it in "...")."""

    SUMMARY_CHARS = 200

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):  # type: ignore[attr-defined]
            cmd = self.get_command(ctx, name)  # type: ignore[attr-defined]
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=self.SUMMARY_CHARS)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class _SubGroup(_Summaries, click.Group):
    """`db`, `circuits`, `files`, `hook`: the same summaries as the top level."""


_Group.group_class = _SubGroup


class _Main(_Summaries, _Group):
    pass


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", envvar="AGENT_WATCHDOG_DB", help="Store URL (else $AGENT_WATCHDOG_DB, else [store] url).")
@click.option("--config", "config_path", envvar=ENV_CONFIG, type=click.Path(dir_okay=False),
              help="Config file (else $AGENT_WATCHDOG_CONFIG).")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="agent-watchdog-daemon")
@click.pass_context
def main(ctx, db, config_path, debug):
    """agent-watchdog: stop runaway LLM agent runs — one run, one tool, never the platform."""
    ctx.obj = App(db, config_path, debug)


pass_app = click.make_pass_decorator(App)


def _set_on_app(attr):
    def callback(ctx, _param, value):
        if value:  # an absent option never overrides the group-level one
            setattr(ctx.ensure_object(App), attr, value)
        return value

    return callback


def shared_options(fn):
    """--db / --config / --debug are accepted after the command name too (`agent-watchdog run --config F`)."""
    fn = click.option("--db", expose_value=False, callback=_set_on_app("db_arg"), help="Store URL.")(fn)
    fn = click.option("--config", expose_value=False, type=click.Path(dir_okay=False),
                      callback=_set_on_app("config_path"), help="Config file.")(fn)
    fn = click.option("--debug", expose_value=False, is_flag=True, default=None,
                      callback=_set_on_app("debug"), help="Show tracebacks.")(fn)
    return fn


def closed_pipe() -> None:
    """stdout's reader went away: exit as a process killed by SIGPIPE would (128 + 13), quietly
    (stdout is pointed at /dev/null so the interpreter's final flush cannot fail again)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    sys.exit(141)


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


# --- mcp-proxy (the tool gateway, watchdog/gateways/mcp; optional extra `mcp`) -------------------

@main.command("mcp-proxy", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--agent", help="Agent name (profile) of the proxy's own runs (default mcp-proxy).")
@click.option("--run", "run_id", help="Witness this run (else $AGENT_WATCHDOG_RUN, else the proxy's own runs).")
@click.option("--upstream", help="Streamable HTTP server to front (e.g. http://127.0.0.1:8000/mcp).")
@click.option("--listen", help="With --upstream: HOST:PORT to serve on (default 127.0.0.1:8931).")
@click.argument("server_command", nargs=-1, type=click.UNPROCESSED)
@shared_options
@pass_app
@fail_cleanly
def mcp_proxy_cmd(app, agent, run_id, upstream, listen, server_command):
    """Guard an MCP server's tool calls: mcp-proxy [OPTIONS] -- SERVER_COMMAND [ARGS...]."""
    from watchdog.gateways.mcp.main import run_proxy

    sys.exit(run_proxy(db_url=app.db_url, config_path=app.config_path, agent=agent, run_id=run_id,
                       upstream=upstream, listen=listen, command=list(server_command)))
