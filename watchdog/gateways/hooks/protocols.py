"""Each coding CLI's hook protocol: what its event's JSON says, and how a refusal is answered.

Checked against the CLIs the tests run (tests/clis/package-lock.json) and their hook docs:

- Claude Code (docs.anthropic.com/en/docs/claude-code/hooks): events PreToolUse, PostToolUse,
  PostToolUseFailure; stdin `session_id`, `hook_event_name`, `tool_name`, `tool_input`,
  `tool_use_id`, `tool_response`, and for a sub-agent's call `agent_id` (+ `agent_type`; the
  `session_id` is the main session's: read in the 2.1.197 binary, its hook input builder). A
  refusal is exit 0 with JSON on stdout:
  `hookSpecificOutput.permissionDecision = "deny"` + `permissionDecisionReason` (the model reads
  it), and `continue: false` + `stopReason` is to end the session — but Claude Code 2.1.197
  ignores `continue` on a PreToolUse answer that denies, and `continue: false` without the deny
  lets the call run first (checked with the real CLI: the marker is made, then the session
  ends); no hook fires for a call a hook denied (PermissionDenied, PostToolUseFailure do not).
  What ends the session is the `PostToolBatch` hook (read in the 2.1.197 binary: it fires once
  after every batch of tool calls, a refused one included, before the next model request, and
  its `continue: false` ends the agentic loop, `terminal_reason: "hook_stopped"`): the hook
  answers it (and `Stop`) with `continue: false` + `stopReason` once the session's run is
  stopped and the model has read one refusal (watchdog.gateways.hooks.core.ended).
- Codex CLI (developers.openai.com/codex/hooks; the JSON schemas `pre-tool-use.command.input|output`
  inside the 0.171 binary): `[[hooks.PreToolUse]]` / `[[hooks.PostToolUse]]` in config.toml, the
  same stdin fields (`tool_use_id`, `turn_id`, `agent_id` for a sub-agent) and the same deny JSON.
  Unlike Claude Code, its PreToolUse rejects `continue` / `stopReason` (the hook counts as failed
  and the call runs), so a refusal there never carries them; its PostToolUse takes them (the
  schema `post-tool-use.command.output`), but no hook fires after a refused call, so the hook
  never ends a Codex session (the model reads every refusal). Its PostToolUse `tool_response` is the command's output alone (no exit status). Hooks run only once trusted (`/hooks`
  in the TUI) or with `codex exec --dangerously-bypass-hook-trust`.
- Gemini CLI (geminicli.com/docs/hooks/reference): events BeforeTool, AfterTool in settings.json;
  stdin `session_id`, `hook_event_name`, `tool_name`, `tool_input`, `tool_response`; a refusal is
  `decision: "deny"` + `reason`, and `continue: false` + `stopReason` stops the agent loop
  (also on AfterTool). A shell call's `tool_response` is `{llmContent, returnDisplay}` with
  `Exit Code: N` in llmContent, and no error field for a command that exited non-zero.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

PRE, POST, END, OTHER = "pre", "post", "end", "other"
CLIS = ("claude-code", "codex", "gemini")

_PRE_EVENTS = {"PreToolUse", "BeforeTool"}
_POST_EVENTS = {"PostToolUse", "AfterTool"}
_FAILED_EVENTS = {"PostToolUseFailure"}
_END_EVENTS = {"PostToolBatch", "Stop"}  # the session ends here when its run is stopped (Claude Code)


@dataclass(frozen=True)
class HookEvent:
    """One hook call as the CLI described it (a claim: it names the session, never who we are)."""

    phase: str  # PRE | POST | END | OTHER
    event: str
    session_id: str
    tool: str
    tool_input: Any
    call_id: str | None
    failed: bool  # POST: the tool reported an error
    agent_id: str | None = None  # a sub-agent's call: which one (Claude Code 2.1.197, Codex 0.171)
    agent_type: str | None = None  # its kind (Claude Code's subagent_type, e.g. "Explore")
    transcript: str | None = None  # Claude Code's transcript_path (PostToolBatch: was the model told?)
    batch: tuple[str, ...] = ()  # PostToolBatch: the tool_use_ids of the batch's calls


def parse(raw: str) -> HookEvent:
    """The event on stdin; ValueError if it is not a JSON object."""
    try:
        data = json.loads(raw or "{}")
    except RecursionError:  # nested past the interpreter's stack: unreadable, never a crash
        raise ValueError("the hook's input is nested too deep") from None
    if not isinstance(data, dict):
        raise ValueError("the hook's input is not a JSON object")
    name = str(data.get("hook_event_name") or "")
    phase = (PRE if name in _PRE_EVENTS else POST if name in _POST_EVENTS | _FAILED_EVENTS
             else END if name in _END_EVENTS else OTHER)
    call_id = data.get("tool_use_id") or data.get("tool_call_id") or data.get("call_id")
    return HookEvent(phase=phase, event=name, session_id=_utf8(str(data.get("session_id") or "")[:200]),
                     tool=_utf8(str(data.get("tool_name") or "?")[:200]), tool_input=data.get("tool_input"),
                     call_id=_utf8(str(call_id)[:100]) if call_id else None,
                     failed=name in _FAILED_EVENTS or _failed(data.get("tool_response")),
                     agent_id=_text(data.get("agent_id")), agent_type=_text(data.get("agent_type")),
                     transcript=_path(data.get("transcript_path")), batch=_batch(data.get("tool_calls")))


def _path(v: Any) -> str | None:
    return v if isinstance(v, str) and v.startswith("/") and len(v) < 4096 and "\x00" not in v else None


def _batch(calls: Any) -> tuple[str, ...]:
    if not isinstance(calls, list):
        return ()
    return tuple(str(c["tool_use_id"])[:100] for c in calls[:1000] if isinstance(c, dict) and c.get("tool_use_id"))


def _utf8(s: str) -> str:
    """`s` as every store can keep it: JSON's lone surrogates (`"\\ud800"`, no UTF-8) and NUL (no
    PostgreSQL text) become U+FFFD, so a session id, tool name or call id no store takes never
    makes the hook fail open on every call of its session."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return s.replace("\x00", "\ufffd")


def _text(v: Any) -> str | None:
    return _utf8(str(v)[:100]) if isinstance(v, str) and v else None


def _failed(response: Any) -> bool:
    """Whether a tool's response says it failed (the CLIs differ: is_error, error, success)."""
    if not isinstance(response, dict):
        return False
    if response.get("is_error") is True or response.get("success") is False:
        return True
    err = response.get("error")
    if bool(err) and err is not None:
        return True
    shown = response.get("llmContent")  # Gemini CLI's shell tool: "Output: ...\nExit Code: 1\n..."
    if isinstance(shown, str):
        codes = _EXIT_CODE.findall(shown[-4096:])  # its own line comes after the command's output
        return bool(codes) and codes[-1] != "0"
    return False


_EXIT_CODE = re.compile(r"^Exit Code: (-?\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Answer:
    stdout: str
    stderr: str
    exit_code: int


def allow() -> Answer:
    return Answer("", "", 0)


def deny(cli: str, event: str, reason: str, *, end_session: bool) -> Answer:
    """A refused call in `cli`'s protocol: the model reads `reason`; `end_session` ends the session
    where the CLI can (continue: false)."""
    if cli == "gemini":
        out: dict[str, Any] = {"decision": "deny", "reason": reason}
    else:
        out = {"hookSpecificOutput": {"hookEventName": event or "PreToolUse", "permissionDecision": "deny",
                                      "permissionDecisionReason": reason}}
    # Codex 0.171 fails (and so lets through) a PreToolUse answer carrying continue or stopReason
    # ("PreToolUse hook returned unsupported continue:false"): it gets the refusal alone.
    if end_session and cli != "codex":
        out.update({"continue": False, "stopReason": reason})
    return Answer(json.dumps(out), "", 0)


def end(reason: str) -> Answer:
    """The session ends here (an event after a call: PostToolUse, AfterTool, PostToolBatch, Stop):
    every CLI's `continue: false` + `stopReason`."""
    return Answer(json.dumps({"continue": False, "stopReason": reason}), "", 0)
