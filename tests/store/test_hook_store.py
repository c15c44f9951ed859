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


def post(session: str, tool: str, args: dict, call: str | None, event: str = "PostToolUse") -> HookEvent:
    return HookEvent("post", event, session, tool, args, call, True)


def tools_of(engine, run_id: str):
    import datetime as dt

    from watchdog.store.run_rows import top_tool
    from watchdog.store.views import list_runs

    with engine.connect() as conn:
        (record,) = [r for r in list_runs(conn, CONFIG, dt.datetime.now(dt.timezone.utc), all_runs=True)
                     if r["id"] == run_id]
        return top_tool(conn, run_id), record["top_tool"], record["tool_calls"], record["tool_errors"]


def test_a_failed_call_is_an_error_of_its_tool_once_per_call(engine):
    """The hook counts a call before it runs (ok unknown): its failure, reported after, is an error
    of its tool in the top tool (the alert's read, `runs`/`show`), once per call: by the CLI's call
    id (Claude Code's PostToolUse and PostToolUseFailure of one call are one failure)."""
    def call(tool, args, cid):
        assert before_tool(engine, CONFIG, cli="claude-code", agent="dev", ev=pre("s9", tool, args, cid)).allowed

    call("Bash", {"c": 1}, "u1")
    call("Bash", {"c": 2}, "u2")
    call("Read", {"p": 1}, "u3")
    for ev in (post("s9", "Bash", {"c": 1}, "u1"), post("s9", "Bash", {"c": 1}, "u1", "PostToolUseFailure"),
               post("s9", "Bash", {"c": 2}, "u2")):
        decide(engine, CONFIG, cli="claude-code", agent="dev", ev=ev)
    rid = run_id_for("claude-code", "s9", 0)
    top, shown, calls, errors = tools_of(engine, rid)
    assert tuple(top) == ("Bash", 2, 2) and shown == {"name": "Bash", "calls": 2, "errors": 2}
    assert (calls, errors) == (3, 2)
    from watchdog.store.trace import run_lines

    with engine.connect() as conn:  # show --jsonl: the calls, then their failed results
        lines = [(x["event"], x.get("tool"), x.get("ok")) for x in run_lines(conn, rid) if "seq" in x]
    assert lines == [("tool_call", "Bash", None), ("tool_call", "Bash", None), ("tool_call", "Read", None),
                     ("heartbeat", "Bash", False), ("heartbeat", "Bash", False)]


def test_a_cli_without_call_ids_has_each_failure_matched_to_one_call_and_loops_still_stop(engine):
    """Gemini CLI's hook input names no call id: a failure is matched to the latest call of the
    same tool and arguments without a result, so two failed identical calls are two errors; the
    third identical call is a loop (max_identical_calls = 3), and the stopped run's sealed top
    tool keeps its errors."""
    from watchdog.store.retention import seal_ended

    args = {"command": "false"}
    for _ in range(2):
        ok = before_tool(engine, CONFIG, cli="gemini", agent="dev", ev=pre("g1", "run_shell_command", args, None))
        assert ok.allowed
        decide(engine, CONFIG, cli="gemini", agent="dev",
               ev=HookEvent("post", "AfterTool", "g1", "run_shell_command", args, None, True))
    loop = before_tool(engine, CONFIG, cli="gemini", agent="dev", ev=pre("g1", "run_shell_command", args, None))
    assert not loop.allowed and "loop_detected" in loop.reason
    top, shown, calls, errors = tools_of(engine, ok.run_id)
    assert tuple(top) == ("run_shell_command", 2, 2) and shown == {"name": "run_shell_command", "calls": 2, "errors": 2}
    assert (calls, errors) == (2, 2)
    assert seal_ended(engine) >= 1
    assert tools_of(engine, ok.run_id)[1] == {"name": "run_shell_command", "calls": 2, "errors": 2}


def test_the_daemons_stop_of_a_hook_run_names_its_tools_errors(engine):
    """A stop the daemon makes (here max_tokens, from the steps the CLI's log events brought)
    names the top tool with the errors the hook appended after its calls, which its fold of the
    calls does not see."""
    from daemon_support import SEALER, alerts_of
    from watchdog.core import lifecycle as lc
    from watchdog.daemon.stops.killer import Killer
    from watchdog.daemon.tick.ticker import Ticker
    from watchdog.store import witness
    from watchdog.store.schema import utcnow

    cfg = parse({"agents": {"dev": {"max_tool_calls": 40, "max_tokens": 1000}}})
    tk = Ticker(engine, cfg, Killer(), sealer=SEALER)
    tk.tick(utcnow())
    for cid in ("t1", "t2"):
        assert before_tool(engine, cfg, cli="claude-code", agent="dev", ev=pre("s7", "Bash", {"c": cid}, cid)).allowed
        decide(engine, cfg, cli="claude-code", agent="dev", ev=post("s7", "Bash", {"c": cid}, cid, "PostToolUseFailure"))
    rid = run_id_for("claude-code", "s7", 0)
    with engine.begin() as conn:
        assert witness.append(conn, rid, [witness.WitnessedCall(kind=lc.EV_STEP, model="m", tokens_in=900,
                                                                tokens_out=200)], source=lc.Source.OTLP,
                              now=witness.store_now(conn))
    assert tk.tick(utcnow()).stops == [(rid, lc.MAX_TOKENS)]
    (alert,) = alerts_of(engine, rid)
    assert "×2 (100%), 2 errors" in alert.body, alert.body
