"""A coding CLI's sub-agents as child runs of their session's run (issue 33), through the real
`agent-watchdog hook claude-code` command, with hook inputs as Claude Code 2.1.197 builds them:
every hook input carries the main `session_id`; a sub-agent's also `agent_id` and `agent_type`
(read in the pinned binary's hook input builder; Codex 0.171's PreToolUse schema has the same
two fields).

A sub-agent's call is judged on its own run (its own events: loops, identical calls) and on the
session's (its totals: each child call is rolled up), counted once (the child's event); a stopped
or paused session holds its sub-agents too.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from test_otlp_logs_identity import hook
from watchdog.store.engine import make_engine
from watchdog.store.schema import runs

TOML = """
[agents.sub-bot]
max_tool_calls = 7
max_identical_calls = 3
"""


def family(url: str, session: str) -> tuple:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = [r for r in conn.execute(select(runs)) if (r.labels or {}).get("session") == session
                    or (r.labels or {}).get("parent_session") == session]
    finally:
        engine.dispose()
    parents = [r for r in rows if r.parent_id is None]
    return parents, [r for r in rows if r.parent_id is not None]


def refused(done) -> str:
    assert done.returncode == 0, done.stderr
    if not done.stdout.strip():
        return ""
    return json.loads(done.stdout)["hookSpecificOutput"]["permissionDecisionReason"]


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_a_subagents_calls_are_a_child_run_judged_on_its_own_and_on_the_sessions_totals(db_url, tmp_path):
    cfg = tmp_path / "wd.toml"
    cfg.write_text(TOML)
    home = tmp_path / "home"

    def call(n: int, command: str = "", **sub: str) -> str:
        return refused(hook(db_url, "s-sub", home, agent="sub-bot", tool_use_id=f"toolu_{n}",
                            command=command or f"echo {n}", config=str(cfg), **sub))

    assert call(1) == ""  # the main agent
    explore = {"agent_id": "a1b2c3", "agent_type": "Explore"}
    assert call(2, **explore) == "" and call(3, **explore) == ""
    (session,), (child,) = family(db_url, "s-sub")
    assert child.parent_id == session.id and child.labels["subagent"] == "Explore"
    assert (session.tool_calls, child.tool_calls) == (3, 2)  # the child's calls are the session's too
    # The sub-agent loops (the same call a third time): its own run is stopped, not the session.
    assert call(4, "ls", **explore) == "" and call(5, "ls", **explore) == ""
    why = call(6, "ls", **explore)
    assert why.startswith("agent-watchdog:") and "loop_detected" in why, why
    (session,), (child,) = family(db_url, "s-sub")
    assert (child.status, child.stop_reason) == ("killed", "loop_detected") and session.status == "running"
    assert call(7) == ""  # the main agent goes on
    # Another sub-agent: a child of its own; the session's total (7) stops the next call of any.
    other = {"agent_id": "d4e5f6", "agent_type": "general-purpose"}
    assert call(8, **other) == ""
    why = call(9, **other)
    assert "max_tool_calls" in why, why
    (session,), children = family(db_url, "s-sub")
    assert (session.status, session.stop_reason, session.tool_calls) == ("killed", "max_tool_calls", 7)
    assert sorted(c.tool_calls for c in children) == [1, 4]
    # A stopped session holds its sub-agents: refused naming the session's run.
    why = call(10, **{"agent_id": "g7h8i9", "agent_type": "Explore"})
    assert session.id[:8] in why and "max_tool_calls" in why, why
    assert len(family(db_url, "s-sub")[1]) == 2  # no child run made for a stopped session
