"""In-process guards: the SDK's cheap first line of defense. Pure: no I/O, no clock of its own.

They refuse the call that *would* exceed a budget (checked before the call), so
a money budget overshoots by at most the one call whose estimate was wrong. The
daemon stays the backstop for everything these cannot see.
"""

from __future__ import annotations

from collections import Counter, deque

from . import lifecycle as lc
from .errors import RunKilled

OSCILLATION_WINDOW = 4  # A-B-A-B


class Guard:
    def __init__(self, budgets: dict):
        self.budgets = budgets
        self.steps = 0
        self.tool_calls = 0
        self.cost_eur = 0.0
        self.signatures: Counter = Counter()
        self.recent: deque = deque(maxlen=OSCILLATION_WINDOW)

    def _limit(self, key):
        return self.budgets.get(key)

    def before_step(self):
        cap = self._limit("max_steps")
        if cap is not None and self.steps + 1 > cap:
            raise RunKilled(lc.MAX_STEPS, f"step {self.steps + 1} would exceed max_steps {cap} (in-process guard)")

    def after_step(self, cost_eur: float):
        self.steps += 1
        self.cost_eur += cost_eur

    def before_model(self, estimated_cost_eur: float, elapsed_s: float):
        self.check_wall(elapsed_s)
        self.before_step()
        cap = self._limit("max_cost_eur")
        if cap is not None and self.cost_eur + estimated_cost_eur > cap:
            raise RunKilled(
                lc.MAX_COST,
                f"{self.cost_eur:.4f} EUR spent + {estimated_cost_eur:.4f} estimated would exceed max_cost_eur {cap:.2f}"
                " (in-process guard)",
            )

    def check_wall(self, elapsed_s: float):
        cap = self._limit("max_wall_s")
        if cap is not None and elapsed_s > cap:
            raise RunKilled(lc.WALL_CLOCK, f"{elapsed_s:.0f} s > max_wall_s {cap:g} (in-process guard)")

    def before_tool(self, tool: str, args_hash: str, elapsed_s: float):
        """Budget and loop checks before a tool runs."""
        self.check_wall(elapsed_s)
        cap = self._limit("max_tool_calls")
        if cap is not None and self.tool_calls + 1 > cap:
            raise RunKilled(lc.MAX_TOOL_CALLS,
                            f"tool call {self.tool_calls + 1} would exceed max_tool_calls {cap} (in-process guard)")
        sig = (tool, args_hash)
        same = self._limit("max_identical_calls")
        # The daemon calls N identical calls a loop; the guard refuses the N-th before it runs.
        if same is not None and self.signatures[sig] + 1 >= same:
            raise RunKilled(lc.LOOP_DETECTED,
                            f"{tool} would be called {self.signatures[sig] + 1}× with identical arguments "
                            f"(max_identical_calls {same}, in-process guard)")
        if oscillates(list(self.recent) + [sig]):
            a, b = self.recent[-1][0], sig[0]
            raise RunKilled(lc.LOOP_DETECTED, f"oscillation {b}-{a}-{b}-{a} with identical arguments (in-process guard)")

    def after_tool(self, tool: str, args_hash: str):
        sig = (tool, args_hash)
        self.tool_calls += 1
        self.signatures[sig] += 1
        self.recent.append(sig)


def oscillates(signatures: list) -> bool:
    """True for A-B-A-B over the last four calls (A != B): two calls taking turns, going nowhere."""
    if len(signatures) < OSCILLATION_WINDOW:
        return False
    a, b, c, d = signatures[-OSCILLATION_WINDOW:]
    return a == c and b == d and a != b
