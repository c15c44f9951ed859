"""The README's one LangChain line on a real LangGraph `create_react_agent` whose model calls the
same tool forever, on a fresh store that no daemon ever published profiles to: the in-process
guard stops it after two calls (the third identical call is refused before it runs), instead of
the 5,000 steps the graph would run to its recursion limit."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("langgraph")  # in the langchain and test extras

from langchain_core.language_models.chat_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.prebuilt import create_react_agent  # noqa: E402

from watchdog import RunKilled, Watchdog  # noqa: E402
from watchdog.core import lifecycle as lc  # noqa: E402
from watchdog.store.schema import settings  # noqa: E402

from .integration_support import event_rows, run_ids, run_row  # noqa: E402

SEARCHES: list[str] = []
_ids = itertools.count()


@tool
def search(q: str) -> str:
    """Search the help center."""
    SEARCHES.append(q)
    return "no article found"


class StuckModel(BaseChatModel):
    """A model that asks for the same search, whatever it is told."""

    @property
    def _llm_type(self) -> str:
        return "stuck-fake"

    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        msg = AIMessage(content="", tool_calls=[{"name": "search", "args": {"q": "refund"}, "id": f"call_{next(_ids)}"}],
                        usage_metadata={"input_tokens": 40, "output_tokens": 8, "total_tokens": 48})
        return ChatResult(generations=[ChatGeneration(message=msg)])


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_a_looping_react_agent_on_a_fresh_store_is_stopped_by_the_guard(db_url, engine, monkeypatch):
    monkeypatch.delenv("AGENT_WATCHDOG_CONFIG", raising=False)
    SEARCHES.clear()
    with engine.connect() as conn:
        assert conn.execute(settings.select()).first() is None  # no daemon has ever published here
    wd = Watchdog(db_url)
    agent = create_react_agent(StuckModel(), [search])
    try:
        with pytest.raises(RunKilled) as stop:
            # The README's one line:
            agent.invoke({"messages": [("user", "refund order 42")]},
                         config={"callbacks": [wd.langchain(agent="support-bot")], "recursion_limit": 10_000})
    finally:
        wd.close()
    assert stop.value.reason == lc.LOOP_DETECTED
    assert SEARCHES == ["refund", "refund"]  # the third identical call never ran
    (rid,) = run_ids(db_url)
    row = run_row(db_url, rid)
    assert row["status"] == lc.KILLED and row["stop_reason"] == lc.LOOP_DETECTED
    assert "in-process guard" in row["stop_detail"]
    assert [e["tool"] for e in event_rows(db_url, rid) if e["kind"] == "tool"] == ["search", "search"]
    assert row["steps"] <= 3
