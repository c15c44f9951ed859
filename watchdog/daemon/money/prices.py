"""Daemon-side prices: `[prices."MODEL"]` overrides first, then genai-prices (pydantic's
maintained table, USD) converted at `[pricing] eur_per_usd`.

The SDK stays light: it prices a step only from the table the daemon publishes in
the store. A step it cannot price is written with no cost (NULL) and its tokens
counted as unpriced on the run; the daemon prices it here (at the step's own date:
genai-prices keeps prices by date), backfills the run's cost, and publishes the
model's price so the SDK prices the next steps itself. A model no table knows stays
unpriced: it is reported (watchdog.daemon.money.money), never silently costed at zero.

genai-prices is imported lazily: `import watchdog.daemon` stays cheap.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from collections.abc import Iterator
from types import ModuleType
from typing import Any, Mapping

from watchdog.core.pricing import NO_MODEL, Price

log = logging.getLogger("watchdog.prices")

MAX_KNOWN_MODELS = 5000  # bound the caches: model names come from the store


@dataclass(frozen=True)
class Match:
    """How genai-prices names a model string: its model ref and provider id."""

    ref: str
    provider_id: str | None
    provider: str  # genai-prices' provider id, for the record
    model_id: str


def _genai() -> ModuleType:
    import genai_prices  # noqa: F401 — a dependency of the daemon only

    module: ModuleType = genai_prices  # not followed by mypy (Any): a module all the same
    return module


def _candidates(model: str) -> Iterator[tuple[str, str | None]]:
    """The spellings to try: as given; "provider/model" and "provider:model" with the provider named."""
    yield model, None
    for sep in ("/", ":"):
        if sep in model:
            prefix, rest = model.split(sep, 1)
            if prefix and rest:
                yield rest, prefix
                yield rest, None


class PriceBook:
    """Resolves model names to prices and prices steps. One per daemon; caches, never I/O."""

    def __init__(self, overrides: Mapping[str, Price], eur_per_usd: float):
        self.overrides = dict(overrides)
        self.eur_per_usd = eur_per_usd
        self._matches: dict[str, Match | None] = {}
        self._published: dict[str, dict[str, float | int]] = {}

    # -- lookup ------------------------------------------------------------------

    def match(self, model: str) -> Match | None:
        """genai-prices' model for this name (cached, misses too), or None."""
        if model in self._matches:
            return self._matches[model]
        found = None
        try:
            gp = _genai()
            for ref, provider_id in _candidates(model):
                try:
                    calc = gp.calc_price(gp.Usage(input_tokens=0, output_tokens=0), ref, provider_id=provider_id)
                except LookupError:
                    continue
                found = Match(ref, provider_id, calc.provider.id, calc.model.id)
                break
        except Exception:  # noqa: BLE001 — a broken price table must not break the tick
            log.exception("genai-prices failed to look up %r; treated as unpriced", model)
        if len(self._matches) >= MAX_KNOWN_MODELS:
            self._matches.clear()
        self._matches[model] = found
        return found

    def known(self, model: str | None) -> bool:
        if not model:
            return False
        return model != NO_MODEL and (model in self.overrides or self.match(model) is not None)

    def cost_eur(self, model: str | None, at: dt.datetime, tokens_in: int, tokens_out: int,
                 cached_tokens_in: int = 0, reasoning_tokens: int = 0) -> float | None:
        """The step's cost in EUR at its date, or None when no table prices the model."""
        if not model or model == NO_MODEL:
            return None
        tokens_in, tokens_out = max(0, tokens_in or 0), max(0, tokens_out or 0)
        cached = min(max(0, cached_tokens_in or 0), tokens_in)
        reasoning = min(max(0, reasoning_tokens or 0), tokens_out)
        override = self.overrides.get(model)
        if override is not None:
            cost = override.cost_eur(tokens_in, tokens_out, cached, reasoning)
            if cost is not None:
                return cost
        m = self.match(model)
        if m is None:
            return None
        gp = _genai()
        usage = gp.Usage(input_tokens=tokens_in, output_tokens=tokens_out, cache_read_tokens=cached,
                         output_reasoning_tokens=reasoning)
        try:
            calc = gp.calc_price(usage, m.ref, provider_id=m.provider_id, genai_request_timestamp=at)
        except (LookupError, ValueError):
            return None
        return float(calc.total_price) * self.eur_per_usd

    # -- what the SDK gets ----------------------------------------------------------

    def flat_price(self, model: str, now: dt.datetime) -> Price | None:
        """The model's price today as a flat EUR table row the SDK can apply (tiers: up to the first)."""
        m = self.match(model)
        if m is None:
            return None
        gp = _genai()
        try:
            mp = gp.calc_price(gp.Usage(input_tokens=0, output_tokens=0), m.ref, provider_id=m.provider_id,
                               genai_request_timestamp=now).model_price
        except (LookupError, ValueError):
            return None
        limit: int | None = None  # input tokens the flat price holds up to (a tiered price)

        def eur(value: Any) -> float | None:  # genai-prices' Decimal or TieredPrices (not followed: Any)
            nonlocal limit
            if value is None:
                return None
            base = getattr(value, "base", None)
            if base is not None:  # TieredPrices: the base price holds up to the first tier
                first = min(t.start for t in value.tiers) if value.tiers else None
                if first is not None:
                    limit = first if limit is None else min(limit, first)
                value = base
            return float(value) * self.eur_per_usd

        inp, out = eur(mp.input_mtok), eur(mp.output_mtok)
        if inp is None or out is None:
            return None  # priced by something other than tokens (audio, requests): the daemon prices it
        return Price(inp, out, eur(mp.cache_read_mtok), eur(mp.output_reasoning_mtok), limit)

    def learn(self, model: str, now: dt.datetime) -> bool:
        """Add a resolved model to the published table; True when the table changed."""
        if model in self.overrides or model in self._published or not model or model == NO_MODEL:
            return False
        price = self.flat_price(model, now)
        if price is None:
            return False
        if len(self._published) >= MAX_KNOWN_MODELS:
            return False
        self._published[model] = price.to_json()
        return True

    def published(self) -> dict[str, dict[str, float | int]]:
        """The price table for the SDK: resolved models, then the overrides (which win)."""
        out = dict(self._published)
        out.update({k: v.to_json() for k, v in self.overrides.items()})
        return out
