"""One sending lane per alert target: targets are sent to concurrently, and a target that
hangs delays no other and holds at most one thread.

A lane's thread sends its alerts one after another until the deadline it was given. At
the deadline the caller stops waiting: whatever the lane did not finish counts as failed
(the outbox retries it later, with backoff) and its thread is abandoned; it ends when its
socket answers or times out. While it lives the lane takes no new work, so a target that
never answers holds one thread, never one more per pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Target = Any  # anything with an `id` (watchdog.daemon.notify.Target)
Result = Any
Job = tuple[Hashable, str, str]  # (key, title, body)

BUSY = "not sent: the previous send to this target has not returned yet (it hangs); retried later"
ABANDONED = "no answer before the delivery pass's deadline: abandoned, retried later"
NOT_TRIED = "not tried: the delivery pass's time ran out while this target was slow; retried later"


@dataclass
class _Run:
    jobs: Sequence[Job]
    thread: threading.Thread | None = None
    results: dict = field(default_factory=dict)  # key -> result
    current: Hashable | None = None
    abandoned: bool = False


class Lanes:
    def __init__(self, send: Callable[[Target, str, str], Result], fail: Callable[[Target, str], Result]):
        self._send = send  # must return a result for every target, even one that is down
        self._fail = fail  # the result of a send that did not happen or did not finish
        self._lock = threading.Lock()
        self._last: dict[str, _Run] = {}  # target id -> its lane's last run
        # Sends that succeeded after their pass stopped waiting: the next pass counts them instead of
        # sending again (a target that is merely slow would otherwise get every alert twice).
        self._late: dict[str, dict[Hashable, Result]] = {}

    def busy(self) -> list[str]:
        """Ids of the targets whose abandoned send is still running."""
        with self._lock:
            return [tid for tid, run in self._last.items() if run.thread is not None and run.thread.is_alive()]

    def run(self, work: Mapping[Target, Sequence[Job]], deadline: float) -> dict[tuple[Hashable, str], Result]:
        """Send each target its jobs, every target in its own thread, until `deadline`
        (time.monotonic()); one result per (key, target id), never an exception."""
        out: dict[tuple[Hashable, str], Result] = {}
        started: dict[Target, _Run] = {}
        for target, jobs in work.items():
            with self._lock:  # only the keys this pass asks for: the others wait for theirs
                late = self._late.get(target.id, {})
                for key, _, _ in jobs:
                    if key in late:
                        out[(key, target.id)] = late.pop(key)
                if not late:
                    self._late.pop(target.id, None)
            jobs = [j for j in jobs if (j[0], target.id) not in out]
            if not jobs:
                continue
            with self._lock:  # checked and taken at once: two callers never start two threads for one target
                prev = self._last.get(target.id)
                if prev is not None and prev.thread is not None and prev.thread.is_alive():
                    for key, _, _ in jobs:
                        out[(key, target.id)] = self._fail(target, BUSY)
                    continue
                run = _Run(jobs)
                run.thread = threading.Thread(target=self._work, args=(target, run, deadline), daemon=True,
                                              name=f"alert-lane-{target.id}")
                self._last[target.id] = run
                run.thread.start()
            started[target] = run
        for run in started.values():
            run.thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            for target, run in started.items():
                run.abandoned = True  # a result that comes later is not counted: it was counted as failed
                for key, _, _ in run.jobs:
                    result = run.results.get(key)
                    if result is None:
                        result = self._fail(target, ABANDONED if key == run.current else NOT_TRIED)
                    out[(key, target.id)] = result
        return out

    def _work(self, target: Target, run: _Run, deadline: float) -> None:
        for key, title, body in run.jobs:
            with self._lock:
                if run.abandoned or time.monotonic() >= deadline:
                    return
                run.current = key
            try:
                result = self._send(target, title, body)
            except Exception as exc:  # noqa: BLE001 — the sender should not raise; the lane must not die
                result = self._fail(target, f"delivery failed: {type(exc).__name__}")
            with self._lock:
                if run.abandoned:
                    if getattr(result, "ok", False):
                        late = self._late.setdefault(target.id, {})
                        if len(late) < 1000:
                            late[key] = result
                    return
                run.results[key] = result
