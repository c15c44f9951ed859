"""A small scripted tool-calling agent, run as a REAL process by the chaos suite.

    python tests/chaos/agent.py --db URL --agent NAME --scenario S --guards on|off [options]

The "model" is scripted and stateless: its next move is a function of the turn
index (counted from the transcript) and of what the tools returned, like a
deterministic chat provider. The loop itself has no iteration cap of its own:
stopping it is the watchdog's job (in-process guards and the daemon). A
self-deadline (--deadline-s) only makes sure a broken watchdog can never leave
a stray process behind; a test that reaches it has failed long before.

Stdout protocol (the chaos fixtures read it):

- line 1: the run id, printed as soon as the run is registered;
- lines starting with "# ": notes (e.g. "# swallowed RunKilled: ...");
- last line, when the agent leaves by itself: a JSON summary
  {"outcome", "reason", "turns", "executed": {tool: times its code ran}}.

Exit codes: 0 answered (run completed), 2 stopped (RunKilled), 1 another error,
3 the `dies` scenario's os._exit, 97 the self-deadline.

Scenarios (the broken tool is named by --tool):

- healthy       list_files → read_file … → answer (converges in --turns steps); with
                --hold-file it waits after two turns, heartbeating, until that file exists
- always_500    the same call every turn; the tool raises RuntimeError("500 Internal Server Error")
- bad_schema    the tool answers without the required field; the agent validates the
                output and raises ValueError("schema validation failed: iban missing")
- insist        never gives up: every turn retries the broken tool with slightly
                different arguments (no identical calls), --calls-per-step calls a turn
- runaway       the tool works, the model never converges (new arguments every turn)
- stuck         the tool works, the model asks the same thing again every turn
- broken_logic  guards off is the caller's choice; a loop counter that never increments,
                every exception swallowed (RunKilled included), SIGTERM ignored
- hung_tool     a healthy step, then a tool call that never returns
- dies          two healthy turns, then os._exit(3) right after the third model call
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections import Counter

from watchdog import RunKilled, ToolUnavailable, Watchdog

SCENARIOS = ("healthy", "always_500", "bad_schema", "insist", "runaway", "stuck", "broken_logic", "hung_tool", "dies")
DEFAULT_TOOL = {
    "healthy": "read_file", "always_500": "verify_iban", "bad_schema": "lookup_iban", "insist": "verify_iban",
    "runaway": "search_docs", "stuck": "search_docs", "broken_logic": "verify_iban", "hung_tool": "fetch_statement",
    "dies": "read_file",
}  # fmt: skip
IBAN = "IT60X0542811101000000123456"
FILES = {
    "refunds.md": "Refunds are issued within 14 days to the original IBAN.",
    "iban.md": "An IBAN is verified once per customer, at onboarding.",
    "limits.md": "Refunds above 500 EUR need a second approval.",
    "faq.md": "Customers can ask for a refund from their account page.",
}
EXECUTED: Counter = Counter()  # how many times each tool's code actually ran


def note(text: str) -> None:
    print(f"# {text}", flush=True)


# -- tools --------------------------------------------------------------------------------


def list_files():
    EXECUTED["list_files"] += 1
    return sorted(FILES)


def read_file(name):
    EXECUTED["read_file"] += 1
    return FILES[name]


def search_docs(query):
    EXECUTED["search_docs"] += 1
    return {"hits": ["refunds.md", "limits.md"], "query": query}


def tool_impl(scenario: str, name: str):
    """The implementation of the scenario's own tool, named `name`."""

    def always_500(**args):
        EXECUTED[name] += 1
        raise RuntimeError("500 Internal Server Error")

    def bad_schema(**args):
        EXECUTED[name] += 1
        return {"status": "ok", "customer": args.get("customer")}  # the required "iban" is missing

    def hangs(**args):
        EXECUTED[name] += 1
        time.sleep(3600)

    def works(**args):
        EXECUTED[name] += 1
        return {"hits": ["refunds.md"], "args": args}

    return {"always_500": always_500, "insist": always_500, "broken_logic": always_500, "bad_schema": bad_schema,
            "hung_tool": hangs, "runaway": works, "stuck": works}.get(scenario)


def validated(fn):
    """The agent's schema check on a tool's output (the reject policy lives in the caller)."""

    def call(**args):
        out = fn(**args)
        if not isinstance(out, dict) or "iban" not in out:
            raise ValueError("schema validation failed: iban missing")
        return out

    return call


# -- the scripted model -----------------------------------------------------------------


def scripted_model(opts, transcript: list[dict]):
    """('calls', [(tool, args), ...]) or ('answer', text), from the transcript alone."""
    turn = sum(1 for m in transcript if m["role"] == "assistant")
    results = [m for m in transcript if m["role"] == "tool"]
    last = results[-1] if results else None
    s, tool = opts.scenario, opts.tool

    if s in ("healthy", "dies", "hung_tool"):
        if turn == 0:
            return "calls", [("list_files", {})]
        if s == "hung_tool":
            return "calls", [(tool, {"month": "2024-05"})]
        files = next(m["result"] for m in results if m["name"] == "list_files" and m["ok"])
        if turn < opts.turns - 1:
            return "calls", [("read_file", {"name": files[(turn - 1) % len(files)]})]
        return "answer", "Refunds go to the original IBAN within 14 days."
    if last is not None and last["ok"] and s in ("always_500", "bad_schema", "insist", "broken_logic"):
        return "answer", "verified"  # never happens: the tool is broken
    if s in ("always_500", "broken_logic"):
        return "calls", [(tool, {"iban": IBAN})]
    if s == "bad_schema":
        return "calls", [(tool, {"customer": "C-1042"})]
    if s == "insist":
        # "Never give up": try again, a little differently each time.
        return "calls", [(tool, {"iban": IBAN, "attempt": len(results) + j}) for j in range(opts.calls_per_step)]
    if s == "runaway":
        return "calls", [(tool, {"query": f"refund policy, take {len(results) + j}"}) for j in range(opts.calls_per_step)]
    if s == "stuck":
        return "calls", [(tool, {"query": "refund policy"})]
    raise SystemExit(f"unknown scenario {s!r}")


# -- the agent loop -----------------------------------------------------------------------


def tools_for(opts) -> dict:
    tools = {"list_files": (list_files, True), "read_file": (read_file, True), "search_docs": (search_docs, True)}
    impl = tool_impl(opts.scenario, opts.tool)
    if impl is not None:
        if opts.scenario == "bad_schema":
            impl = validated(impl)
        tools[opts.tool] = (impl, opts.scenario in ("runaway", "stuck"))
    return tools


def one_turn(run, wd, opts, transcript, tools):
    """One model call and the tool calls it asked for; True when the model answered."""
    if opts.hold_file and sum(1 for m in transcript if m["role"] == "assistant") == 2:
        # A healthy agent waiting on something slow (a human approval): alive, says so, then goes on.
        while not os.path.exists(opts.hold_file):
            run.heartbeat("waiting for approval")
            time.sleep(0.25)
    run.check_budget(estimated_cost_eur=wd.price_eur(opts.model, opts.tokens_in, opts.tokens_out))
    kind, payload = scripted_model(opts, transcript)
    run.step(model=opts.model, tokens_in=opts.tokens_in, tokens_out=opts.tokens_out)
    transcript.append({"role": "assistant", "kind": kind, "content": payload})
    if kind == "answer":
        return True
    turn = sum(1 for m in transcript if m["role"] == "assistant")
    if opts.scenario == "dies" and turn == 3:
        note("dying in the middle of the run (os._exit)")
        os._exit(3)
    for name, args in payload:
        fn, read_only = tools[name]
        try:
            result = run.tool_call(name, args, fn, read_only=read_only)
            transcript.append({"role": "tool", "name": name, "ok": True, "result": result})
        except ToolUnavailable as exc:  # the circuit is open: the model reads why
            transcript.append({"role": "tool", "name": name, "ok": False, "error": str(exc)})
        except Exception as exc:  # the tool failed: the model sees the error and decides
            transcript.append({"role": "tool", "name": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return False


def broken_logic(run, wd, opts, transcript, tools):
    """In-process logic that cannot stop itself: the external daemon must."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # "graceful shutdown" handler that never shuts down
    attempts = 0
    swallowed = 0
    while attempts < 3:  # BUG: `attempts` never increments
        try:
            if one_turn(run, wd, opts, transcript, tools):
                return
            attempts + 1  # BUG: should be `attempts += 1`
        except BaseException as exc:  # BUG: swallows everything, RunKilled included  # noqa: BLE001
            if isinstance(exc, RunKilled):
                swallowed += 1
                if swallowed == 1:
                    note(f"swallowed RunKilled: {exc}")
        time.sleep(opts.pace)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True)
    p.add_argument("--agent", required=True)
    p.add_argument("--scenario", required=True, choices=SCENARIOS)
    p.add_argument("--guards", choices=("on", "off"), default="on")
    p.add_argument("--tool", default=None, help="name of the scenario's own tool")
    p.add_argument("--kill-mode", default="process")
    p.add_argument("--pace", type=float, default=0.15, help="seconds between turns")
    p.add_argument("--calls-per-step", type=int, default=1)
    p.add_argument("--turns", type=int, default=4, help="healthy: steps to the answer")
    p.add_argument("--model", default="gpt-x")
    p.add_argument("--tokens-in", type=int, default=2000)
    p.add_argument("--tokens-out", type=int, default=200)
    p.add_argument("--budget", action="append", default=[], metavar="KEY=VALUE", help="a run budget (lower only)")
    p.add_argument("--hold-file", default=None,
                   help="healthy: after two turns, wait (with heartbeats) until this file exists")
    p.add_argument("--circuit-cache-s", type=float, default=None)
    p.add_argument("--deadline-s", type=float, default=120.0)
    opts = p.parse_args(argv)
    opts.tool = opts.tool or DEFAULT_TOOL[opts.scenario]

    deadline = threading.Timer(opts.deadline_s, lambda: os._exit(97))
    deadline.daemon = True
    deadline.start()

    budgets = {}
    for item in opts.budget:
        key, _, value = item.partition("=")
        budgets[key] = float(value) if "." in value else int(value)
    kw = {} if opts.circuit_cache_s is None else {"circuit_cache_s": opts.circuit_cache_s}
    wd = Watchdog(opts.db, **kw)
    run = wd.run(agent=opts.agent, kill_mode=opts.kill_mode, guards=opts.guards == "on",
                 labels={"chaos": opts.scenario}, **budgets)
    tools = tools_for(opts)
    transcript = [{"role": "user", "content": "Refund order 1042 to the customer's verified IBAN."}]
    outcome, reason, code = "completed", None, 0
    try:
        with run:
            print(run.id, flush=True)
            if opts.scenario == "broken_logic":
                broken_logic(run, wd, opts, transcript, tools)
            else:
                while not one_turn(run, wd, opts, transcript, tools):  # no cap of its own: the watchdog's job
                    time.sleep(opts.pace)
    except RunKilled as stop:
        outcome, reason, code = "killed", stop.reason, 2
    except Exception as exc:  # noqa: BLE001
        outcome, reason, code = "failed", f"{type(exc).__name__}: {exc}", 1
    turns = sum(1 for m in transcript if m["role"] == "assistant")
    print(json.dumps({"outcome": outcome, "reason": reason, "turns": turns, "executed": dict(EXECUTED)}), flush=True)
    wd.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
