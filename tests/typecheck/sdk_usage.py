"""The public SDK's typing promises, held by the type gate (`mypy` in .ci/run: [tool.mypy] files).

Not a test pytest collects, and never run: mypy only reads it. Each `assert_type` is a type a
user's checker may rely on (the README's calls first); each `# type: ignore[code]` marks a call
that must stay an error for a type checker, and `warn_unused_ignores` turns one that stops
failing into an error of its own, so no promise can slip away unnoticed.
"""

from __future__ import annotations

import threading
from typing import Any, assert_type

from watchdog import ConfigError, Run, RunKilled, StoreMisconfigured, ToolTimeout, ToolUnavailable, Watchdog
from watchdog import client
from watchdog.core.budgets import Budgets
from watchdog.core.config import Config


def search(q: str) -> list[str]:
    return [q]


def send_mail(to: str, cc: str | None = None) -> bool:
    return bool(to)


class Draft:
    pass


def write_draft() -> Draft:
    return Draft()


def readme(wd: Watchdog) -> None:
    """The README's SDK example, call by call."""
    with wd.run(agent="support-bot", kill_mode="process", max_steps=10) as run:
        assert_type(run, Run)
        run.check_budget(estimated_cost_eur=0.01)
        run.step(model="gpt-4o", tokens_in=204, tokens_out=23)
        run.step(model="gpt-4o", tokens_in=204, tokens_out=23, cost_eur=0.002, cached_tokens_in=100,
                 reasoning_tokens=3)
        hits = run.tool_call("search", {"q": "refund"}, search, read_only=True)
        assert_type(hits, list[str])  # what `fn` returns
        sent = run.tool_call("send_mail", {"to": "a@b"}, send_mail, retries=2, retry_on=(TimeoutError,))
        assert_type(sent, bool)
        run.heartbeat("scanned 200 of 1200 files")
        run.heartbeat()


def tool_call_keeps_fn_result(run: Run) -> None:
    assert_type(run.tool_call("draft", None, write_draft), Draft)
    assert_type(run.tool_call("draft", {}, write_draft, timeout_s=30), Draft)
    assert_type(run.tool_call("search", {"q": "x"}, search, retries=1, retry_on=TimeoutError, backoff_s=0.1), list[str])
    assert_type(run.tool_call("search", {"q": "x"}, search, timeout_s=None, read_only=True), list[str])
    assert_type(run.tool_call("count", {}, lambda: 3), int)
    assert_type(run.tool_call("anything", {}, lambda **kw: kw), dict[str, Any])


def the_rest_of_run(wd: Watchdog, run: Run, exc: Exception) -> None:
    run.record_tool("search", {"q": "x"}, ok=False, error=exc, duration_s=0.4)
    run.record_tool("search", ok=False, error="HTTP 500", attempt=2)
    run.check_budget()
    run.partial("found 3 of 5")
    run.partial({"found": [1, 2, 3]})
    assert_type(run.cancelled, threading.Event)
    assert_type(run.cancelled.is_set(), bool)
    assert_type(run.stop_requested, RunKilled | None)
    assert_type(run.elapsed_s, float)
    assert_type(run.attested, bool)
    assert_type(run.id, str)
    assert_type(run.parent_id, str | None)
    assert_type(run.budgets, Budgets)
    assert_type(run.budgets.max_steps, int)
    assert_type(run.budgets.max_cost_eur, float)
    with run.child(agent="researcher", max_steps=5, max_cost_eur=0.5) as sub:
        assert_type(sub, Run)
    assert_type(run.child("researcher", labels={"team": "search"}, guards=False), Run)
    pending = run.before_tool("search", {"q": "x"})
    run.after_tool(pending, ok=True)


def watchdog_handle() -> None:
    wd = Watchdog("sqlite:///runs.db")
    Watchdog()  # from AGENT_WATCHDOG_DB
    Watchdog("sqlite:///runs.db", record_args=False, record_errors="class", attest_socket="", pool_size=2)
    assert_type(client.Watchdog, type[Watchdog])
    assert_type(wd.config(), Config)
    assert_type(wd.flush(), bool)
    assert_type(wd.price_eur("gpt-4o", 10, 5), float | None)
    assert_type(wd.run("support-bot", labels={"tenant": "acme"}, run_id="r-1", guards=False, parent_id="p-1"), Run)
    # Every run budget of the registry is a typed keyword (None: the profile's).
    wd.run("a", max_steps=5, max_tool_calls=20, max_cost_eur=1.5, max_tokens=100_000, max_wall_s=60,
           max_identical_calls=2, heartbeat_timeout_s=30.0)
    wd.run("a", max_steps=None, max_cost_eur=None)
    wd.close()


def errors(wd: Watchdog) -> None:
    try:
        with wd.run("support-bot"):
            pass
    except RunKilled as stop:  # a BaseException: `except Exception` cannot swallow it
        assert_type(stop.reason, str)
        assert_type(stop.detail, str)
    except (ToolUnavailable, ToolTimeout, ConfigError, StoreMisconfigured):
        pass


def must_fail(wd: Watchdog, run: Run) -> None:
    """Each line is a mistake a type checker must report (the code after `ignore` says which)."""
    wd.run("a", max_step=10)  # type: ignore[call-arg]  # a misspelt budget
    wd.run("a", max_steps="10")  # type: ignore[arg-type]  # a budget of the wrong type
    wd.run("a", max_steps=1.5)  # type: ignore[arg-type]  # a count is an integer
    wd.run("a", max_cost_eur="2")  # type: ignore[arg-type]
    wd.run("a", max_tool_calls_per_min=5)  # type: ignore[call-arg]  # a profile's setting, not a run's budget
    wd.run("a", on_rate="stop")  # type: ignore[call-arg]
    wd.run("a", labels=["tenant"])  # type: ignore[arg-type]
    wd.run(agent=None)  # type: ignore[arg-type]
    run.child("r", max_wall_s="5")  # type: ignore[arg-type]
    run.child("r", max_stesp=3)  # type: ignore[call-arg]
    run.tool_call("search", {"q": "x"}, search, retries="2")  # type: ignore[arg-type]
    run.tool_call("search", {"q": "x"}, search, timeout=30)  # type: ignore[call-arg]  # it is timeout_s
    run.tool_call("search", {"q": "x"}, search, retry_on=ValueError("x"))  # type: ignore[arg-type]
    run.tool_call("search", {"q": "x"}, "search")  # type: ignore[arg-type]  # fn is the callable itself
    run.tool_call("search", ["x"], search)  # type: ignore[arg-type]  # args are keyword arguments
    not_a_str: str = run.tool_call("search", {"q": "x"}, search)  # type: ignore[assignment]
    run.step(tokens_in="5")  # type: ignore[arg-type]
    run.step(model="gpt-4o", cost=0.1)  # type: ignore[call-arg]  # it is cost_eur
    run.check_budget(estimated_cost="0.1")  # type: ignore[call-arg]
    run.heartbeat(42)  # type: ignore[arg-type]
    run.record_tool("search", ok="yes")  # type: ignore[arg-type]
    Watchdog("sqlite:///runs.db", pool_size="2")  # type: ignore[arg-type]
    print(not_a_str)
