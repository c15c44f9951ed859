"""The daemon's jobs, every `interval_s` on the monotonic clock, one at a time each.

Why not APScheduler's interval trigger: APScheduler 3.x decides when a job is due and
how long to sleep from `datetime.now()` (BaseScheduler._process_jobs and the wait of
_main_loop); a trigger only returns wall-clock datetimes, so no custom trigger can take
the wall clock out. Stepped +1 h, its jobs all come due at once (bunched or "missed");
stepped -1 h, the scheduler sleeps for an hour and the daemon is blind. Here the deadline
is `time.monotonic()` based, which no clock step moves: the tick keeps its rhythm and the
clock jump itself is detected and handled by the tick (watchdog.daemon.tick.clock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("watchdog.daemon")


class Periodic:
    """`fn()` now and then every `interval_s` seconds, in a thread of its own until `stop` is set.

    One run at a time: a run longer than the interval delays the next one; the runs it
    overlapped are skipped (not queued up to fire in a burst) and `on_skip(n)` is told."""

    def __init__(self, name: str, fn: Callable[[], object], interval_s: float, stop: threading.Event,
                 on_skip: Callable[[int], None] | None = None):
        if not interval_s > 0:
            raise ValueError(f"interval_s: expected > 0, got {interval_s!r}")
        self.name = name
        self.fn = fn
        self.interval_s = float(interval_s)
        self.stop = stop
        self.on_skip = on_skip
        self.runs = 0
        self._thread = threading.Thread(target=self._loop, name=f"watchdog-{name}", daemon=True)

    def start(self) -> "Periodic":
        self._thread.start()
        return self

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the run in progress (if any) to finish; no new one starts once `stop` is set."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        due = time.monotonic()
        while not self.stop.is_set():
            try:
                self.fn()
            except Exception:  # noqa: BLE001 — the jobs catch their own; never let the thread die of one
                log.exception("%s job failed; retried at its next interval", self.name)
            self.runs += 1
            due += self.interval_s
            now = time.monotonic()
            if now > due:  # overran: skip the intervals it overlapped, keep the rhythm
                missed = int((now - due) // self.interval_s) + 1
                due += missed * self.interval_s
                if self.on_skip is not None:
                    try:
                        self.on_skip(missed)
                    except Exception:  # noqa: BLE001
                        log.exception("%s job: skip listener failed", self.name)
            self.stop.wait(max(0.0, due - now))
