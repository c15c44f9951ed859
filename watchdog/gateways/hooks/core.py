"""The hook's decision for one tool call of a coding CLI's session, whatever the CLI.

A session (the CLI's `session_id`) is one run, `source = "hook"`, found again at every call by
its id: derived from the CLI, the Unix user, the session id and the user's secret key
(watchdog.core.sessions: nobody else can compute it, so nobody else can create it first; an id
taken by a row this login cannot see is skipped for the next one, never failed open on). A
run that ended by silence (an idle session, ended `completed` by the daemon) is followed by the
next generation's run.

Before a call: refused when the run is stopped (any reason), paused (until `resume`), or when
the call would break a budget (the SDK's guard, fed the store's counters: tool calls, identical
calls, oscillation, wall clock); otherwise counted before it runs. After a call: its failure
counts on the run's errors, and a stopped run ends the session there (`continue: false`: after
a call, a batch of calls, a turn).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import stat
from dataclasses import dataclass
from typing import Any

from watchdog.core import budgets as bud, lifecycle as lc, policies as ap
from watchdog.core.periods import utcnow
from watchdog.core.text import command_id
from watchdog.core.config import Config
from watchdog.core.lifecycle import hash_args
from watchdog.core.sessions import MAX_GENERATIONS
from watchdog.core.sessions import run_id_for as _run_id
from watchdog.errors import RunKilled
from watchdog.sdk.guards import Guard
from watchdog.store import hooks as store

from watchdog.gateways.hooks import sessionkey

from watchdog.gateways.hooks.protocols import POST, PRE, HookEvent

PREFIX = "agent-watchdog:"


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str = ""  # begins PREFIX when refused
    end_session: bool = False
    run_id: str | None = None


_KEYS: dict[str, bytes] = {}  # key file path -> key (the resident helper reads it once)


def run_id_for(cli: str, session_id: str, generation: int, uid: int | None = None) -> str:
    path = sessionkey.key_path()
    key = _KEYS.get(path)
    if key is None:
        key = _KEYS[path] = sessionkey.load(path)
    return _run_id(cli, session_id, generation, os.getuid() if uid is None else uid, key)


def _over(state: Any) -> bool:
    """The run ended by silence (or its writer): the session's next call starts the next run."""
    return state.status in lc.END_STATUSES and (state.stop_reason in (None, lc.StopReason.HEARTBEAT_TIMEOUT))


def _session(engine: Any, cli: str, agent: str, session_id: str, *, labels: dict[str, Any] | None = None,
             parent_id: str | None = None) -> tuple[str, Any]:
    """(run id, state) of the session's current run, created when it has none."""
    for gen in range(MAX_GENERATIONS):
        rid = run_id_for(cli, session_id, gen)
        state = store.session_run(engine, rid)
        if state is None:
            store.open_session(engine, rid, agent=agent, host=socket.gethostname(),
                               labels=labels or {"cli": cli, "session": session_id[:200]}, uid=os.getuid(),
                               parent_id=parent_id)
            state = store.session_run(engine, rid)
            if state is None:
                continue  # the id is taken by a row this login cannot see (not its own): the next one
            return rid, state
        if state.source != lc.Source.HOOK:
            continue  # not a run a hook made (a row someone else put there): never this session's
        if not _over(state):
            return rid, state
    raise RuntimeError(f"session {session_id[:40]!r}: more than {MAX_GENERATIONS} runs")


def _subagent(engine: Any, cli: str, agent: str, ev: HookEvent, parent_id: str) -> tuple[str, Any]:
    """A sub-agent's child run under the session's run: its own budgets (the same profile), its
    calls rolled up into the session's (watchdog.store.hooks.count_call)."""
    sid = ev.session_id or "no-session"
    key = f"{sid}\x00subagent\x00{ev.agent_id}"  # (after_tool names it alike)
    labels = {"cli": cli, "session": f"{sid[:150]}/{(ev.agent_id or '')[:40]}", "parent_session": sid[:200],
              "subagent": ev.agent_type or "?"}
    return _session(engine, cli, agent, key, labels=labels, parent_id=parent_id)


def paused(run_id: str, reason: str | None) -> str:
    why = f" ({reason})" if reason else ""
    return (f"{PREFIX} run {run_id[:8]} paused: waiting for approval{why}; "
            f"a human may let it go on: agent-watchdog resume {command_id(run_id) or 'RUN'}")  # whole: see command_id


def refused(reason: str, detail: str | None, run_id: str) -> str:
    tail = f": {detail}" if detail else ""
    return f"{PREFIX} run {run_id[:8]} stopped: {reason}{tail}"


def _held(rid: str, state: Any) -> Verdict | None:
    """The refusal of a call of a run that is paused or not running (None: it runs)."""
    if state.status == lc.Status.PAUSED:
        return Verdict(False, paused(rid, state.stop_reason), False, rid)
    if state.status != lc.Status.RUNNING:
        return Verdict(False, refused(state.stop_reason or state.status, state.stop_detail, rid), True, rid)
    return None


def _judge(engine: Any, config: Config, rid: str, state: Any, ev: HookEvent, args_hash: str,
           now: dt.datetime | None) -> Verdict | None:
    """The run's budgets (the SDK's guard, fed the store's counters) for this call: a refusal, or None."""
    budgets = bud.for_run(store.judged_by(engine, config).profile(state.agent), state.row())
    guard = Guard(budgets.to_json())
    same, recent = store.signatures(engine, rid, ev.tool, args_hash)
    guard.used["tool_calls"] = state.tool_calls
    guard.signatures[(ev.tool, args_hash)] = same
    guard.recent.extend(recent)
    started = state.started_at or utcnow()
    elapsed_s = max(0.0, ((now or utcnow()) - started).total_seconds())
    try:
        guard.before_tool(ev.tool, args_hash, elapsed_s)
    except RunKilled as stop:
        detail = stop.detail.replace("in-process guard", "agent-watchdog hook")
        if ap.pauses(budgets, stop.reason) and store.pause(engine, rid, reason=stop.reason, detail=detail):
            return Verdict(False, paused(rid, stop.reason), False, rid)  # held until resume: the session goes on
        store.end_stopped(engine, rid, reason=stop.reason, detail=detail)
        return Verdict(False, refused(stop.reason, detail, rid), True, rid)
    return None


def before_tool(engine: Any, config: Config, *, cli: str, agent: str, ev: HookEvent,
                now: dt.datetime | None = None) -> Verdict:
    """Whether the call may run; counted when it may. A sub-agent's call (the CLI names it:
    `agent_id`) is judged on its child run and on the session's run, and counted on both."""
    rid, state = _session(engine, cli, agent, ev.session_id or "no-session")
    args_hash = hash_args(ev.tool_input if ev.tool_input is not None else {}, tool=ev.tool)
    family = [(rid, state)]
    if ev.agent_id:
        if (no := _held(rid, state)) is not None:
            return no  # a stopped or paused session holds its sub-agents too
        family.insert(0, _subagent(engine, cli, agent, ev, rid))
    for run_id, st in family:
        no = _held(run_id, st) or _judge(engine, config, run_id, st, ev, args_hash, now)
        if no is not None:
            return no
    rid = family[0][0]
    parent_id = family[1][0] if len(family) > 1 else None
    call_id = f"hook:{cli}:{ev.call_id}" if ev.call_id else None
    if not store.count_call(engine, rid, tool=ev.tool, args_hash=args_hash, call_id=call_id, parent_id=parent_id):
        again = store.session_run(engine, rid)  # stopped between the read and the count
        reason = (again.stop_reason or again.status) if again else "gone"
        return Verdict(False, refused(reason, again.stop_detail if again else None, rid), True, rid)
    return Verdict(True, run_id=rid)


def _current(engine: Any, cli: str, key: str) -> tuple[str, Any] | None:
    """(run id, state) of the session's current run, never created (None before its first call)."""
    for gen in range(MAX_GENERATIONS):
        rid = run_id_for(cli, key, gen)
        state = store.session_run(engine, rid)
        if state is None:
            return None
        if state.source == lc.Source.HOOK and not _over(state):
            return rid, state
    return None


def _key(ev: HookEvent) -> str:
    sid = ev.session_id or "no-session"
    return f"{sid}\x00subagent\x00{ev.agent_id}" if ev.agent_id else sid


def after_tool(engine: Any, *, cli: str, ev: HookEvent) -> None:
    """A call that ran: its failure counts on the run and as an error of its tool, once per call
    (its success was counted before it ran: watchdog.store.hooks.count_failed)."""
    if not ev.failed:
        return
    found = _current(engine, cli, _key(ev))
    if found is not None:
        args_hash = hash_args(ev.tool_input if ev.tool_input is not None else {}, tool=ev.tool)
        store.count_failed(engine, found[0], tool=ev.tool, args_hash=args_hash,
                           call_id=f"hook:{cli}:{ev.call_id}" if ev.call_id else None, cli=cli)


def ended(engine: Any, *, cli: str, ev: HookEvent) -> Verdict:
    """After a batch of calls, or a turn (Claude Code's PostToolBatch, Stop): the session ends
    here when its run is stopped (not when paused: `resume` lets it go on), or a sub-agent's loop
    when its child run is — once the model has read a refusal (an earlier batch's, in the
    session's transcript), so that it, and whoever reads the transcript, knows why. Reads only:
    the session's run is never created here."""
    keys = [_key(ev)] + ([ev.session_id or "no-session"] if ev.agent_id else [])
    for key in keys:
        found = _current(engine, cli, key)
        if found is not None:
            no = _held(*found)
            if no is not None and no.end_session:
                return no if ev.event != "PostToolBatch" or told(ev.transcript, ev.batch) else Verdict(True)
    return Verdict(True)


TRANSCRIPT_TAIL_BYTES = 4 << 20  # the end of the transcript is where the last refusals are


def _tail(path: str) -> bytes | None:
    """The last TRANSCRIPT_TAIL_BYTES of a regular file; None for anything else or an error
    (O_NONBLOCK: a FIFO named there never holds the hook)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        os.lseek(fd, max(0, st.st_size - TRANSCRIPT_TAIL_BYTES), os.SEEK_SET)
        return os.read(fd, TRANSCRIPT_TAIL_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


def told(transcript: str | None, batch: tuple[str, ...]) -> bool:
    """Whether the session's transcript (Claude Code's JSONL) has a refusal of a stopped run as
    the result of a call outside this batch: the model read it in its last request. A transcript
    that cannot be read counts as told (the session ends now rather than go on)."""
    tail = _tail(transcript) if transcript else None
    if tail is None:
        return True
    mark = PREFIX.encode()
    for line in tail.splitlines():
        if mark in line and b'"tool_result"' in line and _refused_before(line, batch):
            return True
    return False


def _refused_before(line: bytes, batch: tuple[str, ...]) -> bool:
    """The transcript line is a stop's refusal as the result of a call outside `batch`."""
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return False
    message = entry.get("message") if isinstance(entry, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return any(isinstance(block, dict) and block.get("type") == "tool_result"
               and block.get("tool_use_id") not in batch and _a_stop(block.get("content"))
               for block in (content if isinstance(content, list) else []))


def _a_stop(content: Any) -> bool:
    if isinstance(content, list):  # [{"type": "text", "text": ...}]
        content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return isinstance(content, str) and content.startswith(f"{PREFIX} run ") and " stopped: " in content[:300]


def decide(engine: Any, config: Config, *, cli: str, agent: str, ev: HookEvent) -> Verdict:
    if ev.phase == PRE:
        return before_tool(engine, config, cli=cli, agent=agent, ev=ev)
    if ev.phase == POST:
        after_tool(engine, cli=cli, ev=ev)
        return Verdict(True)
    return ended(engine, cli=cli, ev=ev)
