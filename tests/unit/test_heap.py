"""The daemon's heap freezer (watchdog.daemon.tick.heap): a full collection, then a freeze, at most
every `every_s`, so the kept runs are not walked by a full collection every few ticks."""

from __future__ import annotations

import gc

from watchdog.daemon.tick.heap import HeapFreezer


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_the_heap_is_frozen_after_a_collection_at_most_every_period() -> None:
    clock = [100.0]
    heap = HeapFreezer(60.0, clock=lambda: clock[0])
    try:
        garbage = Cycle()
        del garbage  # a cycle: only the collector frees it, and it must not be frozen
        assert heap.after_full_tick()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        assert not any(isinstance(o, Cycle) for o in gc.get_objects())  # collected, not frozen
        kept = [Cycle() for _ in range(10)]
        clock[0] += 30.0
        assert not heap.after_full_tick()  # within the period: nothing collected, nothing frozen
        # (Not ==: a frozen object that loses its last reference meanwhile, in any thread of the
        # test process, leaves the count by reference counting.)
        assert gc.get_freeze_count() <= frozen
        tracked = {id(o) for g in (0, 1, 2) for o in gc.get_objects(generation=g)}
        assert id(kept[0]) in tracked  # in the collector's generations: not frozen
        clock[0] += 31.0
        assert heap.after_full_tick() and heap.rounds == 2
        young_or_old = {id(o) for g in (0, 1, 2) for o in gc.get_objects(generation=g)}
        assert not any(id(k) in young_or_old for k in kept)  # what the daemon holds now is frozen too
    finally:
        gc.unfreeze()  # the test process's heap is not ours to keep frozen
