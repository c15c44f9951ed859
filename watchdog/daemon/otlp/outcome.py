"""What one request came to (Outcome: the OTLP partial_success), and the receiver's bounded memories."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(OrderedDict[K, V]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: K, value: V) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


@dataclass
class Outcome:
    accepted: int = 0
    rejected: int = 0
    reasons: list[str] | None = None
    throttled: bool = False  # a new run refused by [otlp] max_new_runs_per_min: the answer is 429

    def refuse(self, n: int, why: str) -> None:
        self.rejected += n
        self.reasons = (self.reasons or [])
        if why not in self.reasons:
            self.reasons.append(why)

    @property
    def message(self) -> str:
        return "; ".join(self.reasons or [])[:500]
