"""CLI commands that act: run (the daemon), kill, circuits, test-alert."""

from __future__ import annotations

import logging
import sys

import click

from watchdog.cli.app import emit_json, fail_cleanly, main, pass_app, shared_options
from watchdog.core.periods import utcnow


def _logging(verbose: bool):
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    # apprise logs full URLs on some failures: only our own privacy-form lines reach the log
    # (watchdog.daemon.alerts.notify still reads each delivery's own warnings and cause).
    logging.getLogger("apprise").setLevel(logging.CRITICAL)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # -v is about the watchdog: urllib3 (under apprise) would log every HTTP connection.
    logging.getLogger("urllib3").setLevel(logging.WARNING)


@main.command("run")
@click.option("--once", is_flag=True, help="Run one tick (and one alert delivery) and exit.")
@click.option("-v", "--verbose", is_flag=True, help="Log at debug level (the watchdog's own loggers).")
@shared_options
@pass_app
@fail_cleanly
def run_cmd(app, once, verbose):
    """Run the watchdog daemon in the foreground (SIGTERM/SIGINT: finish the tick and exit 0)."""
    from watchdog.daemon.process.metrics import start_metrics
    from watchdog.daemon.process.service import AlreadyRunning, Daemon, check_allowed_users

    from watchdog.daemon.process.preflight import check

    _logging(verbose)
    check(app.config)  # what the config needs (extras, users) is there: loud at start, not mid-run
    from watchdog.store.access import open_daemon_store

    store = open_daemon_store(app.db_url)  # SQLite checked now; a server that is down: _acquire waits for it
    check_allowed_users(app.config)  # before anything listens or a key is made
    daemon = Daemon(store, app.config)
    try:
        _acquire(daemon, app.db_url, retry=not once)
    except AlreadyRunning as exc:
        # Not a failure: this host is watched. Exit 0 so that systemd (Restart=on-failure)
        # and a second start by hand both leave the running daemon alone.
        click.echo(f"agent-watchdog: {exc}", err=True)
        sys.exit(0)
    try:
        # After the lease (issue 36): a second daemon says "already watching", not EADDRINUSE.
        if app.config.metrics_listen:
            daemon.metrics = _listen("[metrics] listen", app.config.metrics_listen, start_metrics)
        if once:
            rep = daemon.once()
            if rep is None:
                raise click.ClickException("the tick failed (see the log above)")
            click.echo(f"tick: {rep.active} active, {rep.stopping} stopping, {len(rep.stops)} stop(s) requested, "
                       f"{len(rep.lost)} lost, {rep.duration_s * 1000:.1f} ms")
            return
        sys.exit(daemon.serve())
    finally:
        daemon.release()


def _listen(key: str, listen: str, start):
    """start(listen), a port that cannot be had in one line naming the key."""
    from watchdog.errors import ConfigError

    try:
        return start(listen)
    except OSError as exc:
        raise ConfigError(f"{key} = {listen!r}: cannot listen there ({exc.strerror or exc}): choose a free "
                          "port, or another daemon already listens on it") from None


def _acquire(daemon, url: str, retry: bool):
    """Take the lease; a store that is down at start-up is waited for, not fatal (systemd
    would only restart us into the same outage). Another live daemon: AlreadyRunning (the
    caller exits 0). A store without this version's tables is fatal: the daemon never
    migrates one by itself."""
    import time

    from watchdog.errors import StoreError
    from watchdog.store import access
    from watchdog.store.access import unreachable
    from watchdog.store.engine import require_tables, upgrade_hint

    delay_s = 1.0
    while True:
        try:
            require_tables(daemon.engine, url)
            current, head = access.current(daemon.engine), access.head()
            if current != head and access.is_older(current):
                raise StoreError(f"the store is at revision {current}, this agent-watchdog needs {head}: "
                                 f"{upgrade_hint(url)}")
            acquired = daemon.acquire()
            _warn_event_id_grants(daemon.engine)
            return acquired
        except Exception as exc:
            first = unreachable(exc)
            if first is None or not retry:
                raise
            logging.getLogger("watchdog.daemon").error("store unreachable at start-up (%s); retrying in %g s",
                                                       first, delay_s)
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, daemon.config.daemon.tick_s * 6)


def _warn_event_id_grants(engine) -> None:
    """Loud at start: roles that may pick an event's id (a roles script older than revision 0013)."""
    from watchdog.store.access import roles_choosing_event_ids

    roles = roles_choosing_event_ids(engine)
    if roles:
        logging.getLogger("watchdog.daemon").warning(
            "PostgreSQL role(s) %s may insert an event with an id of their own, which could hide later events "
            "from the daemon: run the roles script again (`agent-watchdog files roles`, then psql -f it)",
            ", ".join(roles))


@main.command("kill")
@click.argument("run_id")
@click.option("--reason", default="stopped by hand", show_default=True, help="Why (kept in the audit and alert).")
@shared_options
@pass_app
@fail_cleanly
def kill_cmd(app, run_id, reason):
    """Stop one run through the same ladder as the daemon (stop_reason = manual)."""
    from watchdog.core import lifecycle as lc
    from watchdog.daemon.stops.stopping import facts, stop_run
    from watchdog.store.pause import operator
    from watchdog.errors import StoreError
    from watchdog.core.budgets import effective_budgets
    from watchdog.store.views import load_run, resolve_run_id, tool_stats

    now = utcnow()
    with app.engine.begin() as conn:
        rid = resolve_run_id(conn, run_id)
        row = load_run(conn, rid)
        if row.status not in lc.STOPPABLE_STATUSES and row.status != lc.STOPPING:
            raise StoreError(f"run {rid[:8]} already ended: {row.status}")
        stats = tool_stats(conn, [rid])[rid]
        top = (stats[0].name, stats[0].calls, stats[0].errors) if stats else None
        budgets = effective_budgets(app.judge_by(conn).profile(row.agent), row)
        if row.status == lc.STOPPING:  # issue 36: a stop stuck in `stopping` is driven again
            click.echo(_redrive(conn, row, _operator_sealer(app), facts(row, top, None, now), budgets, now))
            return
        ok = stop_run(conn, row, reason=lc.MANUAL, detail=reason, now=now, by=operator(), budgets=budgets,
                          run_facts=facts(row, top, None, now), sealer=_operator_sealer(app),
                          why=f"killed while paused for {row.stop_reason}" if row.status == lc.PAUSED else None)
    if not ok:
        raise StoreError(f"run {rid[:8]} ended or was stopped meanwhile")
    click.echo(kill_sentence(row.agent, rid, row.kill_mode, _operator_sealer(app) is not None, app.config.daemon))


def _redrive(conn, row, sealer, run_facts, budgets, now) -> str:
    """`kill` of a run already stopping: what is true of its stop, and with the daemon's key
    (root, the daemon's user) the stop driven again (watchdog.daemon.stops.redrive)."""
    from watchdog.core import lifecycle as lc
    from watchdog.daemon.stops import redrive
    from watchdog.daemon.stops.signalcheck import FIX
    from watchdog.errors import StoreError
    from watchdog.store.pause import operator

    rid, stage = row.id[:8], row.signal_stage
    head = f"run {rid} is already stopping ({row.stop_reason})"
    if row.kill_mode == lc.COOPERATIVE:
        raise StoreError(f"{head}; its kill_mode is cooperative, so its process is never signalled")
    if stage in (lc.Stage.TERM, lc.Stage.KILL):
        return f"{head}; the daemon sent SIG{stage.upper()} and is waiting for the process to go"
    if stage == lc.Stage.FAILED:
        raise StoreError(f"{head}; its process outlived SIGKILL (uninterruptible?): nothing more can be sent")
    if sealer is None:
        raise StoreError(f"{head}; only root or the daemon's user can drive its stop again")
    denied = redrive.denied_before(conn, row.id)
    redrive.request(conn, row, now=now, by=operator(), facts=run_facts, budgets=budgets, sealer=sealer)
    text = f"{head}: its stop is driven again; the daemon signals it at its next tick"
    if denied:
        text += f". Its last signal was refused (permission denied): {FIX}"
    return text


def kill_sentence(agent: str, rid: str, kill_mode: str, sealed: bool, daemon) -> str:
    """What `kill` will lead to, in one sentence (issue 19): the ladder for root and the daemon's
    user, a cooperative stop for everyone else (and for runs that share their process)."""
    from watchdog.core import lifecycle as lc

    head = f"stop requested for {agent} run {rid[:8]}: it stops at its next write"
    if kill_mode == lc.COOPERATIVE:
        return f"{head}; its kill_mode is cooperative, so its process is never signalled"
    if sealed:
        return (f"{head}; if it has not ended {daemon.cancel_grace_s:g} s later the daemon sends SIGTERM, "
                f"then SIGKILL {daemon.term_grace_s:g} s after that")
    return (f"{head}; cooperative only: its process is not signalled, because only root or the daemon's "
            "user can have the daemon signal it")


def _operator_sealer(app):
    """A sealer with the daemon's own key, when this user can read it (root, or the daemon's
    user): a stop sealed so is the operator's, and the daemon may signal for it. Anyone else's
    `kill` is a stop written into the store: cooperative only (any store writer could write it)."""
    from watchdog.core.seal import Sealer
    from watchdog.core.procid import hostname
    from watchdog.daemon.trust import keyfile

    key = keyfile.load_existing(app.config.daemon.key_file)
    return Sealer(key, hostname()) if key else None


@main.group("circuits", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
@shared_options
@pass_app
@click.pass_context
@fail_cleanly
def circuits_cmd(ctx, app, as_json):
    """List the tool circuit breakers (`circuits close TOOL` closes one)."""
    if ctx.invoked_subcommand:
        return
    from watchdog.cli import render
    from watchdog.store.viewer import circuits

    with app.reader() as conn:
        rows = circuits(conn)
    records = [{"tool": r.tool, "state": r.state, "open_until": r.open_until.isoformat() if r.open_until else None,
                "errors_in_window": r.errors_in_window, "window_s": r.window_s, "last_error": r.last_error,
                "probe_run_id": r.probe_run_id} for r in rows]
    if as_json:
        emit_json(records)
        return
    if not records:
        click.echo("no circuits: every tool is closed")
    now = utcnow()
    for row, r in zip(rows, records):
        click.echo(render.circuit_line(r, row.open_until, now))


@circuits_cmd.command("close")
@click.argument("tool")
@shared_options
@pass_app
@fail_cleanly
def circuits_close(app, tool):
    """Close TOOL's circuit by hand (after fixing the tool)."""
    from watchdog.store.alerts import actor
    from watchdog.daemon.stops.circuits import CircuitBreakers
    from watchdog.errors import StoreError

    if not CircuitBreakers(app.config).close(app.engine, tool, utcnow(), actor("cli")):
        raise StoreError(f"tool {tool!r}: no open circuit")
    click.echo(f"circuit for {tool} closed")


@main.command("test-alert")
@shared_options
@pass_app
@fail_cleanly
def test_alert(app):
    """Send a test alert to every configured URL; one line per URL; exit 1 if any failed."""
    from watchdog.core.config import alert_urls
    from watchdog.daemon.alerts.notify import Notifier, url_error

    urls = alert_urls(app.config, url_error=url_error)
    if not urls:
        where = app.config.path or "the config (--config or $AGENT_WATCHDOG_CONFIG)"
        raise click.ClickException(f"no alert URLs: set [alerts] urls or urls_file in {where}")
    _logging(False)
    results = Notifier(urls).send(
        "agent-watchdog: test alert",
        "This is a test alert from agent-watchdog. If you read this, real alerts will reach you here too.")
    for r in results:
        click.echo(f"{'ok    ' if r.ok else 'FAILED'} {r.target.privacy_url}" + ("" if r.ok else f"  — {r.error}"))
    if not all(r.ok for r in results):
        sys.exit(1)
