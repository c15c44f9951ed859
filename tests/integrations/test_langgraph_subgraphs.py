"""LangGraph subgraphs as child runs, against real LangGraph: a graph with a compiled subgraph as a node.

The nodes call a fake chat model (with token usage) and a real tool; the handler is
passed once, at the outermost invoke, as a user would.
"""

from __future__ import annotations

from typing import TypedDict

import pytest

pytest.importorskip("langgraph")  # the test extra installs it

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from watchdog import RunKilled  # noqa: E402
from watchdog.integrations.langchain import handler  # noqa: E402

from .integration_support import event_rows, run_ids, run_row  # noqa: E402


class State(TypedDict):
    notes: str


@tool
def search(q: str) -> str:
    """Search the help center."""
    return f"3 articles about {q}"


def model(n: int, tokens=(10, 2)):
    return GenericFakeChatModel(messages=iter(
        AIMessage(content=f"answer {i}", usage_metadata={"input_tokens": tokens[0], "output_tokens": tokens[1],
                                                         "total_tokens": sum(tokens)}) for i in range(n)))


def graph(inner_calls: int = 1, loop: bool = False):
    llm = model(50)

    def think(state):
        for _ in range(inner_calls):
            llm.invoke("research refunds")
        search.invoke({"q": "refund policy"})
        while loop:
            search.invoke({"q": "refund policy"})
        return {"notes": state["notes"] + " researched"}

    sub = StateGraph(State)
    sub.add_node("think", think)
    sub.add_edge(START, "think")
    sub.add_edge("think", END)

    def plan(state):
        llm.invoke("plan")
        return {"notes": "planned"}

    def write(state):
        llm.invoke("write")
        return {"notes": state["notes"] + " written"}

    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("research", sub.compile())
    g.add_node("write", write)
    g.add_edge(START, "plan")
    g.add_edge("plan", "research")
    g.add_edge("research", "write")
    g.add_edge("write", END)
    return g.compile()


def test_a_subgraph_records_on_a_child_run_and_rolls_up_into_the_parent(sqlite_url, wd):
    h = handler(wd, agent="support-bot", max_steps=10, subgraph_budgets={"research": {"max_steps": 4}})
    out = graph(inner_calls=2).invoke({"notes": ""}, config={"callbacks": [h]})
    assert out["notes"] == "planned researched written"
    (child_id,) = [rid for rid in run_ids(sqlite_url) if rid != h.run.id]
    child = run_row(sqlite_url, child_id)
    assert (child["agent"], child["parent_id"], child["status"], child["max_steps"]) == (
        "research", h.run.id, "completed", 4)
    assert (child["steps"], child["tool_calls"], child["tokens_in"]) == (2, 1, 20)
    assert [(e["kind"], e["tool"]) for e in event_rows(sqlite_url, child_id)] == [
        ("step", None), ("step", None), ("tool", "search")]
    root = run_row(sqlite_url, h.run.id)
    assert (root["status"], root["steps"], root["tool_calls"], root["tokens_in"]) == ("completed", 4, 1, 40)
    assert [e["kind"] for e in event_rows(sqlite_url, h.run.id)] == ["step", "step"]  # plan, write


def test_a_subgraph_over_its_own_budget_is_stopped_and_the_stop_comes_out_of_invoke(sqlite_url, wd):
    h = handler(wd, agent="support-bot", subgraph_budgets={"research": {"max_identical_calls": 3}})
    with pytest.raises(RunKilled) as stop:
        graph(loop=True).invoke({"notes": ""}, config={"callbacks": [h]})
    assert stop.value.reason == "loop_detected"
    (child_id,) = [rid for rid in run_ids(sqlite_url) if rid != h.run.id]
    child = run_row(sqlite_url, child_id)
    assert (child["status"], child["stop_reason"], child["tool_calls"]) == ("killed", "loop_detected", 2)
    root = run_row(sqlite_url, h.run.id)
    assert root["status"] == "killed" and root["tool_calls"] == 2  # the graph cannot go on past a stop
