"""Token prices: the one formula from tokens to euros. Pure.

Prices come from the config (`[prices."MODEL"]`, EUR per million tokens) and are
published by the daemon for the SDK, which prices each step with `cost_eur`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Price:
    input_eur_per_mtok: float
    output_eur_per_mtok: float

    def cost_eur(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.input_eur_per_mtok + tokens_out * self.output_eur_per_mtok) / 1e6

    @classmethod
    def from_json(cls, raw: Any) -> "Price | None":
        """A published price (or a row written by hand); None when it is not a usable price."""
        if not isinstance(raw, dict):
            return None
        try:
            price = cls(float(raw["input_eur_per_mtok"]), float(raw["output_eur_per_mtok"]))
        except (KeyError, TypeError, ValueError):
            return None
        ok = all(math.isfinite(v) and v >= 0 for v in (price.input_eur_per_mtok, price.output_eur_per_mtok))
        return price if ok else None
