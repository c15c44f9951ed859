"""The garbage collector and a daemon's big, long-lived heap (issue 25).

At 10,000 active runs the tick keeps a few hundred thousand objects between ticks (each run's
light row, tool statistics, tallies, deadlines). CPython's full collection walks all of them:
about 130 ms, every few ticks, landing on whichever tick allocates past the threshold. After a
full tick the daemon freezes what it holds (`gc.freeze`: later collections skip those objects),
after one real collection so that no garbage is frozen with it, at most every FREEZE_EVERY_S.
What a frozen object refers to is still freed by reference counting; only a cycle that becomes
garbage while frozen waits for the next round (`unfreeze`, collect, freeze again).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

FREEZE_EVERY_S = 600.0


class HeapFreezer:
    """Freezes the heap after a full tick, at most every FREEZE_EVERY_S of the monotonic clock."""

    def __init__(self, every_s: float = FREEZE_EVERY_S, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._next_s: float | None = None
        self.rounds = 0

    def after_full_tick(self) -> bool:
        """Call after a full tick went through; whether this froze the heap now."""
        now_s = self._clock()
        if self._next_s is not None and now_s < self._next_s:
            return False
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._next_s = now_s + self.every_s
        self.rounds += 1
        return True
