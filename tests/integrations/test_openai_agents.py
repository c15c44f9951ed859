"""The OpenAI Agents SDK run hooks against the real SDK: its ScriptedModel, real function tools.

The agents name their model ("gpt-x") and a ModelProvider hands out the scripted
model, as a real provider would hand out an OpenAI model. Tracing is disabled.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

pytest.importorskip("agents")  # local runs without the extra; CI installs it

from agents import Agent, ModelProvider, RunConfig, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.exceptions import MaxTurnsExceeded  # noqa: E402
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call  # noqa: E402
from agents.usage import Usage  # noqa: E402

from .integration_support import event_rows, run_ids, run_row  # noqa: E402
from watchdog import RunKilled  # noqa: E402
from watchdog.integrations.openai_agents import WatchdogRunHooks, failure_error_function, hooks  # noqa: E402
from watchdog.core.lifecycle import hash_args  # noqa: E402

set_tracing_disabled(True)

CALLS: list[tuple[str, dict]] = []


@function_tool(failure_error_function=failure_error_function)
def search(q: str) -> str:
    """Search the help center."""
    CALLS.append(("search", {"q": q}))
    return f"3 articles about {q}"


@function_tool(failure_error_function=failure_error_function)
def get_order(order_id: int) -> str:
    """Look an order up."""
    CALLS.append(("get_order", {"order_id": order_id}))
    return f"order {order_id}: paid, 49.90 EUR"


@function_tool(failure_error_function=failure_error_function)
def verify_iban(iban: str) -> str:
    """Check an IBAN with the bank (down today)."""
    CALLS.append(("verify_iban", {"iban": iban}))
    raise ConnectionError("bank API timed out")


TOOLS = [search, get_order, verify_iban]


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()


class ScriptedProvider(ModelProvider):
    """Resolves the agent's model name to the scripted model, as a real provider resolves "gpt-4o"."""

    def __init__(self, model):
        self.model = model

    def get_model(self, model_name):
        return self.model


def step(*calls, text=None, tokens=(0, 0)):
    output = [function_call(name, args, call_id=f"call_{i}_{name}") for i, (name, args) in enumerate(calls)]
    if text is not None:
        output.append(assistant_message(text))
    return ModelStep(output=output, usage=Usage(requests=1, input_tokens=tokens[0], output_tokens=tokens[1],
                                                 total_tokens=sum(tokens)))


class RunawayModel(ScriptedModel):
    """Asks for the same tool with the same arguments on every call, until its deadline."""

    def __init__(self, deadline_s: float = 30.0):
        super().__init__()
        self.deadline = time.monotonic() + deadline_s
        self.n = 0

    def _next(self):
        self.n += 1
        if time.monotonic() > self.deadline:
            self.enqueue(step(text="gave up: the watchdog never stopped the run"))
        else:
            call = function_call("search", {"q": "refund policy"}, call_id=f"call_{self.n}")
            self.enqueue(ModelStep(output=[call], usage=Usage(requests=1, input_tokens=300, output_tokens=20,
                                                              total_tokens=320)))

    async def get_response(self, *args, **kwargs):
        self._next()
        return await super().get_response(*args, **kwargs)

    async def stream_response(self, *args, **kwargs):
        self._next()
        async for event in super().stream_response(*args, **kwargs):
            yield event


def request_stop(wd, run_id, reason="manual", detail="by oncall"):
    """What the daemon (or `agent-watchdog kill`) does to a run: ask it to stop."""
    with wd.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE runs SET status = 'stopping', stop_reason = ?, stop_detail = ? WHERE id = ?",
                             (reason, detail, run_id))


def support_agent():
    return Agent(name="support", instructions="Help the customer.", model="gpt-x", tools=TOOLS)


def config_for(model):
    return RunConfig(model_provider=ScriptedProvider(model), tracing_disabled=True)


# --- (a) a healthy run, recorded step by step ------------------------------------------------


def test_healthy_run_is_recorded_step_by_step(sqlite_url, wd):
    model = ScriptedModel([
        step(("search", {"q": "refund policy"}), tokens=(120, 12)),
        step(("get_order", {"order_id": 42}), tokens=(150, 15)),
        step(text="Your refund is on its way.", tokens=(180, 18)),
    ])
    h = hooks(wd, agent="support-bot", max_steps=8)

    result = Runner.run_sync(support_agent(), "Where is my refund for order 42?", hooks=h,
                             run_config=config_for(model))

    assert result.final_output == "Your refund is on its way."
    assert [c[0] for c in CALLS] == ["search", "get_order"]
    run = run_row(sqlite_url, h.run.id)
    assert run["agent"] == "support-bot"
    assert run["status"] == "completed" and run["stop_reason"] is None and run["ended_at"] is not None
    assert (run["steps"], run["tool_calls"], run["tool_errors"]) == (3, 2, 0)
    assert (run["tokens_in"], run["tokens_out"]) == (450, 45)
    assert run["max_steps"] == 8

    evs = event_rows(sqlite_url, h.run.id)
    assert [(e["seq"], e["kind"], e["tool"], e["model"], e["tokens_in"], e["tokens_out"]) for e in evs] == [
        (1, "step", None, "gpt-x", 120, 12),
        (2, "tool", "search", None, None, None),
        (3, "step", None, "gpt-x", 150, 15),
        (4, "tool", "get_order", None, None, None),
        (5, "step", None, "gpt-x", 180, 18),
    ]
    assert evs[1]["args_hash"] == hash_args({"q": "refund policy"})
    assert evs[3]["args_hash"] == hash_args({"order_id": 42})
    assert all(e["ok"] and e["duration_s"] is not None for e in evs if e["kind"] == "tool")


def test_parallel_tool_calls_in_one_turn_are_each_recorded(sqlite_url, wd):
    model = ScriptedModel([
        step(("search", {"q": "refund policy"}), ("get_order", {"order_id": 42}), tokens=(100, 10)),
        step(text="done", tokens=(110, 11)),
    ])
    h = hooks(wd, agent="support-bot")

    asyncio.run(Runner.run(support_agent(), "hi", hooks=h, run_config=config_for(model)))

    run = run_row(sqlite_url, h.run.id)
    assert (run["status"], run["steps"], run["tool_calls"]) == ("completed", 2, 2)
    tools = {(e["tool"], e["args_hash"]) for e in event_rows(sqlite_url, h.run.id) if e["kind"] == "tool"}
    assert tools == {("search", hash_args({"q": "refund policy"})), ("get_order", hash_args({"order_id": 42}))}


def test_tool_errors_are_recorded_through_failure_error_function(sqlite_url, wd):
    model = ScriptedModel([
        step(("verify_iban", {"iban": "DE89370400440532013000"}), tokens=(100, 10)),
        step(text="A human will call you.", tokens=(120, 12)),
    ])
    h = hooks(wd, agent="support-bot")

    result = Runner.run_sync(support_agent(), "refund me", hooks=h, run_config=config_for(model))

    assert result.final_output == "A human will call you."
    # The model read the SDK's default message (the exception is not shown to it).
    assert "An error occurred while running the tool" in str(model.last_call.input)
    run = run_row(sqlite_url, h.run.id)
    assert (run["status"], run["steps"], run["tool_calls"], run["tool_errors"]) == ("completed", 2, 1, 1)
    tool_ev = [e for e in event_rows(sqlite_url, h.run.id) if e["kind"] == "tool"]
    assert [(e["tool"], e["ok"], e["error_class"], e["error_msg"]) for e in tool_ev] == [
        ("verify_iban", False, "ConnectionError", "bank API timed out")]


def test_the_model_name_follows_a_run_config_override_when_told(sqlite_url, wd):
    model = ScriptedModel([step(text="hello", tokens=(10, 1))])
    h = hooks(wd, agent="support-bot", model="gpt-x-mini")
    config = RunConfig(model="gpt-x-mini", model_provider=ScriptedProvider(model), tracing_disabled=True)

    Runner.run_sync(support_agent(), "hi", hooks=h, run_config=config)

    assert [e["model"] for e in event_rows(sqlite_url, h.run.id)] == ["gpt-x-mini"]


def test_reused_hooks_open_one_run_per_runner_run(sqlite_url, wd):
    model = ScriptedModel([step(text="hello", tokens=(10, 1)), step(text="again", tokens=(20, 2))])
    h = hooks(wd, agent="support-bot")

    Runner.run_sync(support_agent(), "hi", hooks=h, run_config=config_for(model))
    first = h.run.id
    Runner.run_sync(support_agent(), "hi again", hooks=h, run_config=config_for(model))

    assert run_ids(sqlite_url) == [first, h.run.id] and first != h.run.id
    assert [run_row(sqlite_url, i)["tokens_in"] for i in (first, h.run.id)] == [10, 20]
    assert {run_row(sqlite_url, i)["status"] for i in (first, h.run.id)} == {"completed"}


def test_as_a_context_manager_the_hooks_see_failures_the_sdk_does_not_report(sqlite_url, wd):
    model = RunawayModel()

    with pytest.raises(MaxTurnsExceeded):
        with hooks(wd, agent="support-bot", guards=False) as h:
            Runner.run_sync(support_agent(), "hi", hooks=h, run_config=config_for(model), max_turns=2)

    run = run_row(sqlite_url, h.run.id)
    assert run["status"] == "failed" and run["stop_detail"].startswith("MaxTurnsExceeded")
    assert (run["steps"], run["tool_calls"]) == (2, 2)


def test_joining_a_run_leaves_ending_it_to_its_owner(sqlite_url, wd):
    model = ScriptedModel([step(("search", {"q": "x"}), tokens=(10, 1)), step(text="ok", tokens=(20, 2))])
    with wd.run(agent="support-bot") as run:
        Runner.run_sync(support_agent(), "hi", hooks=WatchdogRunHooks(run=run), run_config=config_for(model))
        assert run_row(sqlite_url, run.id)["status"] == "running"
    row = run_row(sqlite_url, run.id)
    assert (row["status"], row["steps"], row["tool_calls"]) == ("completed", 2, 1)


def test_a_stop_requested_in_the_store_surfaces_from_runner_run(sqlite_url, wd):
    """What the daemon (or `agent-watchdog kill`) does, done by hand: the next write raises RunKilled."""
    h = hooks(wd, agent="support-bot", guards=False)

    @function_tool
    def escalate(ticket: str) -> str:
        """Escalate a ticket; meanwhile an operator stops the run."""
        request_stop(wd, h.run.id)
        return "escalated"

    model = ScriptedModel([step(("escalate", {"ticket": "T1"}), tokens=(10, 1)), step(text="never", tokens=(1, 1))])
    agent = Agent(name="support", model="gpt-x", tools=[escalate])

    with pytest.raises(RunKilled) as stop:
        Runner.run_sync(agent, "hi", hooks=h, run_config=config_for(model))

    assert (stop.value.reason, stop.value.detail) == ("manual", "by oncall")
    row = run_row(sqlite_url, h.run.id)
    assert (row["status"], row["stop_reason"], row["steps"], row["tool_calls"]) == ("killed", "manual", 1, 1)
    assert model.remaining_steps == 1  # the model was not called again


def test_a_stop_seen_on_the_step_write_surfaces_before_the_tools_run(sqlite_url, wd):
    h = hooks(wd, agent="support-bot", guards=False)

    def stop_then_answer(_call):
        request_stop(wd, h.run.id)  # while the model "thinks" about its second reply
        return step(("get_order", {"order_id": 42}), tokens=(110, 11))

    model = ScriptedModel([step(("search", {"q": "refund policy"}), tokens=(100, 10)),
                           ModelStep.respond(stop_then_answer)])

    with pytest.raises(RunKilled) as stop:
        asyncio.run(Runner.run(support_agent(), "hi", hooks=h, run_config=config_for(model)))

    assert stop.value.reason == "manual"
    assert [c[0] for c in CALLS] == ["search"]  # get_order, asked for in the stopped step, never ran
    row = run_row(sqlite_url, h.run.id)
    assert (row["status"], row["stop_reason"], row["steps"], row["tool_calls"]) == ("killed", "manual", 2, 1)


# --- (b) a runaway stopped by the daemon ----------------------------------------------------------


@pytest.mark.slow
def test_runaway_is_stopped_by_the_daemon(sqlite_url, wd, daemon):
    # guards=False: nothing in-process stops this run, only the daemon can.
    h = hooks(wd, agent="support-bot", guards=False, kill_mode="cooperative")

    with pytest.raises(RunKilled) as stop:
        Runner.run_sync(support_agent(), "refund?", hooks=h, run_config=config_for(RunawayModel()),
                        max_turns=1_000_000)

    assert stop.value.reason == "max_tool_calls", daemon.output()
    row = run_row(sqlite_url, h.run.id)
    assert (row["status"], row["stop_reason"]) == ("killed", "max_tool_calls")
    assert row["tool_calls"] > 6 and row["ended_at"] is not None
    assert {e["tool"] for e in event_rows(sqlite_url, h.run.id) if e["kind"] == "tool"} == {"search"}
    assert daemon.poll() is None  # one run stopped, the daemon (and this process) carry on


# --- (c) an in-process guard stops it first ---------------------------------------------------------


def test_identical_call_guard_aborts_before_the_tool_runs(sqlite_url, wd):
    h = hooks(wd, agent="support-bot", max_identical_calls=3)

    with pytest.raises(RunKilled) as stop:
        Runner.run_sync(support_agent(), "refund?", hooks=h, run_config=config_for(RunawayModel()),
                        max_turns=1000)

    assert stop.value.reason == "loop_detected"
    assert "in-process guard" in stop.value.detail
    assert CALLS == [("search", {"q": "refund policy"})] * 2  # the third identical call never ran
    row = run_row(sqlite_url, h.run.id)
    assert (row["status"], row["stop_reason"], row["steps"], row["tool_calls"]) == ("killed", "loop_detected", 3, 2)
    assert "in-process guard" in row["stop_detail"]


def test_step_guard_aborts_a_streamed_run_before_the_model_call(sqlite_url, wd):
    h = hooks(wd, agent="support-bot", max_steps=2)
    model = RunawayModel()

    async def main():
        result = Runner.run_streamed(support_agent(), "refund?", hooks=h, run_config=config_for(model),
                                     max_turns=1000)
        async for _event in result.stream_events():
            pass

    with pytest.raises(RunKilled) as stop:
        asyncio.run(main())

    assert stop.value.reason == "max_steps"
    assert len(model.calls) == 2  # the third model call was never made
    row = run_row(sqlite_url, h.run.id)
    assert (row["status"], row["stop_reason"], row["steps"], row["tool_calls"]) == ("killed", "max_steps", 2, 2)


def test_importing_watchdog_does_not_import_the_agents_sdk():
    code = ("import sys, watchdog, watchdog.integrations; "
            "assert 'agents' not in sys.modules and 'openai' not in sys.modules, 'agents SDK imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cached_and_reasoning_tokens_pass_through_from_response_usage(sqlite_url, wd):
    from agents.usage import InputTokensDetails, OutputTokensDetails

    extra = {"cache_write_tokens": 0} if "cache_write_tokens" in InputTokensDetails.model_fields else {}
    usage = Usage(requests=1, input_tokens=1000, output_tokens=300, total_tokens=1300,
                  input_tokens_details=InputTokensDetails(cached_tokens=600, **extra),
                  output_tokens_details=OutputTokensDetails(reasoning_tokens=200))
    model = ScriptedModel([ModelStep(output=[assistant_message("done")], usage=usage)])
    h = hooks(wd, agent="support-bot")
    Runner.run_sync(support_agent(), "hi", hooks=h, run_config=config_for(model))
    run = run_row(sqlite_url, h.run.id)
    assert (run["tokens_in"], run["tokens_out"], run["cached_tokens_in"], run["reasoning_tokens"]) == (1000, 300, 600, 200)
    (ev,) = event_rows(sqlite_url, h.run.id)
    assert (ev["cached_tokens_in"], ev["reasoning_tokens"]) == (600, 200)


# --- nested agents: child runs ----------------------------------------------------------------


def test_a_handoff_records_the_agent_handed_to_on_a_child_run(sqlite_url, wd):
    billing = Agent(name="billing", instructions="Refunds.", model="gpt-x", tools=[get_order])
    triage = Agent(name="triage", instructions="Route.", model="gpt-x", handoffs=[billing])
    model = ScriptedModel([
        step(("transfer_to_billing", {}), tokens=(10, 1)),
        step(("get_order", {"order_id": 42}), tokens=(20, 2)),
        step(text="Refunded.", tokens=(30, 3)),
    ])
    h = hooks(wd, agent="support-bot", max_steps=8)
    result = Runner.run_sync(triage, "refund order 42", hooks=h, run_config=config_for(model))
    assert result.final_output == "Refunded."
    root = run_row(sqlite_url, h.run.id)
    (child_id,) = [rid for rid in run_ids(sqlite_url) if rid != h.run.id]
    child = run_row(sqlite_url, child_id)
    assert (child["agent"], child["parent_id"], child["status"]) == ("billing", h.run.id, "completed")
    assert (child["steps"], child["tool_calls"], child["tokens_in"]) == (2, 1, 50)
    assert child["max_steps"] == 7  # never above what the parent had left (8 - its own 1 step)
    assert (root["status"], root["steps"], root["tool_calls"], root["tokens_in"]) == ("completed", 3, 1, 60)
    assert [e["kind"] for e in event_rows(sqlite_url, h.run.id)] == ["step"]  # triage's own call only
    assert [(e["kind"], e["tool"]) for e in event_rows(sqlite_url, child_id)] == [
        ("step", None), ("tool", "get_order"), ("step", None)]


def test_an_agent_used_as_a_tool_records_on_a_child_run_with_its_own_budget(sqlite_url, wd):
    model = ScriptedModel([
        step(("research", {"input": "refund policy"}), tokens=(10, 1)),
        step(("search", {"q": "refund policy"}), tokens=(20, 2)),
        step(text="3 articles about refunds", tokens=(30, 3)),
        step(text="Refunds take 5 days.", tokens=(40, 4)),
    ])
    h = hooks(wd, agent="support-bot", max_steps=10)
    researcher = Agent(name="researcher", instructions="Research.", model="gpt-x", tools=[search])
    lead = Agent(name="lead", instructions="Answer.", model="gpt-x", tools=[
        researcher.as_tool("research", "Research a question.", run_config=config_for(model),
                           hooks=h.child(agent="researcher", max_steps=4))])
    result = Runner.run_sync(lead, "how long do refunds take?", hooks=h, run_config=config_for(model))
    assert result.final_output == "Refunds take 5 days."
    (child_id,) = [rid for rid in run_ids(sqlite_url) if rid != h.run.id]
    child = run_row(sqlite_url, child_id)
    assert (child["agent"], child["parent_id"], child["status"], child["max_steps"]) == (
        "researcher", h.run.id, "completed", 4)
    assert (child["steps"], child["tool_calls"]) == (2, 1)
    root = run_row(sqlite_url, h.run.id)
    assert (root["status"], root["steps"], root["tool_calls"]) == ("completed", 4, 2)  # its own + the child's
