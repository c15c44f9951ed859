"""Token prices: the one formula from tokens to euros, one model's price, and the [pricing] section.

Pure and light: the SDK prices steps with this from the table the daemon publishes
in the store; the daemon fills that table from `[prices."MODEL"]` overrides and from
genai-prices (USD, converted at `[pricing] eur_per_usd`; see watchdog.daemon.money.prices).

Token conventions (those of OpenAI and LangChain's usage_metadata): `tokens_in`
counts every input token, the cached ones included (`cached_tokens_in` <= tokens_in);
`tokens_out` counts every output token, the reasoning ones included
(`reasoning_tokens` <= tokens_out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

EUR_PER_USD = 0.86  # the documented default of [pricing] eur_per_usd
BUDGET_TZ = "UTC"  # the documented default of [pricing] budget_tz
PRICE_KEYS = ("input_eur_per_mtok", "output_eur_per_mtok", "cached_input_eur_per_mtok", "reasoning_eur_per_mtok")
REQUIRED_PRICE_KEYS = PRICE_KEYS[:2]
# The name that stands for "a step recorded without a model name" in alerts and metrics.
NO_MODEL = "(no model)"


@dataclass(frozen=True)
class PricingConfig:
    eur_per_usd: float = EUR_PER_USD
    budget_tz: str = BUDGET_TZ


@dataclass(frozen=True)
class Price:
    """EUR per million tokens of one model.

    `cached_input_eur_per_mtok` / `reasoning_eur_per_mtok`: None = the plain input /
    output price. `up_to_tokens_in`: the price holds for steps of at most that many
    input tokens (a tiered price above: the daemon prices those steps itself).
    """

    input_eur_per_mtok: float
    output_eur_per_mtok: float
    cached_input_eur_per_mtok: float | None = None
    reasoning_eur_per_mtok: float | None = None
    up_to_tokens_in: int | None = None

    def cost_eur(self, tokens_in: int, tokens_out: int, cached_tokens_in: int = 0,
                 reasoning_tokens: int = 0) -> float | None:
        """The step's cost, or None when this flat price does not apply (a higher tier)."""
        if self.up_to_tokens_in is not None and tokens_in > self.up_to_tokens_in:
            return None
        cached = min(cached_tokens_in, tokens_in)
        reasoning = min(reasoning_tokens, tokens_out)
        cached_price = self.input_eur_per_mtok if self.cached_input_eur_per_mtok is None else self.cached_input_eur_per_mtok
        reasoning_price = self.output_eur_per_mtok if self.reasoning_eur_per_mtok is None else self.reasoning_eur_per_mtok
        return ((tokens_in - cached) * self.input_eur_per_mtok + cached * cached_price
                + (tokens_out - reasoning) * self.output_eur_per_mtok + reasoning * reasoning_price) / 1e6

    def to_json(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {k: getattr(self, k) for k in PRICE_KEYS if getattr(self, k) is not None}
        if self.up_to_tokens_in is not None:
            out["up_to_tokens_in"] = self.up_to_tokens_in
        return out

    @classmethod
    def from_json(cls, raw: object) -> "Price | None":
        """A published price, or None when the row is malformed (written by hand, by an old daemon...)."""
        if not isinstance(raw, dict):
            return None
        values: dict[str, Any] = {}  # field → float (the prices) or int (up_to_tokens_in)
        for key in PRICE_KEYS:
            v = raw.get(key)
            if v is None and key not in REQUIRED_PRICE_KEYS:
                continue
            if not _amount(v):
                return None
            values[key] = float(v)
        limit = raw.get("up_to_tokens_in")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                return None
            values["up_to_tokens_in"] = limit
        return cls(**values)


def _amount(v: object) -> TypeGuard[float]:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0


def priceable_tokens(tokens_in: int, tokens_out: int) -> int:
    """The tokens a step asks a price for: a step of no tokens costs nothing whatever its model."""
    return tokens_in + tokens_out
