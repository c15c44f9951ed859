"""A coding CLI's claimed cost (Claude Code's `cost_usd` on `claude_code.api_request`): read as a
finite amount >= 0 whatever the sender put there, and taken as a step's cost only for a model no
price table knows (watchdog.daemon.otlp.logs.usd, watchdog.daemon.otlp.logruns.claimed)."""

from __future__ import annotations

import math

import pytest

from watchdog.core.pricing import Price
from watchdog.daemon.money.prices import PriceBook
from watchdog.daemon.otlp.logruns import claimed
from watchdog.daemon.otlp.logs import MAX_CLAIM_USD, sessions, usd


@pytest.mark.parametrize("value, want", [
    (0.25, 0.25), (3, 3.0), ("0.5", 0.5), (0, 0.0), (1e308, MAX_CLAIM_USD), ("1e308", MAX_CLAIM_USD),
    (-1, None), ("-0.1", None), (math.nan, None), ("nan", None), (math.inf, None), ("inf", None),
    ("abc", None), (True, None), (None, None), ({"x": 1}, None), ([1], None), (10 ** 400, None), ("9" * 500, MAX_CLAIM_USD),
])
def test_a_claimed_cost_is_a_finite_amount_or_none(value, want):
    assert usd(value) == want


def api_request(model: str, cost: object) -> tuple[dict, str, dict]:
    return ({}, "claude_code.api_request", {"session.id": "s1", "model": model, "input_tokens": 100,
                                            "output_tokens": 20, "cost_usd": cost})


def test_the_claim_is_the_cost_of_an_unpriced_model_only():
    book = PriceBook({"known-model": Price(1.0, 2.0)}, eur_per_usd=0.5)
    found = sessions([api_request("known-model", 50.0), api_request("known-model", 0.0),
                      api_request("unknown-model-x", 0.004), api_request("unknown-model-x", 0),
                      api_request("unknown-model-x", -5), api_request("unknown-model-x", "NaN"),
                      api_request("unknown-model-x", 1e308), api_request("", 0.002)])
    claimed(found, book)
    (s,) = found
    # A priced model keeps the daemon's price, whatever it claims (high or 0): unpriced here, the
    # tick's backfill prices it. A claim of 0, or one that is not an amount, is no cost.
    assert [c.cost_eur for c in s.calls] == [None, None, 0.002, None, None, None, MAX_CLAIM_USD * 0.5, 0.001]
