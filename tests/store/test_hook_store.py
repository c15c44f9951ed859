"""The hook's decisions on each backend (watchdog.gateways.hooks.core over watchdog.store.hooks):
a session is one run found again by its id, each call counted once before it runs, identical
calls a loop, a failure counted after, a profile's pause held until resume; the clock passed in."""

from __future__ import annotations


from watchdog.core.config import parse
from watchdog.gateways.hooks.core import before_tool, decide, run_id_for
from watchdog.gateways.hooks.protocols import HookEvent
from watchdog.store.hooks import session_run

CONFIG = parse({"agents": {"dev": {"max_tool_calls": 4, "max_identical_calls": 3},
                           "held": {"max_tool_calls": 1, "on_breach": "pause"}}})



def pre(session: str, tool: str, args: dict, call: str) -> HookEvent:
    return HookEvent("pre", "PreToolUse", session, tool, args, call, False)


def test_a_session_is_one_run_each_call_counted_once_and_identical_calls_a_loop(engine):
    first = before_tool(engine, CONFIG, cli="claude-code", agent="dev", ev=pre("s1", "Read", {"p": 1}, "t1"))
    assert first.allowed and first.run_id == run_id_for("claude-code", "s1", 0)
    assert before_tool(engine, CONFIG, cli="claude-code", agent="dev", ev=pre("s1", "Read", {"p": 1}, "t2")).allowed
    loop = before_tool(engine, CONFIG, cli="claude-code", agent="dev", ev=pre("s1", "Read", {"p": 1}, "t3"))
    assert not loop.allowed and loop.end_session and "loop_detected" in loop.reason
    assert loop.reason.startswith("agent-watchdog: run ")
    state = session_run(engine, first.run_id)
    assert (state.status, state.stop_reason, state.tool_calls, state.source) == ("killed", "loop_detected", 2, "hook")
    # The next call of that session is refused with the same reason, and counts nothing.
    again = before_tool(engine, CONFIG, cli="claude-code", agent="dev", ev=pre("s1", "Write", {}, "t4"))
    assert not again.allowed and "loop_detected" in again.reason
    assert session_run(engine, first.run_id).tool_calls == 2
    # Another CLI's session of the same id is another run.
    other = before_tool(engine, CONFIG, cli="gemini", agent="dev", ev=pre("s1", "Read", {"p": 1}, None))
    assert other.allowed and other.run_id != first.run_id


def test_a_failed_call_counts_as_an_error_after_it_ran(engine):
    ok = before_tool(engine, CONFIG, cli="codex", agent="dev", ev=pre("s2", "Bash", {"cmd": "false"}, "c1"))
    decide(engine, CONFIG, cli="codex", agent="dev",
           ev=HookEvent("post", "PostToolUse", "s2", "Bash", {"cmd": "false"}, "c1", True))
    state = session_run(engine, ok.run_id)
    assert (state.tool_calls, state.status) == (1, "running")
    from sqlalchemy import select

    from watchdog.store.schema import runs

    with engine.connect() as conn:
        assert conn.execute(select(runs.c.tool_errors).where(runs.c.id == ok.run_id)).scalar() == 1


def test_a_breach_the_profile_pauses_on_holds_every_call(engine):
    assert before_tool(engine, CONFIG, cli="claude-code", agent="held", ev=pre("s3", "A", {}, "1")).allowed
    held = before_tool(engine, CONFIG, cli="claude-code", agent="held", ev=pre("s3", "B", {}, "2"))
    assert not held.allowed and not held.end_session and "paused: waiting for approval" in held.reason
    assert session_run(engine, held.run_id).status == "paused"
    still = before_tool(engine, CONFIG, cli="claude-code", agent="held", ev=pre("s3", "C", {}, "3"))
    assert not still.allowed and "paused: waiting for approval" in still.reason
