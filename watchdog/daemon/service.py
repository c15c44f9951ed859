"""The daemon process: a lease, the published settings, APScheduler jobs, signals, sd_notify.

The work itself is `Ticker.tick(now)` and `outbox.deliver_due(now)`; this module
only schedules them and keeps the process alive through bad data, database blips
and unreachable alert targets.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import threading
import time

from sqlalchemy import delete, insert, select, update

from watchdog.daemon import outbox, sdnotify
from watchdog.store.actions import actor
from watchdog.core.config import Config
from watchdog.errors import StoreError
from watchdog.daemon.killer import Killer, ProcessIdentity
from watchdog.daemon.notify import Notifier
from watchdog.core.procid import current_create_time
from watchdog.store.schema import daemons, settings, utcnow
from watchdog.daemon.ticker import Ticker

log = logging.getLogger("watchdog.daemon")

PUBLISH_EVERY_S = 60.0


class AlreadyRunning(StoreError):
    pass


class Daemon:
    def __init__(self, engine, config: Config, *, killer: Killer | None = None, notifier: Notifier | None = None,
                 metrics=None):
        self.engine = engine
        self.config = config
        self.killer = killer or Killer(config.daemon.allowed_users or None)
        self.notifier = notifier or Notifier(config.alert_urls)
        self.metrics = metrics
        from watchdog.daemon.circuits import CircuitBreakers

        self.ticker = Ticker(engine, config, self.killer, circuits=CircuitBreakers(config), by=actor())
        self._published_at = 0.0
        self._stop = threading.Event()
        self.last_report = None

    # -- lease: one daemon per store and host ---------------------------------

    def acquire(self) -> None:
        me = ProcessIdentity(self.killer.host, os.getpid(), current_create_time() or 0.0)
        now = utcnow()
        with self.engine.begin() as conn:
            row = conn.execute(select(daemons).where(daemons.c.host == me.host)).first()
            if row is not None and row.pid != me.pid:
                other = ProcessIdentity(me.host, row.pid, row.pid_create_time)
                if self.killer.alive([other]):
                    raise AlreadyRunning(
                        f"another agent-watchdog daemon (pid {row.pid}, started {row.started_at:%Y-%m-%d %H:%M:%S} UTC) "
                        f"is already watching this store on {me.host}; stop it first")
            values = dict(pid=me.pid, pid_create_time=me.create_time, started_at=now, last_tick_at=None)
            if row is None:
                conn.execute(insert(daemons).values(host=me.host, **values))
            else:
                conn.execute(update(daemons).where(daemons.c.host == me.host).values(**values))

    def release(self) -> None:
        try:
            with self.engine.begin() as conn:
                conn.execute(delete(daemons).where(daemons.c.host == self.killer.host, daemons.c.pid == os.getpid()))
        except Exception:  # noqa: BLE001 — the next daemon checks liveness anyway
            log.warning("could not release the daemon lease", exc_info=True)

    # -- the jobs ---------------------------------------------------------------

    def publish(self, force: bool = False) -> None:
        """Publish prices and profiles so the SDK and the CLI price and validate as the daemon does."""
        if not force and time.monotonic() - self._published_at < PUBLISH_EVERY_S:
            return
        now = utcnow()
        value = self.config.published()
        if self.ticker.money is not None:  # the models genai-prices priced for it so far, overrides winning
            value["prices"] = self.ticker.money.prices.published()
        with self.engine.begin() as conn:
            done = conn.execute(update(settings).where(settings.c.key == "config").values(value=value, updated_at=now))
            if done.rowcount == 0:
                conn.execute(insert(settings).values(key="config", value=value, updated_at=now))
        self._published_at = time.monotonic()

    def tick_job(self, now: dt.datetime | None = None):
        """One tick; a database blip or bad row is logged, never fatal."""
        try:
            self.publish()
            rep = self.ticker.tick(now or utcnow())
            if rep.learned_prices:  # the SDK prices these models itself from its next settings read
                self.publish(force=True)
        except Exception as exc:  # noqa: BLE001
            log.error("tick failed, retrying next tick: %s", _one_line(exc))
            log.debug("tick failure", exc_info=True)
            if self.metrics:
                self.metrics.tick_failed()
            return None
        self.last_report = rep
        log.debug("tick: %d active, %d stopping, %d stop(s) requested, %d lost, %.1f ms", rep.active, rep.stopping,
                  len(rep.stops), len(rep.lost), rep.duration_s * 1000)
        if self.metrics:
            self.metrics.observe_tick(rep)
        # Pinged from the tick itself: a hung tick stops the pings and systemd restarts us.
        sdnotify.notify("WATCHDOG=1", f"STATUS=active runs {rep.active}, stopping {rep.stopping}, "
                                      f"last tick {rep.duration_s * 1000:.0f} ms")
        return rep

    def deliver_job(self, now: dt.datetime | None = None):
        try:
            return outbox.deliver_due(self.engine, self.notifier, now or utcnow(),
                                      retry_s=self.config.daemon.alert_retry_s,
                                      on_result=self.metrics.alert_result if self.metrics else None)
        except Exception as exc:  # noqa: BLE001
            log.error("alert delivery failed, retrying next tick: %s", _one_line(exc))
            return None

    def once(self, now: dt.datetime | None = None):
        rep = self.tick_job(now)
        self.deliver_job(now)
        return rep

    # -- the loop -----------------------------------------------------------------

    def serve(self) -> int:
        from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED
        from apscheduler.schedulers.background import BackgroundScheduler

        # The jobs run in the scheduler's threads; the main thread only waits for a
        # signal, so a SIGTERM at any moment (even during start-up) is honoured.
        sched = BackgroundScheduler(timezone=dt.timezone.utc)
        tick_s = self.config.daemon.tick_s
        common = dict(trigger="interval", seconds=tick_s, max_instances=1, coalesce=True,
                      misfire_grace_time=max(1, int(tick_s)), next_run_time=dt.datetime.now(dt.timezone.utc))
        sched.add_job(self.tick_job, id="tick", **common)
        sched.add_job(self.deliver_job, id="deliver", **common)

        def skipped(event):
            kind = "still running" if event.code == EVENT_JOB_MAX_INSTANCES else "missed"
            log.warning("%s job skipped: the previous one is %s", event.job_id, kind)
            if self.metrics and event.job_id == "tick":
                self.metrics.tick_skipped()

        sched.add_listener(skipped, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)

        def on_signal(signum, _frame):
            log.info("%s: finishing the current tick and exiting", signal.Signals(signum).name)
            self._stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            self.publish(force=True)
        except Exception as exc:  # noqa: BLE001 — the tick retries publishing
            log.error("could not publish the settings yet: %s", _one_line(exc))
        if self._stop.is_set():
            return 0
        sched.start()
        sdnotify.notify("READY=1", "STATUS=watching")
        log.info("agent-watchdog watching %s every %g s (host %s, pid %d)",
                 self.engine.url.render_as_string(hide_password=True), tick_s, self.killer.host, os.getpid())
        try:
            while not self._stop.wait(1.0):
                pass
        finally:
            sdnotify.notify("STOPPING=1")
            sched.shutdown(wait=True)  # the running tick completes; no new one starts
            self.deliver_job()  # alerts the last tick queued leave with us, not with the next daemon
        return 0


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"
