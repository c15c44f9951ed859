"""The daemon process: a lease, the published settings, the attestation socket, the jobs on
the monotonic clock (watchdog.daemon.process.loop), signals, sd_notify.

The work itself is `Ticker.tick(now)` and `outbox.deliver_due(now)`; this module
only schedules them and keeps the process alive through bad data, database blips
and unreachable alert targets. What it refuses at start, with one line naming the
key: a daemon running as root with no `[daemon] allowed_users` (it would signal
root's processes on the store's word), an unusable sealing key or socket path.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from watchdog.core.text import scrub
from watchdog.core.outcomes import AlertKind, Outcome, Say
from watchdog.core.seal import Sealer
from watchdog.daemon.trust import keyfile
from watchdog.daemon.alerts import outbox
from watchdog.daemon.process import sdnotify, whoami
from watchdog.daemon.process import reload as reloading  # issue 19: SIGHUP reloads; SIGUSR1/2
from watchdog.daemon.tick.clock import MIN_JUMP_S, Jump, JumpDetector
from watchdog.daemon.process.loop import Periodic
from watchdog.daemon.stops.attest import AttestServer
from watchdog.daemon.leases.cluster import Membership
from watchdog.daemon.leases.lease import AlreadyRunning, LeaseLost, lease_for
from watchdog.store.alerts import announce, actor
from watchdog.store.leases import Holder, db_now
from watchdog.store.engine import Engine
from watchdog.store.run_rows import rebase_active_runs, rebase_pending_alerts
from watchdog.core.config import Config
from watchdog.errors import ConfigError
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.alerts.notify import Notifier
from watchdog.daemon.process.preflight import check_allowed_users
from watchdog.store.settings import CONFIG_KEY
from watchdog.store.settings import get as published_value
from watchdog.store.settings import put as publish_value
from watchdog.core.periods import utcnow
from watchdog.daemon.tick.ticker import TickReport, Ticker

if TYPE_CHECKING:
    from watchdog.daemon.leases.hostlock import HostLock
    from watchdog.daemon.leases.shards import ShardSet
    from watchdog.daemon.process.metrics import Metrics
    from watchdog.daemon.otlp.server import OtlpServer
    from watchdog.store.memory import Memory

log = logging.getLogger("watchdog.daemon")

PUBLISH_EVERY_S = 60.0


__all__ = ["AlreadyRunning", "Daemon", "LeaseLost", "check_allowed_users"]


class Daemon:
    def __init__(self, engine: Engine, config: Config, *, killer: Killer | None = None,
                 notifier: Notifier | None = None, metrics: Metrics | None = None) -> None:
        check_allowed_users(config)
        self.shards = _shards(engine, config)  # issue 35: [daemon] shards, refused at start where it cannot hold
        self.engine = engine
        self.config = config
        self.killer = killer or Killer(config.daemon.allowed_users or None)
        if not self.killer.allowed_users:
            log.warning("[daemon] allowed_users is empty and the daemon's own user is a system account: no process "
                        "will be signalled (cooperative stops and alerts only); set allowed_users = [\"USER\", ...]")
        from watchdog.daemon.stops.signalcheck import warn_at_start  # issue 36: no CAP_KILL, said at start

        self.signalable = warn_at_start(self.killer.allowed_users)
        from watchdog.daemon.process import dirs  # issue 19: the default directories exist for any user

        dirs.ensure(config.daemon)
        self.sealer = Sealer(keyfile.load_or_create(config.daemon.key_file), self.killer.host)
        if notifier is None:
            from watchdog.daemon.alerts.notify import daemon_alert_urls

            notifier = Notifier(daemon_alert_urls(config))  # the credential file: read at start
        self.notifier = notifier
        self.metrics = metrics
        self.attest_server: AttestServer | None = None
        self.otlp_server: OtlpServer | None = None  # [otlp] listen
        from watchdog.daemon.stops.circuits import CircuitBreakers
        from watchdog.daemon.tick.heap import HeapFreezer

        self.membership = Membership(engine, self.killer.host)
        self.ticker = Ticker(engine, config, self.killer, circuits=CircuitBreakers(config, sealer=self.sealer),
                             by=actor(), sealer=self.sealer, membership=self.membership,
                             memory=_state_file(config, engine),  # issue 20: the daemon's own memory
                             heap=HeapFreezer())  # issue 25: no full collection of the kept runs every few ticks
        self._published_at = 0.0
        self._published_value: dict[str, Any] | None = None
        self._stop = threading.Event()
        self.jumps = JumpDetector(tolerance_s=max(config.daemon.tick_s, MIN_JUMP_S))
        self.last_jump: Jump | None = None
        self.last_report: TickReport | None = None
        self.lost_lease: str | None = None
        self.host_lock: HostLock | None = None  # the flock of this store's lease (acquire)
        self.reload_requested = False  # SIGHUP (watchdog.daemon.process.reload)

    # -- the lease: one daemon per store and host, one leader per store -------

    def acquire(self) -> None:
        """Take this host's lease: the flock on this store's lock file in state_dir (the only
        proof that another daemon runs: AlreadyRunning), then the store's bookkeeping row."""
        # -- issue 20: the lease is a lock file the daemon owns (watchdog.daemon.leases.hostlock) --
        from watchdog.daemon.leases.hostlock import HostLock, HostLockHeld

        lock = HostLock(self.config.daemon.state_dir, self.engine.url)
        try:
            lock.acquire()
        except HostLockHeld as exc:
            raise AlreadyRunning(self.killer.host, self._holder_named(exc.pid), exc.pid) from None
        self.host_lock = lock
        from watchdog.daemon.process import statedir  # issue 36: no files of stores long gone

        statedir.prune(self.config.daemon.state_dir, lock.path)
        lease = lease_for(self.engine, self.killer.host, tick_s=self.config.daemon.tick_s)
        try:
            lease.acquire()
        except BaseException:
            lock.release()
            raise
        self.membership.lease = lease

    def _holder_named(self, pid: int | None) -> Holder | None:
        """The daemons row of the lock's holder, for its start time in the message (never obeyed)."""
        from watchdog.daemon.leases.lease import HOLDER_WAIT_S
        from watchdog.store import leases as lease_rows

        deadline = time.monotonic() + HOLDER_WAIT_S  # the holder writes its row right after locking
        while pid is not None:
            try:
                with self.engine.connect() as conn:
                    row = lease_rows.holder(conn, self.killer.host)
            except Exception:  # noqa: BLE001 — the message goes without it
                return None
            if row is not None and row.pid == pid:
                return row
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)
        return None

    @property
    def is_leader(self) -> bool:
        """Leads the cluster duties; a daemon without a lease (tests, a bare tick) is its store's sole daemon."""
        lease = self.membership.lease
        return lease is None or lease.leader

    def start_attesting(self) -> AttestServer:
        """Listen on `[daemon] socket` for agents naming their runs (a thread of this process)."""
        if self.attest_server is None:
            self.attest_server = AttestServer(self.engine, self.sealer, self.config.daemon.socket,
                                              self.killer.host, otlp=self._otlp_url).start()
        return self.attest_server

    def stop_attesting(self) -> None:
        if self.attest_server is not None:
            self.attest_server.stop()
            self.attest_server = None
        self.stop_otlp()

    # -- [otlp]: the OTLP/HTTP receiver (watchdog.daemon.otlp), threads of this process ----------

    def start_otlp(self) -> OtlpServer | None:
        """Receive OTLP/HTTP spans on `[otlp] listen` (off when ""); a ConfigError names the key."""
        if self.otlp_server is None and self.config.otlp.listen:
            from watchdog.daemon.otlp.server import OtlpServer

            self.otlp_server = OtlpServer(self.engine, self.config, self.sealer, self.killer.host).start()
            self.otlp_server.receiver.watch(self.ticker.trust.not_owner)  # anonymous: judged by [defaults]
            try:  # its address, where exec finds it (issue 36: an agent's user cannot read this config)
                self.publish(force=True)
            except Exception as exc:  # noqa: BLE001 — the tick retries publishing
                log.error("could not publish the receiver's address yet: %s", _one_line(exc))
        return self.otlp_server

    def _otlp_url(self) -> str | None:
        """The receiver's traces URL (for the attestation reply), None while it is off."""
        server = self.otlp_server
        return server.url if server is not None else None

    def stop_otlp(self) -> None:
        if self.otlp_server is not None:
            self.otlp_server.stop()
            self.otlp_server = None

    def release(self) -> None:
        self.stop_attesting()
        if self.shards is not None:
            self.shards.close()  # the other judges take its shards at their next tick
        lease, self.membership.lease = self.membership.lease, None
        try:
            if lease is not None:
                lease.release()
        except Exception:  # noqa: BLE001 — the lease expires by itself; the lock goes with the session
            log.warning("could not release the daemon lease", exc_info=True)
        finally:
            lock, self.host_lock = self.host_lock, None
            if lock is not None:
                lock.release()

    # -- the jobs ---------------------------------------------------------------

    def publish(self, force: bool = False) -> None:
        """Publish prices and profiles so the SDK and the CLI price and validate as the daemon does.

        Only the daemon composes the settings: a row someone else changed (any store writer
        can, on SQLite) is put back within a tick, and said so in the log."""
        if not force and time.monotonic() - self._published_at < PUBLISH_EVERY_S:
            if self._published_value is None or self._settings_intact():
                return
            log.warning("the published settings were changed by someone else in the store; restored")
        now = utcnow()
        value = self.config.published()
        if self.otlp_server is not None:  # the address it listens on (a port 0 made real)
            host, port = self.otlp_server.address
            value["otlp"] = {"listen": f"[{host}]:{port}" if ":" in host else f"{host}:{port}"}
        if self.ticker.money is not None:  # the models genai-prices priced for it so far, overrides winning
            value["prices"] = self.ticker.money.prices.published()
        with self.engine.begin() as conn:
            publish_value(conn, CONFIG_KEY, value, now)
        self._published_at = time.monotonic()
        self._published_value = json.loads(json.dumps(value))  # as it reads back (lists, not tuples)
        if self.attest_server is not None:  # serving: its receivers' addresses are known (issue 36)
            whoami.publish(self)

    def _settings_intact(self) -> bool:
        """One small read per tick: the settings row still holds what this daemon wrote."""
        with self.engine.connect() as conn:
            stored = published_value(conn, CONFIG_KEY)
        return bool(stored == self._published_value)  # settings.get: a JSON value, Any

    def store_now(self) -> dt.datetime:
        """The store's clock: the database server's on PostgreSQL (one cheap SELECT), this host's on SQLite."""
        if self.engine.dialect.name == "postgresql":
            with self.engine.connect() as conn:
                return db_now(conn)
        return utcnow()

    def clock(self) -> tuple[dt.datetime, bool]:
        """(now, the clock jumped since the last reading). The store's clock: the database
        server's on PostgreSQL (one cheap SELECT; the SDKs of every host write its time too,
        so no two hosts' clocks are compared), this host's on SQLite (one host)."""
        now = self.store_now()
        jump = self.jumps.observe(time.monotonic(), now)
        if jump is not None:
            self._clock_jumped(jump)
        return now, jump is not None

    def _clock_jumped(self, jump: Jump) -> None:
        """Logged and alerted once per jump; the active runs' times are moved onto the new clock
        (watchdog.store.run_rows) and this tick judges no duration (see tick_job)."""
        self.last_jump = jump
        pg = self.engine.dialect.name == "postgresql"
        where = "the database server's clock" if pg else f"the clock of {self.killer.host}"
        if self.metrics:
            self.metrics.clock_jumped()
        try:
            with self.engine.begin() as conn:
                moved = rebase_active_runs(conn, jump.rebased)
                rebase_pending_alerts(conn, jump.rebased)
            # The daemon's own first sights (issue 20: the wall clock runs from them) move too.
            self.ticker.memory.rebase_first(lambda at_s: jump.rebased(
                dt.datetime.fromtimestamp(at_s, dt.timezone.utc)).timestamp())
            with self.engine.begin() as conn:
                line = (f"{where} jumped {jump.skew_s:+.0f} s ({jump.describe()}); the times of {moved} active "
                        "run(s) moved with it, wall_clock and heartbeat_timeout not judged this tick")
                log.warning("%s", line)
                said = Outcome.of(Say.CLOCK, AlertKind.CLOCK.key(self.killer.host, f"{jump.at.timestamp():.0f}"),
                                  host=self.killer.host, skew_s=jump.skew_s, line=line, database=pg)
                announce(conn, said, now=jump.at, sealer=self.sealer)
        except Exception as exc:  # noqa: BLE001 — this tick still judges no duration; the next ones do
            log.warning("%s jumped %+.0f s (%s); could not move the active runs' times or queue the alert: %s",
                        where, jump.skew_s, jump.describe(), _one_line(exc))

    def tick_job(self, now: dt.datetime | None = None) -> TickReport | None:
        """One tick; a database blip or bad row is logged, never fatal."""
        try:
            self.publish()
            skip_clock = False
            if now is None:
                now, skip_clock = self.clock()
            if self.shards is not None:  # rebalanced before each tick: a dead judge's shards taken within one
                self.shards.before_tick(self.ticker)
            rep = self.ticker.tick(now, skip_clock=skip_clock)
            if rep.learned_prices:  # the SDK prices these models itself from its next settings read
                self.publish(force=True)
        except LeaseLost as exc:
            log.error("%s", exc)
            self.lost_lease = str(exc)
            self.membership.lease = None
            self._stop.set()  # never act on a host another daemon holds
            return None
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
            self._observe_circuits()  # issue 24: the alert rules' circuits and tick period
        # Pinged from the tick itself: a hung tick stops the pings and systemd restarts us.
        sdnotify.notify("WATCHDOG=1", f"STATUS=active runs {rep.active}, stopping {rep.stopping}, "
                                      f"last tick {rep.duration_s * 1000:.0f} ms{', leader' if rep.leader else ''}")
        return rep

    def _observe_circuits(self) -> None:
        """Circuits by state for /metrics (issue 24). A failed read costs this sample, never the tick."""
        from watchdog.store.engine import read_connection
        from watchdog.store.viewer import circuit_counts

        metrics = self.metrics
        if metrics is None:
            return
        try:
            with read_connection(self.engine) as conn:
                counts = circuit_counts(conn)
        except Exception as exc:  # noqa: BLE001 — metrics never fail the tick
            log.debug("circuit metrics: %s", _one_line(exc))
            return
        metrics.observe_circuits(counts, self.config.daemon.tick_s)

    def deliver_job(self, now: dt.datetime | None = None) -> outbox.DeliveryReport | None:
        # Each daemon delivers the alerts it sealed (watchdog.daemon.alerts.outbox): several daemons
        # on one store never send one alert twice; the leader's duties' alerts are its own.
        if self.lost_lease:
            return None
        try:
            d = self.config.daemon
            # The store's clock, as the tick that queued the alerts (their next attempt is on it).
            # Within one tick's length (a little less: the next pass is not skipped for a hanging target).
            return outbox.deliver_due(self.engine, self.notifier, now or self.store_now(), sealer=self.sealer,
                                      retry_s=d.alert_retry_s, expire_s=d.alert_expire_s,
                                      budget_s=max(1.0, 0.8 * d.tick_s),
                                      on_result=self.metrics.alert_result if self.metrics else None,
                                      on_dead=self.metrics.alert_dead if self.metrics else None,
                                      memory=self.ticker.memory)  # issue 20: the daemon's delivery record
        except Exception as exc:  # noqa: BLE001
            log.error("alert delivery failed, retrying next tick: %s", _one_line(exc))
            return None

    def once(self, now: dt.datetime | None = None) -> TickReport | None:
        rep = self.tick_job(now)
        self.deliver_job(now)
        return rep

    # -- the loop -----------------------------------------------------------------

    def serve(self) -> int:
        # The jobs run in threads of their own, on the monotonic clock (watchdog.daemon.process.loop:
        # why not APScheduler's interval trigger); the main thread only waits for a signal, so
        # a SIGTERM at any moment (even during start-up) is honoured.
        tick_s = self.config.daemon.tick_s

        def skipped(job: str) -> Callable[[int], None]:
            def on_skip(n: int) -> None:
                log.warning("%s job skipped %d time(s): the previous one is still running", job, n)
                if self.metrics and job == "tick":
                    for _ in range(n):
                        self.metrics.tick_skipped()
            return on_skip

        def on_signal(signum: int, _frame: object) -> None:
            log.info("%s: finishing the current tick and exiting", signal.Signals(signum).name)
            self._stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

        reloading.install(self)
        try:
            self.publish(force=True)
        except Exception as exc:  # noqa: BLE001 — the tick retries publishing
            log.error("could not publish the settings yet: %s", _one_line(exc))
        if self._stop.is_set():
            return 0
        self.start_attesting()
        self.start_otlp()
        whoami.publish(self)  # for `agent-watchdog status`: now that its receivers listen
        jobs = [Periodic(name, fn, tick_s, self._stop, on_skip=skipped(name)).start()
                for name, fn in (("tick", self.tick_job), ("deliver", self.deliver_job))]
        sdnotify.notify("READY=1", "STATUS=watching")
        log.info("agent-watchdog watching %s every %g s (host %s, pid %d)",
                 self.engine.url.render_as_string(hide_password=True), tick_s, self.killer.host, os.getpid())
        try:
            while not self._stop.wait(1.0):
                if self.reload_requested:
                    self.reload_requested = False
                    reloading.reload(self, self.config.path)
        finally:
            sdnotify.notify("STOPPING=1")
            self._stop.set()
            for job in jobs:
                job.join()  # the running tick completes; no new one starts
            self.deliver_job()  # alerts the last tick queued leave with us, not with the next daemon
            self.stop_attesting()
        return 1 if self.lost_lease else 0


def _shards(engine: Engine, config: Config) -> ShardSet | None:
    """The judge's shards when `[daemon] shards` is set (None: it judges its host's runs)."""
    n = config.daemon.shards
    if not n:
        return None
    from watchdog.daemon.leases.shards import ShardSet
    from watchdog.store.leases import is_postgres

    if not is_postgres(engine):
        raise ConfigError(f"[daemon] shards = {n}: judging is sharded on a PostgreSQL store only (advisory "
                          f"locks); this store is {engine.dialect.name}: remove the key")
    log.info("judging sharded: %d shards shared by the store's daemons (PostgreSQL advisory locks)", n)
    return ShardSet(engine, n)


def _state_file(config: Config, engine: Engine) -> Memory:
    """The daemon's state file in state_dir (made 0700 if missing); loud when it cannot be."""
    from watchdog.store.memory import Memory, state_path

    state_dir = config.daemon.state_dir
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        return Memory(state_path(state_dir, engine.url, "state"))
    except OSError as exc:
        raise ConfigError(f"[daemon] state_dir = {state_dir!r}: cannot keep the daemon's state file there "
                          f"({exc.strerror}); the daemon's user must own the directory") from None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return scrub(f"{type(exc).__name__}: {text[0][:300] if text else ''}")
