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

Stop reasons and comparisons are the budgets' own (watchdog.core.budgets), so a
run stopped in-process and a run stopped by the daemon read the same in the store.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any, Mapping

from watchdog.core import lifecycle as lc
from watchdog.core.budgets import BUDGETS, BY_KEY, Budget
from watchdog.errors import RunKilled

OSCILLATION_WINDOW = 4  # A-B-A-B
_WALL = BY_KEY["max_wall_s"]
_IDENTICAL = BY_KEY["max_identical_calls"]
# The budgets a model call adds to, and those a tool call adds to: guarded before each.
_ON_STEP = tuple(b for b in BUDGETS if b.counted_on == "step")
_ON_TOOL = tuple(b for b in BUDGETS if b.counted_on == "tool")


class Guard:
    """The budgets of one run and its counters. Thread-safe (a run may call tools from several threads).

    `budgets` maps a budget key to its limit; a missing (or None) key is no limit."""

    def __init__(self, budgets: Mapping[str, Any]) -> None:
        self.budgets = dict(budgets)  # a profile's JSON (Budgets.to_json): limits and settings
        self.used: dict[str, float] = {b.measure: 0 for b in BUDGETS if b.counted_on}
        self.signatures: Counter[tuple[str, str]] = Counter()  # (tool, args hash) → logical calls
        self.recent: deque[tuple[str, str]] = deque(maxlen=OSCILLATION_WINDOW)
        self._lock = threading.Lock()

    @property
    def steps(self) -> int:
        return int(self.used["steps"])

    @property
    def tool_calls(self) -> int:
        return int(self.used["tool_calls"])

    @property
    def cost_eur(self) -> float:
        return float(self.used["cost_eur"])

    def _limit(self, key: str) -> Any:  # a number, or None: no limit (Budget.over is then False)
        return self.budgets.get(key)

    def _refuse_next(self, budgets: tuple[Budget, ...], pending: Mapping[str, float]) -> None:
        """RunKilled if adding `pending` would take a counted budget over its limit. Caller holds the lock."""
        for b in budgets:
            cap = self._limit(b.key)
            now = self.used[b.measure]
            add = pending.get(b.measure, 0)
            if b.over(now + add, cap):
                if b.unit:  # an amount: what is spent and what this call is estimated to add
                    text = (f"{b.fmt(now, cap)} {b.unit} spent + {b.fmt(add, cap)} estimated would exceed "
                            f"{b.key} {b.fmt(cap, cap)} (in-process guard)")
                else:
                    text = f"{b.label} {int(now + add)} would exceed {b.key} {int(cap)} (in-process guard)"
                raise RunKilled(b.reason, text)

    def _refuse_over(self, budgets: tuple[Budget, ...]) -> None:
        for b in budgets:
            cap = self._limit(b.key)
            if b.over(self.used[b.measure], cap):
                raise RunKilled(b.reason, f"{b.detail(self.used[b.measure], cap)} (in-process guard)")

    # -- model calls -----------------------------------------------------------

    def before_model(self, estimated_cost_eur: float, elapsed_s: float, estimated_tokens: int = 0) -> None:
        """Pre-flight for one model call: wall-clock, then every budget a step adds to
        (steps, money spent + this call's estimate, ...)."""
        self.check_wall(elapsed_s)
        with self._lock:
            self._refuse_next(_ON_STEP, {"steps": 1, "cost_eur": estimated_cost_eur, "tokens": estimated_tokens})

    def after_step(self, cost_eur: float, tokens: int = 0) -> None:
        """Count a model call that happened (its cost is spent, whatever the budget says)."""
        with self._lock:
            self.used["steps"] += 1
            self.used["cost_eur"] += cost_eur
            if "tokens" in self.used:
                self.used["tokens"] += tokens

    def check_totals(self, elapsed_s: float) -> None:
        """After a recorded step: stop now if the run is already over a budget.

        With `check_budget` before every model call this only fires when a call
        cost more than its estimate (the at-most-one-call overshoot); without the
        pre-flight it is the only in-process check on steps and money.
        """
        with self._lock:
            self._refuse_over(_ON_STEP)
        self.check_wall(elapsed_s)

    def check_wall(self, elapsed_s: float) -> None:
        cap = self._limit(_WALL.key)
        if _WALL.over(elapsed_s, cap):
            raise RunKilled(_WALL.reason, f"{_WALL.detail(elapsed_s, cap)} (in-process guard)")

    # -- tool calls ------------------------------------------------------------

    def before_tool(self, tool: str, args_hash: str, elapsed_s: float, *, cached: bool = False) -> None:
        """Admit one logical tool call: wall-clock, tool-call budget, loops. Counts its signature.

        `cached`: the call will be served from the dedupe cache; it does not use
        a tool call of the budget but is a repeat all the same (loops still trip).
        Like the daemon, N identical calls are a loop: the N-th is refused before it runs.
        """
        self.check_wall(elapsed_s)
        sig = (tool, args_hash)
        with self._lock:
            if not cached:
                self._refuse_next(_ON_TOOL, {"tool_calls": 1})
            same = self._limit(_IDENTICAL.key)
            if _IDENTICAL.over(self.signatures[sig] + 1, same):
                raise RunKilled(lc.LOOP_DETECTED,
                                f"{tool} would be called {self.signatures[sig] + 1}× with identical arguments "
                                f"(max_identical_calls {same}, in-process guard)")
            if oscillates(list(self.recent) + [sig]):
                a, b = self.recent[-1][0], tool
                raise RunKilled(lc.LOOP_DETECTED,
                                f"oscillation {b}-{a}-{b}-{a} with identical arguments (in-process guard)")
            self.signatures[sig] += 1
            self.recent.append(sig)

    def before_retry(self, elapsed_s: float) -> None:
        """Before a retry attempt of an admitted call: wall-clock and the tool-call budget only."""
        self.check_wall(elapsed_s)
        with self._lock:
            self._refuse_next(_ON_TOOL, {"tool_calls": 1})

    def absorb(self, steps: int, tool_calls: int, cost_eur: float, tokens: int = 0) -> None:
        """A child run's records count on its parent's budgets too (never on its loops)."""
        with self._lock:
            self.used["steps"] += steps
            self.used["tool_calls"] += tool_calls
            self.used["cost_eur"] += cost_eur
            if "tokens" in self.used:
                self.used["tokens"] += tokens

    def at_least(self, **used: float) -> None:
        """Raise these counters (measures: steps, tool_calls, cost_eur, tokens) to at least the
        values given: a witness of a run another writer owns judges by the larger of its own
        count and the run's, never their sum (both saw the same calls)."""
        with self._lock:
            for measure, value in used.items():
                self.used[measure] = max(self.used.get(measure, 0), value)

    def count_tool_call(self) -> None:
        """One attempt was made and recorded (ok, error or fail-fast)."""
        with self._lock:
            self.used["tool_calls"] += 1


def oscillates(signatures: list[tuple[str, str]]) -> bool:
    """True for A-B-A-B over the last four calls (A != B): two calls taking turns, going nowhere."""
    if len(signatures) < OSCILLATION_WINDOW:
        return False
    a, b, c, d = signatures[-OSCILLATION_WINDOW:]
    return a == c and b == d and a != b
