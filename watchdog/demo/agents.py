"""The demo's agents: one small tool-calling loop, six behaviours. Each runs as its own process:

    python -m watchdog.demo.agents BEHAVIOUR --db URL --files DIR --run-id ID

The loop is the ordinary one (ask the model, run the tools it asks for, feed
the results back, stop when it answers) instrumented with the SDK the way
docs/howto/instrument.md recommends: `check_budget` before each model call, `step` after it,
every tool through `run.tool_call`, a tool's error handed to the model as text.
What differs between behaviours is the script the model follows and, for two
of them, a deliberately broken agent around the loop.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from watchdog.demo.model import MODEL, ScriptedModel
from watchdog.demo.tools import Catalogue

EXIT_COMPLETED = 0
EXIT_KILLED = 3

# Defenses, as the final table names them (the runner classifies each run into one).
GUARD = "in-process guard"
COOPERATIVE = "daemon cooperative stop"
SIGTERM = "SIGTERM"
SIGKILL = "SIGKILL"
CIRCUIT = "circuit breaker"
NONE = "none"


@dataclass(frozen=True)
class Behaviour:
    name: str
    story: str  # one line for the demo's introduction
    task: str  # the user message
    guards: bool  # the SDK's in-process guards
    pace_s: float  # the scripted model's latency per turn
    # What must happen, or the demo fails: status, stop reason, defense (+ circuit breaker).
    status: str
    reason: str | None
    defense: str
    circuit: bool = False


BEHAVIOURS = {b.name: b for b in (
    Behaviour("plan", "healthy: list the files, read one, answer", "Which file mentions a timeout?",
              True, 0.15, "completed", None, NONE),
    Behaviour("recover", "healthy: guesses a file that does not exist, reads the error, lists, reads, answers",
              "What does timeout.log say?", True, 0.15, "completed", None, NONE),
    Behaviour("runaway", "never answers, always one more lead; no in-process guard (guards=False)",
              "Find every clue about the refund incident.", False, 0.15, "killed", "max_cost", COOPERATIVE),
    Behaviour("broken-tool", "retries verify_iban, whose upstream answers 500 to everything",
              "Verify the IBAN of customer ACME before refund R-1042.", True, 0.15, "killed", "loop_detected",
              GUARD, circuit=True),
    Behaviour("hung", "calls scan_archive, which never returns (no timeout anywhere)",
              "Index the log archive.", True, 0.15, "killed", "heartbeat_timeout", SIGTERM),
    Behaviour("stubborn", "never answers, swallows every exception (the stop too), ignores SIGTERM", "Check every refund.", False, 0.3, "killed", "max_tool_calls", SIGKILL),
)}

SYSTEM = "You are a support agent. Use the tools to find facts; answer in one sentence when you know."


def turn(run, model: ScriptedModel, tools: Catalogue, messages: list[dict], pace_s: float) -> str | None:
    """One model call and the tools it asks for; the answer when the model gives one."""
    schema = tools.schema()
    # Pre-flight: refuse the call that would exceed the money budget (the guard overshoots by at most one call).
    run.check_budget(estimated_cost_eur=run.wd.price_eur(MODEL, model.prompt_tokens(messages, schema), 0))
    reply = model.complete(messages, schema)
    time.sleep(pace_s)  # the model "thinks": real pacing leaves the daemon's ticks room to act
    run.step(model=MODEL, tokens_in=reply.tokens_in, tokens_out=reply.tokens_out)
    messages.append(reply.message())
    if not reply.tool_calls:
        return reply.content
    for call in reply.tool_calls:
        tool = tools.tools[call.name]
        # Say what we are about to do: a tool event is written only when the call
        # returns, so for a call that hangs this progress line is what names it.
        run.heartbeat(f"calling {call.name}")
        try:
            result = run.tool_call(call.name, call.args, tool.fn, read_only=tool.read_only)
        except Exception as exc:  # a tool error is data for the model (RunKilled is not an Exception)
            result = f"Error: {type(exc).__name__}: {exc}"
        messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result})
    return None


def stubborn_loop(run, model, tools, messages, pace_s):
    """The broken agent the daemon exists for: nothing it raises can stop it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        try:
            turn(run, model, tools, messages, pace_s)
        except BaseException:  # noqa: BLE001 — the bug on display: this eats RunKilled and SystemExit too
            time.sleep(pace_s)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m watchdog.demo.agents", description=__doc__.splitlines()[0])
    p.add_argument("behaviour", choices=sorted(BEHAVIOURS))
    p.add_argument("--db", required=True, help="store URL")
    p.add_argument("--files", required=True, type=Path, help="the folder the tools work on")
    p.add_argument("--run-id", default=None, help="the run id to register (the demo picks it to follow the run)")
    p.add_argument("--circuit-cache-s", type=float, default=0.5,
                   help="how stale the SDK's view of the tool circuits may be (the demo's tick)")
    args = p.parse_args(argv)

    from watchdog import RunKilled, Watchdog  # after argparse: --help stays fast

    b = BEHAVIOURS[args.behaviour]
    wd = Watchdog(args.db, circuit_cache_s=args.circuit_cache_s)
    model, tools = ScriptedModel(b.name), Catalogue(args.files)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": b.task}]
    try:
        with wd.run(agent=b.name, kill_mode="process", run_id=args.run_id, guards=b.guards) as run:
            if b.name == "stubborn":
                stubborn_loop(run, model, tools, messages, b.pace_s)
            answer = None
            while answer is None:
                answer = turn(run, model, tools, messages, b.pace_s)
    except RunKilled as stop:
        print(f"{b.name}: stopped: {stop}", file=sys.stderr)
        return EXIT_KILLED
    finally:
        wd.close()
    print(f"{b.name}: {answer}")
    return EXIT_COMPLETED


if __name__ == "__main__":
    sys.exit(main())
