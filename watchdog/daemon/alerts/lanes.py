"""One sending lane per alert target: targets are sent to concurrently, each in order, and a
slow target delays no other and never gets an alert twice.

A lane is a queue and one thread that sends its jobs one after another, in the order they
were queued (the outbox queues them in the order their interventions happened). A pass
waits for its jobs until its deadline, then stops waiting — it never abandons a send: the
lane goes on, and what it finishes later is handed to the next pass that asks (PENDING
meanwhile: not a failure, nothing is sent again). When a send fails, the jobs queued behind
it for that target are HELD (not sent: they go after it, in order). A send still running
past `hard_limit_s` is given up as HUNG (the outbox dead-letters it for that target) and its
thread is left to die with its socket, so the target's later alerts still go.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class LaneTarget(Protocol):
    """What a lane needs of a target (watchdog.daemon.alerts.notify.Target): its id names the lane."""

    @property
    def id(self) -> str: ...


class LaneResult(Protocol):
    """What a lane reads of a send's result (watchdog.daemon.alerts.notify.TargetResult)."""

    @property
    def ok(self) -> bool: ...
    @property
    def error(self) -> str | None: ...


Target = TypeVar("Target", bound=LaneTarget)
Result = TypeVar("Result", bound=LaneResult)
Job = tuple[Hashable, *tuple[str, ...]]  # (key, title, body[, notify kind]): the rest is passed to `send`

PENDING = "still being sent in this target's lane (a slow target): recorded when it returns, never sent twice"
HELD = "held: an earlier alert to this target has not gone yet; sent after it, in order"
HUNG = "dead letter for this target: its send hung past the hard limit"
KEPT_RESULTS = 10_000  # finished results a lane keeps for a pass that never asks again (bounded)


def pending(result: Result) -> bool:
    return getattr(result, "error", None) == PENDING


def held(result: Result) -> bool:
    return getattr(result, "error", None) == HELD


def hung(result: LaneResult) -> bool:
    return (result.error or "").startswith(HUNG)


@dataclass
class _Lane(Generic[Result]):
    queue: deque[Job] = field(default_factory=deque)  # jobs not started yet, in order
    keys: set[Hashable] = field(default_factory=set)  # queued or in flight
    results: dict[Hashable, Result] = field(default_factory=dict)  # key -> result, finished, not handed out yet
    current: Hashable | None = None
    started_at: float = 0.0  # time.monotonic() when `current` began
    thread: threading.Thread | None = None


class Lanes(Generic[Target, Result]):
    def __init__(self, send: Callable[[Target, str, str], Result], fail: Callable[[Target, str], Result],
                 hard_limit_s: float = 60.0):
        self._send = send  # must return a result for every target, even one that is down
        self._fail = fail  # the result of a send that did not happen or did not finish
        self.hard_limit_s = hard_limit_s
        self._cond = threading.Condition()
        self._lanes: dict[str, _Lane[Result]] = {}  # target id -> its lane

    def busy(self) -> list[str]:
        """Ids of the targets whose lane is still sending."""
        with self._cond:
            return [tid for tid, lane in self._lanes.items() if lane.thread is not None and lane.thread.is_alive()]

    def run(self, work: Mapping[Target, Sequence[Job]], deadline: float) -> dict[tuple[Hashable, str], Result]:
        """Queue each target's jobs in its lane (each job once, however many passes ask) and wait
        for them until `deadline` (time.monotonic()); one result per (key, target id), never an
        exception: PENDING for a job its lane has not finished yet."""
        asked: list[tuple[Target, Hashable]] = []
        with self._cond:
            for target, jobs in work.items():
                lane = self._check_hung(target)
                for job in jobs:
                    asked.append((target, job[0]))
                    if job[0] not in lane.results and job[0] not in lane.keys:
                        lane.queue.append(job)
                        lane.keys.add(job[0])
                if lane.queue and (lane.thread is None or not lane.thread.is_alive()):
                    lane.thread = threading.Thread(target=self._work, args=(target, lane), daemon=True,
                                                   name=f"alert-lane-{target.id}")
                    lane.thread.start()
            self._cond.wait_for(lambda: all(k in self._lanes[t.id].results for t, k in asked),
                                max(0.0, deadline - time.monotonic()))
            out: dict[tuple[Hashable, str], Result] = {}
            for target, key in asked:
                lane = self._lanes[target.id]
                result = lane.results.pop(key, None)
                out[(key, target.id)] = result if result is not None else self._fail(target, PENDING)
            return out

    def _check_hung(self, target: Target) -> _Lane[Result]:
        """The target's lane; one whose send has run past the hard limit is replaced (its
        queue moves to a new thread) and that send is given up as HUNG."""
        lane = self._lanes.get(target.id)
        if lane is None:
            lane = self._lanes[target.id] = _Lane[Result]()
            return lane
        alive = lane.thread is not None and lane.thread.is_alive()
        if alive and lane.current is not None and time.monotonic() - lane.started_at > self.hard_limit_s:
            fresh = _Lane[Result](queue=lane.queue, keys=set(lane.keys) - {lane.current}, results=lane.results)
            fresh.results[lane.current] = self._fail(target, f"{HUNG} of {self.hard_limit_s:g} s")
            self._lanes[target.id] = fresh  # the old thread sees it is not its lane any more
            return fresh
        return lane

    def _work(self, target: Target, lane: _Lane[Result]) -> None:
        while True:
            with self._cond:
                if self._lanes.get(target.id) is not lane or not lane.queue:
                    lane.current = None
                    return
                key, *message = lane.queue.popleft()
                lane.current, lane.started_at = key, time.monotonic()
            try:
                result = self._send(target, *message)
            except Exception as exc:  # noqa: BLE001 — the sender should not raise; the lane must not die
                result = self._fail(target, f"delivery failed: {type(exc).__name__}")
            with self._cond:
                if self._lanes.get(target.id) is not lane:
                    return  # given up as hung meanwhile: its result was counted (at least once)
                lane.keys.discard(key)
                lane.current = None
                _keep(lane, key, result)
                if not result.ok:  # the rest go after this one, in order
                    while lane.queue:
                        k = lane.queue.popleft()[0]
                        lane.keys.discard(k)
                        _keep(lane, k, self._fail(target, HELD))
                self._cond.notify_all()


def _keep(lane: _Lane[Result], key: Hashable, result: Result) -> None:
    if len(lane.results) >= KEPT_RESULTS:
        lane.results.pop(next(iter(lane.results)))
    lane.results[key] = result
