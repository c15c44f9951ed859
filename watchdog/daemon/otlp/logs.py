"""`POST /v1/logs`: the coding CLIs' OpenTelemetry log events as steps and tool calls of their
session's run (the same run `agent-watchdog hook` records, watchdog.core.sessions).

Mapped (names as Claude Code 2.1.197 exports them, recorded in tests/clis/recorded/):
- `claude_code.api_request` (`session.id`, `model`, `input_tokens`, `output_tokens`,
  `cache_read_tokens`, `cost_usd`): a step, priced from its model like any step (unpriced until
  the tick's backfill prices it); for a model no price table knows, its `cost_usd` claim is its
  cost (watchdog.daemon.otlp.logruns.claimed: a claim only ever raises its own run's cost). Codex 0.171 (name in `event.name`, no body; keyed by `conversation.id`)
  puts a turn's tokens on `codex.sse_event` with `event.kind = response.completed`
  (`input_token_count`, `output_token_count`), not on `codex.api_request`: that one is the step.
  `gemini_cli.api_response` is mapped like Claude Code's, unchecked against the real CLI;
- `claude_code.tool_result` (`tool_name`, `tool_use_id`, `success`), `codex.tool_result`
  (`call_id`, its model-side tool name `exec_command`), `gemini_cli.tool_call`: a tool call,
  with call id `hook:<cli>:<tool use id>` — the id the hook gave the same call, so a call both
  saw counts once (the hook's tool name stands: Codex's hooks call it `Bash`). On a hook's run
  the tool calls are the hook's alone (watchdog.daemon.otlp.logruns: Gemini CLI's hook names no
  call id, and a sub-agent's calls are its child run's).
Other events (prompts, decisions) are progress only. Which run a session's events count for,
and who may make them count, is watchdog.daemon.otlp.logruns (the traces' rules, and the hook's run).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from watchdog.core import lifecycle as lc
from watchdog.core.sessions import EVENT_PREFIXES
from watchdog.daemon.otlp.decode import BadRequest, _get, _j_attrs, _j_value, _list, _pb_attrs, _pb_value
from watchdog.daemon.otlp.mapping import Call

PATH = "/v1/logs"
_STEP_EVENTS = {"api_request", "api_response"}
_TOOL_EVENTS = {"tool_result", "tool_call"}


@dataclass
class Session:
    cli: str
    session_id: str
    agent: str
    calls: list[Call] = field(default_factory=list)
    records: int = 0


def decode_logs(body: bytes, kind: str, max_records: int) -> tuple[list[tuple[dict[str, Any], str, dict[str, Any]]], int]:
    """[(resource attributes, event name, attributes)] of an ExportLogsServiceRequest, and how
    many records were dropped past `max_records`."""
    out: list[tuple[dict[str, Any], str, dict[str, Any]]] = []
    dropped = 0
    if kind.endswith("json"):
        try:
            req = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise BadRequest("not valid JSON") from None
        if not isinstance(req, dict):
            raise BadRequest("expected a JSON object (ExportLogsServiceRequest)")
        for rl in _list(_get(req, "resourceLogs", "resource_logs")):
            resource = rl.get("resource") if isinstance(rl, dict) else None
            res = _j_attrs(resource.get("attributes")) if isinstance(resource, dict) else {}
            for sl in _list(_get(rl, "scopeLogs", "scope_logs") if isinstance(rl, dict) else None):
                for r in _list(_get(sl, "logRecords", "log_records") if isinstance(sl, dict) else None):
                    if not isinstance(r, dict):
                        continue
                    if len(out) >= max_records:
                        dropped += 1
                        continue
                    attrs = _j_attrs(r.get("attributes"))
                    out.append((res, _name(_j_value(r.get("body")), attrs), attrs))
        return out, dropped
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    pb = ExportLogsServiceRequest()
    try:
        pb.ParseFromString(body)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise BadRequest(f"not an ExportLogsServiceRequest in protobuf ({type(exc).__name__})") from None
    for prl in pb.resource_logs:
        res = _pb_attrs(prl.resource.attributes)
        for psl in prl.scope_logs:
            for pr in psl.log_records:
                if len(out) >= max_records:
                    dropped += 1
                    continue
                attrs = _pb_attrs(pr.attributes)
                out.append((res, _name(_pb_value(pr.body), attrs), attrs))
    return out, dropped


def _name(body: object, attrs: dict[str, Any]) -> str:
    """`claude_code.tool_result` from the body, else from event.name (which lacks the prefix)."""
    if isinstance(body, str) and any(body.startswith(p) for p in EVENT_PREFIXES):
        return body[:128]
    return str(attrs.get("event.name") or "")[:128]


def _int(v: object) -> int | None:
    if not isinstance(v, (str, bytes, int, float)):  # a decoded value: nothing else is a number
        return None
    try:
        n = int(float(v))
    except (TypeError, ValueError, OverflowError):  # "inf", "1e400": no number of tokens
        return None
    return n if 0 <= n < 1 << 40 else None


MAX_CLAIM_USD = 1_000_000.0  # one step's claimed cost, at most (a claim past it counts as this much)


def usd(v: object) -> float | None:
    """A claimed cost in USD: a finite number >= 0 (text that reads as one too), at most
    MAX_CLAIM_USD; None for anything else (negative, NaN, a bool, an object)."""
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        return None
    try:
        n = float(v[:64] if isinstance(v, str) else v)
    except (ValueError, OverflowError):
        return None
    if not math.isfinite(n) or n < 0:
        return None
    return min(n, MAX_CLAIM_USD)


def sessions(records: list[tuple[dict[str, Any], str, dict[str, Any]]]) -> list[Session]:
    """The records grouped by (CLI, session), as witnessed calls (pure)."""
    by: dict[tuple[str, str], Session] = {}
    for res, name, attrs in records:
        cli = next((c for p, c in EVENT_PREFIXES.items() if name.startswith(p)), None)
        if cli is None:
            continue
        sid = attrs.get("session.id") or attrs.get("conversation.id") or res.get("session.id")
        if not isinstance(sid, str) or not sid:
            continue
        # The agent `hook install --otlp` names in the resource (the hook's --agent), else the CLI's.
        agent = res.get("agent_watchdog.agent") or res.get("gen_ai.agent.name") or cli
        s = by.setdefault((cli, sid[:200]), Session(cli, sid[:200], str(agent)[:128]))
        s.records += 1
        event = name.split(".", 1)[1]
        if event == "sse_event" and attrs.get("event.kind") != "response.completed":
            continue  # Codex's stream events: only a completed response carries the turn's tokens
        if event in _STEP_EVENTS or event == "sse_event":
            tin = _int(attrs.get("input_tokens", attrs.get("input_token_count")))
            tout = _int(attrs.get("output_tokens", attrs.get("output_token_count")))
            if tin is None and tout is None:
                continue  # an API request event without tokens (Codex's carry them on sse events)
            s.calls.append(Call(kind=lc.EventKind.STEP, span_id="", end_ns=0, duration_s=None,
                                model=str(attrs.get("model") or "")[:128] or None, tokens_in=tin or 0,
                                tokens_out=tout or 0,
                                cached_tokens_in=_int(attrs.get("cache_read_tokens", attrs.get("cached_token_count"))),
                                claimed_cost_usd=usd(attrs.get("cost_usd"))))
        elif event in _TOOL_EVENTS:
            use_id = attrs.get("tool_use_id") or attrs.get("call_id") or attrs.get("function_call_id")
            ok = str(attrs.get("success", "true")).lower() not in ("false", "0")
            s.calls.append(Call(
                kind=lc.EventKind.TOOL, span_id="", end_ns=0, duration_s=None,
                tool=str(attrs.get("tool_name") or attrs.get("function_name") or "?")[:200], ok=ok, error_class=None if ok else "ToolError",
                call_id=f"hook:{cli}:{str(use_id)[:100]}" if use_id else None))
    return list(by.values())
