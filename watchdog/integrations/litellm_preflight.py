"""A model call's pre-flight estimate for the LiteLLM callback: cheap on purpose (it runs before
every call through the proxy), so a budget overshoots by at most one call, as with the SDK's
`check_budget`."""

from __future__ import annotations

from typing import Any


class Estimate:
    """A model call's pre-flight estimate: its prompt's tokens and their cost, plus max_tokens out."""

    __slots__ = ("tokens", "cost_eur")

    def __init__(self, tokens: int = 0, cost_eur: float = 0.0):
        self.tokens = tokens
        self.cost_eur = cost_eur


CHARS_PER_TOKEN = 4  # the usual rule of thumb: LiteLLM's exact count costs ~10 ms a call
_PRICES: dict[str, tuple[float, float]] = {}  # model -> (USD per input token, USD per output token)


def _prices(model: str) -> tuple[float, float]:
    price = _PRICES.get(model)
    if price is None:
        try:
            import litellm

            usd_in, _ = litellm.cost_per_token(model=model, prompt_tokens=1_000_000, completion_tokens=0)
            _, usd_out = litellm.cost_per_token(model=model, prompt_tokens=0, completion_tokens=1_000_000)
            price = (max(0.0, float(usd_in)) / 1e6, max(0.0, float(usd_out)) / 1e6)
        except Exception:  # noqa: BLE001 — a model LiteLLM cannot price: tokens only
            price = (0.0, 0.0)
        if len(_PRICES) < 1000:
            _PRICES[model] = price
    return price


def _chars(value: Any, depth: int = 0) -> int:
    if isinstance(value, str):
        return len(value)
    if depth > 6:
        return 0
    if isinstance(value, dict):
        return sum(_chars(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return sum(_chars(v, depth + 1) for v in value)
    return 0


def preflight(data: dict | None, eur_per_usd: float) -> Estimate:
    """The request's estimated tokens (its text at CHARS_PER_TOKEN, plus max_tokens out) and their
    cost at LiteLLM's price for the model (0 where it has none): a budget then overshoots by at
    most this one call, as with the SDK's check_budget."""
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        return Estimate()
    prompt = _chars(data["messages"]) // CHARS_PER_TOKEN
    out = data.get("max_tokens") or data.get("max_completion_tokens") or 0
    out = out if isinstance(out, int) and not isinstance(out, bool) and 0 <= out < 2**31 else 0
    model = data.get("model")
    if not isinstance(model, str):
        model = ""
    usd_in, usd_out = _prices(model)
    return Estimate(prompt + out, (prompt * usd_in + out * usd_out) * eur_per_usd)
