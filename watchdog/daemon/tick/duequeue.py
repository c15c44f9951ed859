"""The due-queue: every active run's next deadlines, soonest first (issue 25).

The tick evaluates the runs that changed (watchdog.store.changes) and the runs whose deadline
came (this queue): an idle run costs its place in a heap, nothing per tick. Deadlines are epoch
seconds on the store's clock, computed by watchdog.core.deadlines; one entry per (run, why),
a later push for the same pair replacing the earlier one.

Nothing here is trusted to survive a restart: the tick rebuilds the queue at each full tick
from every active run's light row (`load`, watchdog.daemon.tick.activeset), a restart and a jump of
the wall clock included. `shift` (every deadline moved by a jump, keeping its distance from now)
is for a holder that keeps its queue across a jump.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import NamedTuple

from watchdog.core.deadlines import Deadline, Why

__all__ = ["Due", "DueQueue", "Why"]


class Due(NamedTuple):
    at_s: float
    run_id: str
    why: Why


class DueQueue:
    """A heap of (deadline, run id, why) with lazy deletion. Not thread-safe (the tick's own)."""

    def __init__(self) -> None:
        # (deadline less the offset, token, run id, why); an entry is live while its token is
        # the one `_live` holds for (run id, why).
        self._heap: list[tuple[float, int, str, Why]] = []
        self._live: dict[str, dict[Why, tuple[int, float]]] = {}  # run id -> why -> (token, stored deadline)
        self._token = 0
        self._count = 0
        # Added to every stored deadline: a clock jump moves them all at once, without a rebuild.
        self._offset_s = 0.0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._live

    def push(self, run_id: str, at_s: float, why: Why) -> None:
        """Schedule (or move) the run's deadline for `why`. A deadline moved later keeps its
        heap entry, which `pop_due` moves when it comes (a run that writes moves its silence
        deadline later at every write: no heap push for it)."""
        if not math.isfinite(at_s):
            raise ValueError(f"deadline must be a finite epoch second, got {at_s!r}")
        if why.__class__ is not Why:
            why = Why(why)
        stored = at_s - self._offset_s
        mine = self._live.get(run_id)
        if mine is None:
            mine = self._live[run_id] = {}
        was = mine.get(why)
        if was is None:
            self._count += 1
        elif stored >= was[1]:
            mine[why] = (was[0], stored)  # later (or the same): the entry in the heap stays live
            return
        self._token += 1
        mine[why] = (self._token, stored)
        heapq.heappush(self._heap, (stored, self._token, run_id, why))
        self._compact()

    def reschedule(self, run_id: str, deadlines: Iterable[Deadline]) -> None:
        """Replace every deadline of the run with these (none: the run leaves the queue)."""
        keep: dict[Why, float] = {}
        for d in deadlines:
            keep[d.why if d.why.__class__ is Why else Why(d.why)] = d.at_s
        mine = self._live.get(run_id)
        if mine is not None:
            for why in [w for w in mine if w not in keep]:
                self.discard(run_id, why)
        for why, at_s in keep.items():
            self.push(run_id, at_s, why)

    def load(self, deadlines: Iterable[tuple[str, Deadline]]) -> None:
        """Replace the whole queue with these (run id, deadline): one heapify, not a push each
        (a full tick reschedules every active run)."""
        self.clear()
        self._offset_s = 0.0
        heap, live = self._heap, self._live
        for run_id, d in deadlines:
            if not math.isfinite(d.at_s):
                continue  # no such time: the run is looked at when it changes, and by the full tick
            why = Why(d.why)
            self._token += 1
            mine = live.setdefault(run_id, {})
            if why not in mine:
                self._count += 1
            mine[why] = (self._token, d.at_s)
            heap.append((d.at_s, self._token, run_id, why))
        heapq.heapify(heap)
        self._compact()

    def discard(self, run_id: str, why: Why | None = None) -> None:
        """Forget the run's deadline for `why` (None: all of them). Unknown runs are fine."""
        mine = self._live.get(run_id)
        if mine is None:
            return
        if why is None:
            self._count -= len(mine)
            del self._live[run_id]
            return
        if mine.pop(Why(why), None) is not None:
            self._count -= 1
            if not mine:
                del self._live[run_id]

    def pop_due(self, now_s: float) -> list[Due]:
        """Every deadline at or before `now_s`, soonest first, removed from the queue."""
        heap, out = self._heap, []
        limit = now_s - self._offset_s
        while heap and heap[0][0] <= limit:
            stored, token, run_id, why = heapq.heappop(heap)
            mine = self._live.get(run_id)
            live = None if mine is None else mine.get(why)
            if mine is None or live is None or live[0] != token:
                continue  # replaced or discarded since
            if live[1] > stored:  # moved later since it was pushed: it waits there
                heapq.heappush(heap, (live[1], token, run_id, why))
                continue
            del mine[why]
            if not mine:
                del self._live[run_id]
            self._count -= 1
            out.append(Due(stored + self._offset_s, run_id, why))
        return out

    def peek(self) -> float | None:
        """The soonest live deadline (epoch seconds), or None: how long the loop may sleep."""
        heap = self._heap
        while heap:
            stored, token, run_id, why = heap[0]
            mine = self._live.get(run_id)
            live = None if mine is None else mine.get(why)
            if live is not None and live[0] == token:
                if live[1] <= stored:
                    return stored + self._offset_s
                heapq.heapreplace(heap, (live[1], token, run_id, why))  # moved later: put it there
                continue
            heapq.heappop(heap)
        return None

    def deadlines(self, run_id: str) -> list[Due]:
        """The run's live deadlines, soonest first."""
        mine = self._live.get(run_id, {})
        return sorted(Due(stored + self._offset_s, run_id, why) for why, (_t, stored) in mine.items())

    def shift(self, delta_s: float) -> None:
        """The wall clock jumped by `delta_s` (forward > 0): every deadline moves with it."""
        if not math.isfinite(delta_s):
            raise ValueError(f"clock jump must be finite, got {delta_s!r}")
        self._offset_s += delta_s

    def clear(self) -> None:
        self._heap.clear()
        self._live.clear()
        self._count = 0

    def _compact(self) -> None:
        """Drop replaced entries once they outnumber the live ones (moved deadlines pile up)."""
        if len(self._heap) > 2 * self._count + 64:
            # The live entries, each at its deadline now (one moved later waited at the old one).
            self._heap = [(live[1], e[1], e[2], e[3]) for e in self._heap
                          if (m := self._live.get(e[2])) is not None and (live := m.get(e[3])) is not None
                          and live[0] == e[1]]
            heapq.heapify(self._heap)
