"""The chaos suite: the source article's list, each case with REAL agent processes
and the REAL daemon (`agent-watchdog run`), fixtures in tests/chaos/conftest.py.

Budgets of the suite's profile (conftest.CHAOS_CONFIG [defaults]): 8 steps,
12 tool calls, 0.50 EUR, 20 s, 3 identical calls; [circuit] 3 errors in 60 s;
the daemon ticks every 0.2 s with 1 s graces. "Within budget" always means
budget + one tick of slack, computed in conftest.Slack and documented there.
"""

from __future__ import annotations

import time

import signal

import pytest

from .conftest import CHAOS_CONFIG

pytestmark = pytest.mark.slow

BUDGET_REASONS = {"loop_detected", "max_steps", "max_tool_calls", "max_cost", "wall_clock"}


def _tool_errors(run):
    return [e for e in run.events("tool") if e.ok is False]



def _heard_once(run, timeout_s: float = 20.0) -> bool:
    """An in-process guard's stop is the agent's own: the daemon only hears it, once, at its
    next tick after the run ended (issue 19): one stop_requested record, nothing else."""
    deadline = time.monotonic() + timeout_s
    while run.daemon_actions() == [] and time.monotonic() < deadline:
        time.sleep(0.1)
    return run.daemon_actions() == ["stop_requested"]

def test_tool_always_500_stops_the_run_and_opens_the_circuit(db_url, watchdog_daemon, agent_process):
    """1. A tool that always returns 500: every run stops, the circuit opens, later calls fail fast."""
    guarded = agent_process(agent="payments", scenario="always_500", tool="verify_iban")
    unguarded = agent_process(agent="payments", scenario="always_500", tool="verify_iban", guards=False)

    for run in (guarded, unguarded):
        assert run.within_budgets()
        row = run.row()
        assert row.status == "killed" and row.stop_reason == "loop_detected", run.diagnostics()
        assert all(e.error_msg == "500 Internal Server Error" or e.error_class == "ToolUnavailable"
                   for e in _tool_errors(run))
        assert run.wait_exit() == 2 and run.summary()["outcome"] == "killed"
    # In-process: the guard refused the 3rd identical call; the daemon only heard the stop, once.
    assert guarded.row().tool_calls == 2 and "in-process guard" in guarded.row().stop_detail
    assert _heard_once(guarded)
    # Guards off: the daemon saw 3 identical calls and asked the run to stop; it obeyed on its next write.
    assert unguarded.daemon_actions() == ["stop_requested"]
    assert "in-process guard" not in unguarded.row().stop_detail

    circuit = watchdog_daemon.wait_circuit("verify_iban", "open")
    assert circuit.errors_in_window >= 3 and "500" in circuit.last_error
    assert [i.action for i in watchdog_daemon.interventions(tool="verify_iban")][:1] == ["circuit_open"]

    # A run started while the circuit is open fails fast: the broken tool's code never runs.
    late = agent_process(agent="payments", scenario="always_500", tool="verify_iban")
    assert late.within_budgets()
    assert late.status == "killed" and late.wait_exit() == 2
    assert late.summary()["executed"].get("verify_iban", 0) == 0
    assert {e.error_class for e in _tool_errors(late)} == {"ToolUnavailable"}
    assert guarded.innocent_runs_untouched() and late.innocent_runs_untouched()


def test_tool_output_failing_its_schema_is_not_retried_forever(watchdog_daemon, agent_process):
    """2. A tool whose output always fails its schema: the reject/retry does not go on forever."""
    runs = [agent_process(agent="onboarding", scenario="bad_schema", tool="lookup_iban", guards=g) for g in (True, False)]
    for run in runs:
        assert run.within_budgets()
        row = run.row()
        assert row.status == "killed" and row.stop_reason in BUDGET_REASONS, run.diagnostics()
        errors = _tool_errors(run)
        # Rejected by the schema check, or failed fast once the daemon opened the tool's circuit.
        assert errors and all(e.error_class in ("ValueError", "ToolUnavailable") for e in errors)
        assert run.wait_exit() == 2
        # Bounded retries: the tool ran a handful of times, nowhere near the tool-call budget.
        assert run.summary()["executed"].get("lookup_iban", 0) <= 3 + run.slack.tool_calls
    assert any(e.error_msg == "schema validation failed: iban missing" for run in runs for e in _tool_errors(run))
    assert runs[0].row().stop_reason == "loop_detected" and _heard_once(runs[0])
    assert runs[1].daemon_actions() == ["stop_requested"]
    assert runs[0].innocent_runs_untouched()


def test_insist_agent_against_a_broken_tool_structural_limits_win(watchdog_daemon, agent_process):
    """3. "Never give up" + a broken tool, never the same arguments twice: max_steps / max_tool_calls win."""
    cases = {
        # (guards, calls per turn) → the structural limit that must stop it
        (True, 1): "max_steps",
        (True, 3): "max_tool_calls",
        (False, 1): "max_steps",
        (False, 3): "max_tool_calls",
    }
    started = {key: agent_process(agent="insist", scenario="insist", tool="verify_iban", guards=key[0],
                                  calls_per_step=key[1]) for key in cases}
    for (guards, per_turn), run in started.items():
        assert run.within_budgets()
        row = run.row()
        assert (row.status, row.stop_reason) == ("killed", cases[(guards, per_turn)]), run.diagnostics()
        # Identical-call detection never had a chance: every call had new arguments.
        hashes = [e.args_hash for e in run.events("tool")]
        assert len(hashes) == len(set(hashes))
        if guards:  # the guard refuses the call that would exceed: exactly at the budget
            assert row.steps <= 8 and row.tool_calls <= 12 and _heard_once(run)
            assert "in-process guard" in row.stop_detail
        else:
            assert run.daemon_actions() == ["stop_requested"]
        assert run.wait_exit() == 2
    assert started[(True, 1)].innocent_runs_untouched()


def test_broken_internal_logic_is_still_killed_by_the_daemon(watchdog_daemon, agent_process):
    """4. A counter that never increments, every exception swallowed (RunKilled too), SIGTERM ignored:
    the external daemon still ends it, with SIGKILL — guards off, and guards on (their stop is swallowed too)."""
    off = agent_process(agent="reconciler", scenario="broken_logic", tool="verify_iban", guards=False)
    # Guards on: the in-process guard trips, the agent eats its RunKilled. heartbeat_timeout_s bounds the case
    # even if the SDK never tells the store about its own stop (the daemon then sees a silent run).
    on = agent_process(agent="reconciler", scenario="broken_logic", tool="verify_iban", guards=True,
                       heartbeat_timeout_s=3.0)
    for run in (off, on):
        assert run.within_budgets()
        row = run.row()
        assert row.status == "killed" and row.stop_reason in BUDGET_REASONS | {"heartbeat_timeout"}, run.diagnostics()
        assert run.daemon_actions()[-3:] == ["sigterm", "sigkill", "ended"]
        assert run.wait_exit() == -signal.SIGKILL
        assert any(n.startswith("swallowed RunKilled") for n in run.notes())  # it did see the stop, and ate it
        assert run.summary() is None  # it never left by itself
    assert off.daemon_actions() == ["stop_requested", "sigterm", "sigkill", "ended"]
    assert off.innocent_runs_untouched() and on.innocent_runs_untouched()


def test_hung_tool_is_stopped_by_heartbeat_timeout_then_sigterm(watchdog_daemon, agent_process):
    """5. A tool that never returns: silent past heartbeat_timeout_s, then SIGTERM ends it."""
    run = agent_process(agent="statements", scenario="hung_tool", tool="fetch_statement", heartbeat_timeout_s=1.5)
    assert run.within_budgets()
    row = run.row()
    assert (row.status, row.stop_reason) == ("killed", "heartbeat_timeout"), run.diagnostics()
    assert run.daemon_actions() == ["stop_requested", "sigterm", "ended"]
    assert run.wait_exit() == -signal.SIGTERM
    tools = run.events("tool")
    assert [e.tool for e in tools] == ["list_files"]  # the hung call never came back to be recorded
    assert run.innocent_runs_untouched()


def test_process_that_dies_mid_run_is_marked_lost(watchdog_daemon, agent_process):
    """6. The agent process dies (os._exit) in the middle of a run: lost, process_gone, nothing signalled."""
    run = agent_process(agent="exporter", scenario="dies")
    assert run.wait_exit() == 3
    row = run.wait_ended()
    assert (row.status, row.stop_reason) == ("lost", "process_gone"), run.diagnostics()
    assert row.steps == 3 and row.tool_calls == 2
    assert run.daemon_actions() == ["lost"]
    assert run.ended_within(steps=8, seconds=20, eur=0.5)
    assert run.innocent_runs_untouched()


def test_no_run_exceeds_its_budgets_and_innocent_runs_are_untouched(watchdog_daemon, agent_process):
    """The article's criterion: with a tool that always fails, no run exceeds N steps, X seconds or Y euros
    (its budgets + one tick of slack, conftest.Slack), and a healthy run beside them is not touched."""
    healthy = agent_process(agent="support-bot", scenario="healthy", turns=4, hold=True)
    healthy.run_id  # registered before the broken ones start; it holds (heartbeating) until released below
    broken = [
        agent_process(agent="payments", scenario="always_500", guards=True),
        agent_process(agent="payments", scenario="always_500", guards=False),
        agent_process(agent="insist", scenario="insist", guards=True, calls_per_step=3),
        agent_process(agent="insist", scenario="insist", guards=False),
        agent_process(agent="insist", scenario="insist", guards=False, calls_per_step=3),
        agent_process(agent="insist", scenario="insist", guards=False, model="gpt-big"),  # money binds first
        agent_process(agent="insist", scenario="insist", guards=False, pace_s=0.5, max_wall_s=2.0),  # time binds
    ]
    expected = ["loop_detected", "loop_detected", "max_tool_calls", "max_steps", "max_tool_calls", "max_cost",
                "wall_clock"]
    for run, reason in zip(broken, expected):
        assert run.within_budgets()  # steps ≤ N+slack, seconds ≤ X+slack, EUR ≤ Y+slack, tool calls too
        row = run.row()
        assert (row.status, row.stop_reason) == ("killed", reason), run.diagnostics()

    assert healthy.proc.poll() is None and healthy.status == "running"  # alive beside them all along
    healthy.release()
    row = healthy.wait_ended()
    assert (row.status, row.stop_reason, row.steps) == ("completed", None, 4)
    assert healthy.actions() == [] and healthy.wait_exit() == 0
    for run in broken:
        assert run.innocent_runs_untouched()


def test_runaway_down_is_stopped(watchdog_daemon, agent_process):
    # The shape `agent-watchdog postmortem` suggests for a run stopped on a tool that was down, held
    # to the suite's own budgets (not a production profile's 12 steps / 300 s / 2.00 EUR).
    b = CHAOS_CONFIG["defaults"]
    run = agent_process(agent='runaway', scenario='always_500', tool='verify_iban', guards=False)
    assert run.ended_within(steps=b["max_steps"], seconds=b["max_wall_s"], eur=b["max_cost_eur"],
                            tool_calls=b["max_identical_calls"])  # the loop is caught at its 3rd identical call
    row = run.row()
    assert (row.status, row.stop_reason) == ("killed", "loop_detected"), run.diagnostics()
    assert run.daemon_actions() == ["stop_requested"]  # guards off: the daemon stopped it, cooperatively
    errors = _tool_errors(run)  # the tool's own 500s; a call after the circuit opened fails fast instead
    assert errors and all(e.error_msg == "500 Internal Server Error" or e.error_class == "ToolUnavailable"
                          for e in errors)
    assert sum(e.error_msg == "500 Internal Server Error" for e in errors) >= b["max_identical_calls"]
    assert run.wait_exit() == 2 and run.innocent_runs_untouched()
