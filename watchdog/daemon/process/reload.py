"""SIGHUP: read the config file again and apply it without a restart (issue 19, item 4).

Applied at once: the agent profiles and `[defaults]`, `[[budgets]]`, `[circuit]`, the graces,
`allowed_users`, the alert URLs (`urls` and `urls_file`), the alert retry/expiry; the
profiles are published again so the SDK uses them from its next run. A file that does not
load (or names a user that does not exist, or an alert URL apprise refuses) is refused with
one line and the running config is kept. Keys that only a restart can change (the store,
where the daemon listens and keeps its files, its tick) keep their running values; if they
changed, the log line names them.

The other signals: SIGTERM and SIGINT finish the current tick and exit 0; SIGUSR1 logs one
status line; SIGUSR2 is ignored (logged). See docs/howto/operations.md.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from watchdog.core.config import Config, load
from watchdog.core.text import one_line
from watchdog.errors import ConfigError

if TYPE_CHECKING:
    from types import FrameType

    from watchdog.daemon.stops.killer import Killer
    from watchdog.daemon.alerts.notify import Notifier
    from watchdog.daemon.otlp.server import OtlpServer
    from watchdog.daemon.stops.signalcheck import Signalable
    from watchdog.daemon.tick.ticker import TickReport, Ticker

log = logging.getLogger("watchdog.daemon")

# (name in the log line, how to read it): applied only by a restart.
RESTART_ONLY: tuple[tuple[str, Callable[[Config], object]], ...] = (
    ("[store] url", lambda c: c.store.url),
    ("[daemon] tick_s", lambda c: c.daemon.tick_s),
    ("[daemon] socket", lambda c: c.daemon.socket),
    ("[daemon] key_file", lambda c: c.daemon.key_file),
    ("[daemon] state_dir", lambda c: c.daemon.state_dir),
    ("[daemon] shards", lambda c: c.daemon.shards),  # issue 35: the judge's ShardSet is made at start
    ("[metrics] listen", lambda c: c.metrics_listen),
    ("[otlp]", lambda c: c.otlp),
    ("[pricing]", lambda c: c.pricing),
    ("[prices]", lambda c: dict(c.prices)),
    ("[drift]", lambda c: c.drift),
    ("[store] record_errors", lambda c: c.store.record_errors),
)


class Daemon(Protocol):
    """What a reload reads and replaces of the running daemon (watchdog.daemon.process.service.Daemon,
    which installs the handlers: a protocol, so this module never imports the service back)."""

    config: Config
    ticker: Ticker
    killer: Killer
    signalable: Signalable
    notifier: Notifier
    otlp_server: OtlpServer | None
    last_report: TickReport | None
    reload_requested: bool

    def publish(self, force: bool = False) -> None: ...


def reload(daemon: Daemon, path: str | None) -> bool:
    """Load `path` and apply it to the running `daemon`; False (logged, one line) if refused."""
    from watchdog.daemon.alerts.notify import Notifier, daemon_alert_urls, url_error
    from watchdog.daemon.process.preflight import check, check_allowed_users

    if not path:
        log.warning("SIGHUP: no config file to reload (the daemon started without --config or "
                    "AGENT_WATCHDOG_CONFIG); nothing changed")
        return False
    old: Config = daemon.config
    try:
        new = load(path, url_error=url_error)
        check(new)
        check_allowed_users(new)
        fresh = Notifier(daemon_alert_urls(new))
        # The running notifier is kept when the targets are the same: its lanes may be sending.
        same = {t.id for t in fresh.targets} == {t.id for t in daemon.notifier.targets}
        notifier = None if same else fresh
    except (ConfigError, ValueError, OSError) as exc:
        log.error("SIGHUP: %s refused, the running config is kept: %s", path, one_line(str(exc), 400))
        return False
    except Exception as exc:  # noqa: BLE001 — a reload never takes the daemon down
        log.error("SIGHUP: %s refused (%s), the running config is kept", path, type(exc).__name__)
        return False
    pending = [name for name, get in RESTART_ONLY if get(old) != get(new)]
    new = _keep_restart_only(new, old)
    apply(daemon, new, notifier)
    if daemon.otlp_server is not None:  # its tokens file is read again: a token added or revoked
        try:
            daemon.otlp_server.reload_tokens()
        except ConfigError as exc:
            log.error("SIGHUP: %s; the receiver keeps the tokens it had", one_line(str(exc), 400))
    log.info("SIGHUP: reloaded %s (profiles, budgets, circuits, graces, allowed_users, alert URLs: %d)%s", path,
             len(daemon.notifier.targets),
             f"; needs a restart to apply: {', '.join(pending)}" if pending else "")
    return True


def _keep_restart_only(new: Config, old: Config) -> Config:
    d = dataclasses.replace(new.daemon, tick_s=old.daemon.tick_s, socket=old.daemon.socket,
                            key_file=old.daemon.key_file, state_dir=old.daemon.state_dir, shards=old.daemon.shards)
    store = dataclasses.replace(new.store, url=old.store.url, record_errors=old.store.record_errors)
    return dataclasses.replace(new, daemon=d, store=store, metrics_listen=old.metrics_listen, pricing=old.pricing,
                               prices=old.prices, drift=old.drift, otlp=old.otlp)


def apply(daemon: Daemon, config: Config, notifier: Notifier | None = None) -> None:
    """Every part of the running daemon that reads the config, on the new one."""
    from watchdog.daemon.stops.killer import default_allowed_users
    from watchdog.daemon.tick.prefilter import PreFilter

    daemon.config = config
    t = daemon.ticker
    t.config = config
    t.prefilter = PreFilter(config)
    t.duties.config = config
    t.trust.config = config  # the profiles' `owners` (who may use each agent) come with it
    if t.owner_evidence is not None:
        t.owner_evidence.config = config
    if t.circuits is not None:
        t.circuits.config = config
    if t.money is not None:
        t.money.config = config
        t.money.label_budgets = tuple(config.budgets)
    users = frozenset(u for u in config.daemon.allowed_users if u)
    daemon.killer.allowed_users = users or default_allowed_users()
    from watchdog.daemon.stops.signalcheck import warn_at_start  # the new users: can it signal them? (issue 36)

    daemon.signalable = warn_at_start(daemon.killer.allowed_users)
    if notifier is not None:
        daemon.notifier = notifier
    try:
        daemon.publish(force=True)  # the SDK's next run reads the new profiles
    except Exception as exc:  # noqa: BLE001 — the tick publishes again
        log.warning("SIGHUP: could not publish the new profiles yet (%s); the next tick does", type(exc).__name__)


def status_line(daemon: Daemon) -> str:
    rep = daemon.last_report
    if rep is None:
        return "SIGUSR1: no tick completed yet"
    return (f"SIGUSR1: last tick {rep.at:%H:%M:%S} UTC: {rep.active} active, {rep.stopping} stopping, "
            f"{rep.duration_s * 1000:.0f} ms; alert targets {len(daemon.notifier.targets)}, "
            f"busy {len(daemon.notifier.busy())}")


def install(daemon: Daemon) -> None:
    """The handlers beside SIGTERM/SIGINT: SIGHUP asks the main loop to reload (within its
    one-second wait), SIGUSR1 logs a status line, SIGUSR2 is ignored."""
    daemon.reload_requested = False

    def on_hup(_signum: int, _frame: FrameType | None) -> None:
        daemon.reload_requested = True

    signal.signal(signal.SIGHUP, on_hup)
    signal.signal(signal.SIGUSR1, lambda *_: log.info("%s", status_line(daemon)))
    signal.signal(signal.SIGUSR2, lambda *_: log.info("SIGUSR2: ignored (SIGHUP reloads the config)"))
