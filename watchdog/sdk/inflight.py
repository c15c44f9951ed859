"""Which tool a run is stuck in, for tools that never return.

A tool event is written when the call returns, so a call that hangs leaves no
trace of its tool: the heartbeat-timeout alert could only name the last tool
that answered. A background thread of the SDK writes, for calls still running
after `announce_after_s`, the run's `progress` ("in scan_archive since
14:03:05, no answer yet"). It never touches `last_seen_at`: a hung run still
looks hung to the daemon, the alert just says where.

The same thread makes a stop reach a tool that is still running: once a second it
reads the status of the runs with a tool in flight (one SELECT, only while some call
has been running for a second or more) and sets `run.cancelled` of those asked to stop
(or whose parent run was), so a long tool can return early.

The hot path pays two dict operations per tool call; the thread wakes once a
second and writes only for slow calls.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from watchdog.sdk.seams import RunLike, WatchdogLike

ANNOUNCE_AFTER_S = 2.0
POLL_S = 1.0


class InflightTools:
    def __init__(self, wd: WatchdogLike, announce_after_s: float = ANNOUNCE_AFTER_S) -> None:
        self.wd = wd
        self.announce_after_s = announce_after_s
        self._calls: dict[int, list[Any]] = {}  # token -> [run, tool, t0 monotonic, started at, announced]
        self._lock = threading.Lock()
        self._tokens = itertools.count()
        self._thread_pid: int | None = None

    def started(self, run: RunLike, tool: str) -> int:
        token = next(self._tokens)
        with self._lock:
            self._calls[token] = [run, tool, time.monotonic(), dt.datetime.now(dt.timezone.utc), False]
        if self._thread_pid != os.getpid():  # first call, or a forked child: threads do not survive fork
            self._start()
        return token

    def finished(self, token: int) -> None:
        with self._lock:
            call = self._calls.pop(token, None)
        if call is not None and call[4]:  # it was announced as hanging: say it answered after all
            run, tool, t0 = call[0], call[1], call[2]
            self._write(run, f"{tool} answered after {time.monotonic() - t0:.0f} s")

    def _start(self) -> None:
        self._thread_pid = os.getpid()
        threading.Thread(target=self._loop, name="agent-watchdog-inflight", daemon=True).start()

    def _loop(self) -> None:
        while True:
            time.sleep(POLL_S)
            now = time.monotonic()
            with self._lock:
                due = [c for c in self._calls.values() if not c[4] and now - c[2] >= self.announce_after_s]
                for c in due:
                    c[4] = True
                polled = {id(c[0]): c[0] for c in self._calls.values()
                          if now - c[2] >= POLL_S and not c[0].cancelled.is_set()}
            for run, tool, _t0, started_at, _ in due:
                self._write(run, f"in {tool} since {started_at.astimezone():%H:%M:%S}, no answer yet")
            if polled:
                self._poll(list(polled.values()))

    def _poll(self, in_flight: list[RunLike]) -> None:
        """Set `cancelled` on the runs (with a tool in flight) whose row, or an ancestor's, says stop."""
        from watchdog.sdk.obey import obeyed_stop
        from watchdog.store.lineage import poll_statuses

        ids = sorted({i for run in in_flight for i in run.lineage.ids})
        try:
            rows = poll_statuses(self.wd.writer, ids)
        except Exception:  # noqa: BLE001 — the store is down: the tool's own record will see the stop
            return
        by_id = {r.id: r for r in rows}
        for run in in_flight:
            for rid in run.lineage.ids:  # its own row first, then its ancestors'
                row = by_id.get(rid)
                stop = obeyed_stop(row, run.id) if row is not None else None
                if stop is not None:
                    run.cancel(stop)
                    break

    def _write(self, run: RunLike, progress: str) -> None:
        try:
            self.wd.writer.transaction([(self.wd.writer.sql.set_progress, (progress[:500], run.id))])
        except Exception:  # noqa: BLE001 — a note for humans: never worth failing or buffering for
            pass
