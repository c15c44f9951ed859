"""Hostile review: a LiteLLM trace id is a claim, and two keys can claim the same one.

The callback's own run of a trace (no SDK or exec run by that id) is keyed by the trace id alone:
a second key (another team, another agent) that sends the same `x-litellm-trace-id` ("job-1", a
conversation id: free text the client picks) has its calls counted on the first key's run, so the
first key's next call was refused for a budget the second one spent (found by this review). Now
the callback's own runs are keyed by the key's agent and the trace: the other key's calls are a
run of its own. The handler is the shipped
`WatchdogProxyHandler`, called as the proxy calls it (pre-call hook, success event), on a real
store; the keys are LiteLLM's own `UserAPIKeyAuth`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import asyncio
import datetime as dt
from types import SimpleNamespace

from sqlalchemy import select

from watchdog.store.schema import runs

from watchdog.integrations.litellm import RESOLVED_KEY, WatchdogProxyHandler

TOML = "[defaults]\nmax_steps = 3\n"


def key(alias: str):
    from litellm.proxy._types import UserAPIKeyAuth

    return UserAPIKeyAuth(api_key=f"sk-{alias}", key_alias=alias)


def one_call(h: WatchdogProxyHandler, who, trace: str) -> str | None:
    """One model call through the proxy: the refusal text, or None once it went through and was logged."""
    from fastapi import HTTPException

    data = {"litellm_trace_id": trace, "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    try:
        asyncio.run(h.async_pre_call_hook(who, None, data, "completion"))
    except HTTPException as exc:
        return str(exc.detail)
    usage = SimpleNamespace(prompt_tokens=10, completion_tokens=5)
    kwargs = {"litellm_trace_id": trace, "model": "gpt-4o", "response_cost": 0.0,
              "litellm_params": {"metadata": {RESOLVED_KEY: data["metadata"][RESOLVED_KEY]}}}
    now = dt.datetime.now()
    asyncio.run(h.async_log_success_event(kwargs, SimpleNamespace(usage=usage), now, now))
    return None


@contextmanager
def handler(url: str, tmp_path, monkeypatch) -> Iterator[WatchdogProxyHandler]:
    """The shipped handler on the store at url, with TOML as its config; its SDK closed after."""
    cfg = tmp_path / "watchdog.toml"
    cfg.write_text(TOML)
    monkeypatch.setenv("AGENT_WATCHDOG_CONFIG", str(cfg))
    h = WatchdogProxyHandler(url)
    try:
        yield h
    finally:
        h.wd().close()


def test_another_keys_calls_with_the_same_trace_never_spend_the_first_keys_run(sqlite_url, tmp_path, monkeypatch):
    with handler(sqlite_url, tmp_path, monkeypatch) as h:
        assert one_call(h, key("alpha"), "job-1") is None  # alpha's first step
        for _ in range(3):  # bravo, another key, picks the same trace id
            one_call(h, key("bravo"), "job-1")
        assert one_call(h, key("alpha"), "job-1") is None  # alpha's second step: within its budget of 3
        with h.wd().engine.connect() as conn:
            rows = {r.agent: r for r in conn.execute(select(runs)).all()}
        assert (rows["alpha"].id, rows["alpha"].steps) == ("job-1", 2)
        assert rows["bravo"].id != "job-1" and rows["bravo"].steps == 3  # bravo's calls: a run of its own
