"""The LangChain callback handler against real langchain-core: a fake chat model, real tools.

GenericFakeChatModel cannot bind tools, so the agent is a hand-written tool-calling
loop (model → tool calls → tools → model ...) wrapped in a RunnableLambda: the
outermost chain whose end ends the watchdog run, like an AgentExecutor or a
LangGraph graph would be.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import subprocess
import sys
import time

import pytest
from sqlalchemy import insert

pytest.importorskip("langchain_core")  # local runs without the extra; CI installs it

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402
from langchain_core.tools import ToolException, tool  # noqa: E402

from watchdog import RunKilled  # noqa: E402
from watchdog.integrations.langchain import WatchdogCallbackHandler, handler  # noqa: E402
from watchdog.core.lifecycle import hash_args  # noqa: E402
from watchdog.store.schema import tool_circuits, utcnow  # noqa: E402

from .integration_support import event_rows, run_ids, run_row  # noqa: E402

CALLS: list[tuple[str, dict]] = []


@tool
def search(q: str) -> str:
    """Search the help center."""
    CALLS.append(("search", {"q": q}))
    return f"3 articles about {q}"


@tool
def get_order(order_id: int) -> str:
    """Look an order up."""
    CALLS.append(("get_order", {"order_id": order_id}))
    return f"order {order_id}: paid, 49.90 EUR"


@tool
def verify_iban(iban: str) -> str:
    """Check an IBAN with the bank (down today)."""
    CALLS.append(("verify_iban", {"iban": iban}))
    raise ConnectionError("bank API timed out")


@tool
def refund(order_id: int) -> str:
    """Refund an order (refuses politely)."""
    CALLS.append(("refund", {"order_id": order_id}))
    raise ToolException("refunds need a human above 40 EUR")


refund.handle_tool_error = True  # the ToolException becomes a ToolMessage with status "error"


TOOLS = {t.name: t for t in (search, get_order, verify_iban, refund)}


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()


def ai(tool_calls=(), content="", tokens=(0, 0), model="gpt-x"):
    calls = [{"name": name, "args": args, "id": f"call_{i}_{name}"} for i, (name, args) in enumerate(tool_calls)]
    return AIMessage(
        content=content, tool_calls=calls,
        usage_metadata={"input_tokens": tokens[0], "output_tokens": tokens[1], "total_tokens": sum(tokens)},
        response_metadata={"model_name": model},
    )


def make_agent(messages, *, deadline_s: float = 30.0, catch_tool_errors: bool = False):
    """A tool-calling agent loop over a scripted chat model: a RunnableLambda (the outermost chain)."""
    model = GenericFakeChatModel(messages=iter(messages))

    def agent_loop(question: str, config) -> str:
        history = [HumanMessage(question)]
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            reply = model.invoke(history, config)
            history.append(reply)
            if not reply.tool_calls:
                return reply.content
            for call in reply.tool_calls:
                try:
                    history.append(TOOLS[call["name"]].invoke(call, config))
                except Exception as exc:  # noqa: BLE001 - the agent tells the model and goes on
                    if not catch_tool_errors:
                        raise
                    history.append(ToolMessage(f"error: {exc}", tool_call_id=call["id"], status="error"))
        return "gave up: the watchdog never stopped the run"

    return RunnableLambda(agent_loop, name="support_agent")


def request_stop(wd, run_id, reason="manual", detail="by oncall"):
    """What the daemon (or `agent-watchdog kill`) does to a run: ask it to stop."""
    with wd.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE runs SET status = 'stopping', stop_reason = ?, stop_detail = ? WHERE id = ?",
                             (reason, detail, run_id))


def runaway_messages():
    """The model asks for the same tool with the same arguments, forever."""
    return (ai([("search", {"q": "refund policy"})], tokens=(300, 20)) for _ in itertools.count())


# --- (a) a healthy run, recorded step by step ------------------------------------------------


def test_healthy_run_is_recorded_step_by_step(sqlite_url, wd):
    agent = make_agent([
        ai([("search", {"q": "refund policy"})], tokens=(120, 12)),
        ai([("get_order", {"order_id": 42})], tokens=(150, 15)),
        ai(content="Your refund is on its way.", tokens=(180, 18)),
    ])
    cb = handler(wd, agent="support-bot", max_steps=8)

    answer = agent.invoke("Where is my refund for order 42?", config={"callbacks": [cb]})

    assert answer == "Your refund is on its way."
    assert [c[0] for c in CALLS] == ["search", "get_order"]
    run = run_row(sqlite_url, cb.run.id)
    assert run["agent"] == "support-bot"
    assert run["status"] == "completed" and run["stop_reason"] is None and run["ended_at"] is not None
    assert (run["steps"], run["tool_calls"], run["tool_errors"]) == (3, 2, 0)
    assert (run["tokens_in"], run["tokens_out"]) == (450, 45)
    assert run["max_steps"] == 8

    evs = event_rows(sqlite_url, cb.run.id)
    assert [(e["seq"], e["kind"], e["tool"], e["model"], e["tokens_in"], e["tokens_out"]) for e in evs] == [
        (1, "step", None, "gpt-x", 120, 12),
        (2, "tool", "search", None, None, None),
        (3, "step", None, "gpt-x", 150, 15),
        (4, "tool", "get_order", None, None, None),
        (5, "step", None, "gpt-x", 180, 18),
    ]
    assert evs[1]["args_hash"] == hash_args({"q": "refund policy"})
    assert evs[3]["args_hash"] == hash_args({"order_id": 42})
    assert all(e["ok"] for e in evs if e["kind"] == "tool")
    assert all(e["duration_s"] is not None and e["duration_s"] >= 0 for e in evs if e["kind"] == "tool")
    assert all(e["args"] is None for e in evs)  # arguments are hashed, not stored, by default


def test_tool_errors_are_recorded_with_the_tool_name(sqlite_url, wd):
    agent = make_agent([
        ai([("verify_iban", {"iban": "DE89370400440532013000"})], tokens=(100, 10)),
        ai([("refund", {"order_id": 42})], tokens=(110, 11)),
        ai(content="A human will call you.", tokens=(120, 12)),
    ], catch_tool_errors=True)
    cb = handler(wd, agent="support-bot")

    assert agent.invoke("refund me", config={"callbacks": [cb]}) == "A human will call you."

    run = run_row(sqlite_url, cb.run.id)
    assert (run["status"], run["steps"], run["tool_calls"], run["tool_errors"]) == ("completed", 3, 2, 2)
    tools = [e for e in event_rows(sqlite_url, cb.run.id) if e["kind"] == "tool"]
    # on_tool_error names no tool: the handler remembered it from on_tool_start.
    assert (tools[0]["tool"], tools[0]["ok"], tools[0]["error_class"], tools[0]["error_msg"]) == (
        "verify_iban", False, "ConnectionError", "bank API timed out")
    # handle_tool_error: the tool "succeeds" with a ToolMessage whose status is "error".
    assert (tools[1]["tool"], tools[1]["ok"], tools[1]["error_msg"]) == (
        "refund", False, "refunds need a human above 40 EUR")


def test_an_agent_error_fails_the_run(sqlite_url, wd):
    agent = make_agent([ai([("verify_iban", {"iban": "DE00"})], tokens=(100, 10))])
    cb = handler(wd, agent="support-bot")

    with pytest.raises(ConnectionError):
        agent.invoke("refund me", config={"callbacks": [cb]})

    run = run_row(sqlite_url, cb.run.id)
    assert run["status"] == "failed"
    assert run["stop_detail"] == "ConnectionError: bank API timed out"
    assert (run["steps"], run["tool_calls"], run["tool_errors"]) == (1, 1, 1)


def test_a_reused_handler_opens_one_run_per_invocation(sqlite_url, wd):
    agent = make_agent([ai(content="hello", tokens=(10, 1)), ai(content="again", tokens=(20, 2))])
    cb = handler(wd, agent="support-bot")

    agent.invoke("hi", config={"callbacks": [cb]})
    first = cb.run.id
    agent.invoke("hi again", config={"callbacks": [cb]})

    assert cb.run.id != first
    assert run_ids(sqlite_url) == [first, cb.run.id]
    assert [run_row(sqlite_url, i)["tokens_in"] for i in (first, cb.run.id)] == [10, 20]
    assert {run_row(sqlite_url, i)["status"] for i in (first, cb.run.id)} == {"completed"}


def test_joining_a_run_leaves_ending_it_to_its_owner(sqlite_url, wd):
    agent = make_agent([ai([("search", {"q": "x"})], tokens=(10, 1)), ai(content="ok", tokens=(20, 2))])
    with wd.run(agent="support-bot") as run:
        agent.invoke("hi", config={"callbacks": [WatchdogCallbackHandler(run=run)]})
        assert run_row(sqlite_url, run.id)["status"] == "running"
        run.heartbeat("answer sent")
    row = run_row(sqlite_url, run.id)
    assert (row["status"], row["steps"], row["tool_calls"], row["progress"]) == ("completed", 2, 1, "answer sent")


def test_without_an_enclosing_chain_the_with_block_bounds_the_run(sqlite_url, wd):
    model = GenericFakeChatModel(messages=iter([ai([("search", {"q": "x"})], tokens=(10, 1))]))
    with handler(wd, agent="support-bot") as cb:
        reply = model.invoke("hi", config={"callbacks": [cb]})
        search.invoke(reply.tool_calls[0], config={"callbacks": [cb]})
        assert run_row(sqlite_url, cb.run.id)["status"] == "running"
    row = run_row(sqlite_url, cb.run.id)
    assert (row["status"], row["steps"], row["tool_calls"]) == ("completed", 1, 1)


def test_a_with_block_makes_several_invocations_one_run(sqlite_url, wd):
    agent = make_agent([ai(content="hello", tokens=(10, 1)), ai(content="again", tokens=(20, 2))])
    with pytest.raises(LookupError):
        with handler(wd, agent="support-bot") as cb:
            agent.invoke("hi", config={"callbacks": [cb]})
            agent.invoke("hi again", config={"callbacks": [cb]})
            assert run_row(sqlite_url, cb.run.id)["status"] == "running"
            raise LookupError("the caller's own failure after the agent answered")
    assert run_ids(sqlite_url) == [cb.run.id]
    row = run_row(sqlite_url, cb.run.id)
    assert (row["status"], row["steps"], row["tokens_in"]) == ("failed", 2, 30)
    assert row["stop_detail"] == "LookupError: the caller's own failure after the agent answered"


def test_a_stop_requested_in_the_store_surfaces_from_invoke(sqlite_url, wd):
    """What the daemon (or `agent-watchdog kill`) does, done by hand: the next write raises RunKilled."""
    cb = handler(wd, agent="support-bot", guards=False)

    @tool
    def escalate(ticket: str) -> str:
        """Escalate a ticket; meanwhile an operator stops the run."""
        request_stop(wd, cb.run.id)
        return "escalated"

    TOOLS["escalate"] = escalate
    try:
        agent = make_agent(ai([("escalate", {"ticket": f"T{i}"})], tokens=(10, 1)) for i in itertools.count())
        with pytest.raises(RunKilled) as stop:
            agent.invoke("hi", config={"callbacks": [cb]})
    finally:
        del TOOLS["escalate"]
    assert (stop.value.reason, stop.value.detail) == ("manual", "by oncall")
    row = run_row(sqlite_url, cb.run.id)
    assert (row["status"], row["stop_reason"], row["steps"], row["tool_calls"]) == ("killed", "manual", 1, 1)


def test_a_stop_seen_on_the_step_write_surfaces_before_the_tools_run(sqlite_url, wd):
    cb = handler(wd, agent="support-bot", guards=False)

    def messages():
        yield ai([("search", {"q": "refund policy"})], tokens=(100, 10))
        request_stop(wd, cb.run.id)  # while the model "thinks" about its second reply
        while True:
            yield ai([("get_order", {"order_id": 42})], tokens=(110, 11))

    with pytest.raises(RunKilled) as stop:
        make_agent(messages()).invoke("hi", config={"callbacks": [cb]})

    assert stop.value.reason == "manual"
    assert [c[0] for c in CALLS] == ["search"]  # get_order, asked for in the stopped step, never ran
    row = run_row(sqlite_url, cb.run.id)
    assert (row["status"], row["stop_reason"], row["steps"], row["tool_calls"]) == ("killed", "manual", 2, 1)


def test_an_open_circuit_fails_the_tool_fast_without_running_it(sqlite_url, wd, caplog):
    """While the daemon holds verify_iban's circuit open, the call fails fast with ToolUnavailable,
    and LangChain logs no "Error in WatchdogCallbackHandler... callback" for it (issue 19)."""
    now = utcnow()
    with wd.engine.begin() as conn:
        conn.execute(insert(tool_circuits).values(
            tool="verify_iban", state="open", opened_at=now, open_until=now + dt.timedelta(minutes=2),
            errors_in_window=5, window_s=60.0, last_error="ConnectionError: bank API timed out", updated_at=now))
    agent = make_agent([
        ai([("verify_iban", {"iban": "DE00"})], tokens=(100, 10)),
        ai(content="The bank is down, a human will call you.", tokens=(120, 12)),
    ], catch_tool_errors=True)
    cb = handler(wd, agent="support-bot")

    with caplog.at_level("WARNING"):
        assert agent.invoke("refund me", config={"callbacks": [cb]}) == "The bank is down, a human will call you."
    assert not [r for r in caplog.records if "WatchdogCallbackHandler" in r.getMessage()]

    assert CALLS == []  # the tool never ran
    run = run_row(sqlite_url, cb.run.id)
    assert (run["status"], run["tool_calls"], run["tool_errors"]) == ("completed", 1, 1)
    [tool_ev] = [e for e in event_rows(sqlite_url, cb.run.id) if e["kind"] == "tool"]
    assert (tool_ev["tool"], tool_ev["ok"], tool_ev["error_class"]) == ("verify_iban", False, "ToolUnavailable")
    assert "unavailable until" in tool_ev["error_msg"]


# --- (b) a runaway stopped by the daemon ----------------------------------------------------------


@pytest.mark.slow
def test_runaway_is_stopped_by_the_daemon(sqlite_url, wd, daemon):
    # guards=False: nothing in-process stops this run, only the daemon can.
    cb = handler(wd, agent="support-bot", guards=False, kill_mode="cooperative")
    agent = make_agent(runaway_messages(), deadline_s=30)

    with pytest.raises(RunKilled) as stop:
        agent.invoke("refund?", config={"callbacks": [cb]})

    assert stop.value.reason == "max_tool_calls", daemon.output()
    row = run_row(sqlite_url, cb.run.id)
    assert (row["status"], row["stop_reason"]) == ("killed", "max_tool_calls")
    assert row["tool_calls"] > 6 and row["ended_at"] is not None
    assert {e["tool"] for e in event_rows(sqlite_url, cb.run.id) if e["kind"] == "tool"} == {"search"}
    assert daemon.poll() is None  # one run stopped, the daemon (and this process) carry on


# --- (c) an in-process guard stops it first ---------------------------------------------------------


def test_identical_call_guard_aborts_before_the_tool_runs(sqlite_url, wd):
    cb = handler(wd, agent="support-bot", max_identical_calls=3)
    agent = make_agent(runaway_messages(), deadline_s=30)

    with pytest.raises(RunKilled) as stop:
        agent.invoke("refund?", config={"callbacks": [cb]})

    assert stop.value.reason == "loop_detected"
    assert "in-process guard" in stop.value.detail
    assert CALLS == [("search", {"q": "refund policy"})] * 2  # the third identical call never ran
    row = run_row(sqlite_url, cb.run.id)
    assert (row["status"], row["stop_reason"], row["steps"], row["tool_calls"]) == ("killed", "loop_detected", 3, 2)
    assert "in-process guard" in row["stop_detail"]


def test_step_guard_aborts_before_the_model_call_in_async_code(sqlite_url, wd):
    cb = handler(wd, agent="support-bot", max_steps=2)
    model = GenericFakeChatModel(messages=runaway_messages())

    async def agent_loop(question: str, config) -> str:
        history = [HumanMessage(question)]
        while True:
            reply = await model.ainvoke(history, config)
            history.append(reply)
            for call in reply.tool_calls:
                history.append(await TOOLS[call["name"]].ainvoke(call, config))

    with pytest.raises(RunKilled) as stop:
        asyncio.run(RunnableLambda(agent_loop).ainvoke("refund?", config={"callbacks": [cb]}))

    assert stop.value.reason == "max_steps"
    row = run_row(sqlite_url, cb.run.id)
    assert (row["status"], row["stop_reason"], row["steps"], row["tool_calls"]) == ("killed", "max_steps", 2, 2)


def test_importing_watchdog_does_not_import_langchain():
    code = ("import sys, watchdog, watchdog.integrations; "
            "assert 'langchain_core' not in sys.modules, 'langchain_core imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cached_and_reasoning_tokens_pass_through_from_usage_metadata(sqlite_url, wd):
    """usage_metadata's input_token_details.cache_read and output_token_details.reasoning (or the
    OpenAI-style token_usage details) reach the step, so prices apply the cached / reasoning rates."""
    reply = ai(content="done", tokens=(1000, 300))
    reply.usage_metadata["input_token_details"] = {"cache_read": 600}
    reply.usage_metadata["output_token_details"] = {"reasoning": 200}
    cb = handler(wd, agent="support-bot")
    assert make_agent([reply]).invoke("hi", config={"callbacks": [cb]}) == "done"
    run = run_row(sqlite_url, cb.run.id)
    assert (run["tokens_in"], run["tokens_out"], run["cached_tokens_in"], run["reasoning_tokens"]) == (1000, 300, 600, 200)
    (ev,) = event_rows(sqlite_url, cb.run.id)
    assert (ev["cached_tokens_in"], ev["reasoning_tokens"]) == (600, 200)


def test_token_usage_details_of_an_llm_output_pass_through():
    from langchain_core.outputs import Generation, LLMResult

    from watchdog.integrations.langchain import _usage

    result = LLMResult(generations=[[Generation(text="x")]], llm_output={"model_name": "o3", "token_usage": {
        "prompt_tokens": 500, "completion_tokens": 90, "prompt_tokens_details": {"cached_tokens": 128},
        "completion_tokens_details": {"reasoning_tokens": 64}}})
    assert _usage(result) == ("o3", 500, 90, 128, 64)
