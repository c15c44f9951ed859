"""In-process guards: the SDK's cheap first line of defense. Pure: no I/O, no clock of its own.

They refuse the call that *would* exceed a budget (checked before the call), so
a money budget overshoots by at most the one call whose estimate was wrong. The
daemon stays the backstop for everything these cannot see.

Counting rules (they match what the store records, so the daemon sees the same numbers):

- a *step* is one model call; `after_step` counts it with its real cost;
- a *tool call* is one attempt that was recorded as a tool event: every retry
  attempt and every fail-fast on an open circuit counts, a dedupe hit (served
  from the cache, not recorded) does not;
- a *signature* (tool + args hash) counts once per logical call the agent asked
  for, dedupe hits included, retry attempts of that one call not: the retry
  policy is bounded by `retries` already, loops are about the agent asking again.

Stop reasons are the daemon's (watchdog.lifecycle), so a run stopped in-process
and a run stopped by the daemon read the same in the store.
"""

from __future__ import annotations

import threading
from collections import Counter, deque

from watchdog.core import lifecycle as lc
from watchdog.errors import RunKilled

OSCILLATION_WINDOW = 4  # A-B-A-B


class Guard:
    """The budgets of one run and its counters. Thread-safe (a run may call tools from several threads)."""

    def __init__(self, budgets: dict):
        self.budgets = dict(budgets)
        self.steps = 0
        self.tool_calls = 0
        self.cost_eur = 0.0
        self.signatures: Counter = Counter()
        self.recent: deque = deque(maxlen=OSCILLATION_WINDOW)
        self._lock = threading.Lock()

    def _limit(self, key):
        return self.budgets.get(key)

    # -- model calls -----------------------------------------------------------

    def before_model(self, estimated_cost_eur: float, elapsed_s: float):
        """Pre-flight for one model call: wall-clock, steps, and money spent + this call's estimate."""
        self.check_wall(elapsed_s)
        with self._lock:
            self._check_steps()
            cap = self._limit("max_cost_eur")
            if cap is not None and self.cost_eur + estimated_cost_eur > cap:
                raise RunKilled(
                    lc.MAX_COST,
                    f"{self.cost_eur:.4f} EUR spent + {estimated_cost_eur:.4f} estimated would exceed "
                    f"max_cost_eur {cap:.2f} (in-process guard)",
                )

    def before_step(self):
        """The steps budget alone (`before_model` without wall-clock and money)."""
        with self._lock:
            self._check_steps()

    def after_step(self, cost_eur: float):
        """Count a model call that happened (its cost is spent, whatever the budget says)."""
        with self._lock:
            self.steps += 1
            self.cost_eur += cost_eur

    def check_totals(self, elapsed_s: float):
        """After a recorded step: stop now if the run is already over a budget.

        With `check_budget` before every model call this only fires when a call
        cost more than its estimate (the at-most-one-call overshoot); without the
        pre-flight it is the only in-process check on steps and money.
        """
        with self._lock:
            cap = self._limit("max_steps")
            if cap is not None and self.steps > cap:
                raise RunKilled(lc.MAX_STEPS, f"{self.steps} steps > max_steps {cap} (in-process guard)")
            cap = self._limit("max_cost_eur")
            if cap is not None and self.cost_eur > cap:
                raise RunKilled(lc.MAX_COST,
                                f"{self.cost_eur:.4f} EUR spent > max_cost_eur {cap:.2f} (in-process guard)")
        self.check_wall(elapsed_s)

    def check_wall(self, elapsed_s: float):
        cap = self._limit("max_wall_s")
        if cap is not None and elapsed_s > cap:
            raise RunKilled(lc.WALL_CLOCK, f"running {elapsed_s:.0f} s > max_wall_s {cap:g} s (in-process guard)")

    # -- tool calls ------------------------------------------------------------

    def before_tool(self, tool: str, args_hash: str, elapsed_s: float, *, cached: bool = False):
        """Admit one logical tool call: wall-clock, tool-call budget, loops. Counts its signature.

        `cached`: the call will be served from the dedupe cache; it does not use
        a tool call of the budget but is a repeat all the same (loops still trip).
        Like the daemon, N identical calls are a loop: the N-th is refused before it runs.
        """
        self.check_wall(elapsed_s)
        sig = (tool, args_hash)
        with self._lock:
            if not cached:
                self._check_tool_budget()
            same = self._limit("max_identical_calls")
            if same is not None and self.signatures[sig] + 1 >= same:
                raise RunKilled(lc.LOOP_DETECTED,
                                f"{tool} would be called {self.signatures[sig] + 1}× with identical arguments "
                                f"(max_identical_calls {same}, in-process guard)")
            if oscillates(list(self.recent) + [sig]):
                a, b = self.recent[-1][0], tool
                raise RunKilled(lc.LOOP_DETECTED,
                                f"oscillation {b}-{a}-{b}-{a} with identical arguments (in-process guard)")
            self.signatures[sig] += 1
            self.recent.append(sig)

    def before_retry(self, elapsed_s: float):
        """Before a retry attempt of an admitted call: wall-clock and the tool-call budget only."""
        self.check_wall(elapsed_s)
        with self._lock:
            self._check_tool_budget()

    def count_tool_call(self):
        """One attempt was made and recorded (ok, error or fail-fast)."""
        with self._lock:
            self.tool_calls += 1

    def after_tool(self, tool: str | None = None, args_hash: str | None = None):
        """Count one recorded attempt of a call `before_tool` admitted (its signature is counted there).

        For integrations whose framework runs the tool itself: before_tool → run → after_tool.
        """
        self.count_tool_call()

    def _check_steps(self):
        cap = self._limit("max_steps")
        if cap is not None and self.steps + 1 > cap:
            raise RunKilled(lc.MAX_STEPS, f"step {self.steps + 1} would exceed max_steps {cap} (in-process guard)")

    def _check_tool_budget(self):
        cap = self._limit("max_tool_calls")
        if cap is not None and self.tool_calls + 1 > cap:
            raise RunKilled(lc.MAX_TOOL_CALLS,
                            f"tool call {self.tool_calls + 1} would exceed max_tool_calls {cap} (in-process guard)")


def oscillates(signatures: list) -> bool:
    """True for A-B-A-B over the last four calls (A != B): two calls taking turns, going nowhere."""
    if len(signatures) < OSCILLATION_WINDOW:
        return False
    a, b, c, d = signatures[-OSCILLATION_WINDOW:]
    return a == c and b == d and a != b
