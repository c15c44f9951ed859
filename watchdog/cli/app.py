"""The click group and what every command shares: the App (config + store, resolved once), errors, JSON.

Every error is one line on stderr and a non-zero exit; `--debug` shows the traceback.
"""

from __future__ import annotations

import functools
import json
import sys

import click

from watchdog.core.config import ENV_CONFIG, Config, load, resolve_db_url
from watchdog.core.scrub import scrub
from watchdog.errors import ConfigError, StoreError

EXIT_ERROR = 1
EXIT_CONFIG = 2


class App:
    """What every command needs: the config and the store, resolved once, lazily."""

    def __init__(self, db: str | None, config_path: str | None, debug: bool):
        self.db_arg = db
        self.config_path = config_path
        self.debug = debug
        self._config: Config | None = None
        self._engine = None

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

    def judge_by(self, conn) -> Config:
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
    def engine(self):
        if self._engine is None:
            from watchdog.store.engine import make_engine

            self._engine = make_engine(self.db_url)
        return self._engine


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
        except ConfigError as exc:
            _die(app, exc, EXIT_CONFIG)
        except Exception as exc:  # noqa: BLE001 — the CLI's last line of defense
            _die(app, exc, EXIT_ERROR)

    return wrapper


def _die(app, exc, code):
    if app is not None and app.debug:
        raise exc
    msg = scrub(str(exc).strip().splitlines()[0]) if str(exc).strip() else type(exc).__name__
    if not isinstance(exc, (ConfigError, StoreError, ValueError)):
        msg = f"{type(exc).__name__}: {msg}"
    click.echo(f"agent-watchdog: error: {msg}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", envvar="AGENT_WATCHDOG_DB", help="Store URL (else $AGENT_WATCHDOG_DB, else [store] url).")
@click.option("--config", "config_path", envvar=ENV_CONFIG, type=click.Path(dir_okay=False),
              help="Config file (else $AGENT_WATCHDOG_CONFIG).")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="agent-watchdog")
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


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
