"""Spans → runs, steps and tool calls, as DESIGN.md ("OTLP/HTTP receiver") says. Pure: no store, no OS.

- The run: the resource attribute `agent_watchdog.run_id` (exec's run), else the span's (or the
  resource's) `gen_ai.conversation.id` / `session.id`, else the trace.
- The agent: `gen_ai.agent.name`, else the resource's `service.name`.
- A step: a `chat` / `text_completion` / `generate_content` span (OpenInference: kind LLM),
  with its tokens (`gen_ai.usage.input_tokens|output_tokens`, the older
  `prompt_tokens|completion_tokens`, or OpenInference's `llm.token_count.*`) and model.
- A tool call: an `execute_tool` span (OpenInference: kind TOOL), named by `gen_ai.tool.name` /
  `tool.name`, its arguments hashed as the SDK hashes them, failed when the span's status is
  ERROR; `gen_ai.tool.call.id` is the call id the witnesses share (one call, one count).
- The run ends when its root agent span (`invoke_agent` without a parent) ends.
Every other span is progress only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from watchdog.core.lifecycle import error_fields, hash_args
from watchdog.core.text import one_line
from watchdog.daemon.otlp.decode import ResourceSpans, Span

RUN_ID_ATTR = "agent_watchdog.run_id"
STEP_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
TOOL_OPERATION = "execute_tool"
AGENT_OPERATION = "invoke_agent"
DEFAULT_AGENT = "otlp"
NAME_MAX = 128  # runs.agent, events.tool, events.model
CALL_ID_MAX = 128  # events.call_id


@dataclass(slots=True)
class Call:
    """One step or tool call, from one span."""

    kind: str  # "step" | "tool"
    span_id: str
    end_ns: int
    duration_s: float | None
    tool: str | None = None
    args_hash: str | None = None
    ok: bool | None = None
    error_class: str | None = None
    error_msg: str | None = None
    model: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cached_tokens_in: int | None = None
    call_id: str | None = None
    claimed_cost_usd: float | None = None  # a step's cost as its sender says (Claude Code's cost_usd)
    cost_eur: float | None = None  # a step's cost written with it (a claim, for a model no table prices)


@dataclass
class Group:
    """What one request says about one run key."""

    key: tuple[str, str]  # ("run", exec's id) | ("conversation", id) | ("trace", hex id)
    agent: str
    claimed_pid: int | None
    trace_ids: set[str] = field(default_factory=set)
    calls: list[Call] = field(default_factory=list)
    spans: int = 0
    root_ended: bool = False
    last_end_ns: int = 0
    genai: bool = False  # any GenAI span (step, tool, agent): only such groups start a run
    labels: dict[str, str] = field(default_factory=dict)  # more labels for the run it starts (logs: the CLI)


def _text(v: object) -> str | None:
    if v is None or isinstance(v, (dict, list)):
        return None
    s = str(v).strip()
    return s or None


def _count(attrs: Mapping[str, object], *names: str) -> int | None:
    for n in names:
        v = attrs.get(n)
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)) and 0 <= v < 2**31:
            return int(v)
        if isinstance(v, str) and v.isdigit() and len(v) < 10:
            return int(v)
    return None


def _first(attrs: Mapping[str, object], *names: str) -> str | None:
    for n in names:
        t = _text(attrs.get(n))
        if t is not None:
            return t
    return None


def operation(span: Span) -> str | None:
    """The span's GenAI operation, from gen_ai.operation.name or OpenInference's span kind."""
    op = _text(span.attrs.get("gen_ai.operation.name"))
    if op:
        return op.lower()
    kind = (_text(span.attrs.get("openinference.span.kind")) or "").upper()
    return {"LLM": "chat", "TOOL": TOOL_OPERATION, "AGENT": AGENT_OPERATION}.get(kind)


def args_hash(raw: object) -> str | None:
    """The hash the SDK would give the same arguments: JSON text is parsed and hashed canonically."""
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            return hash_args(json.loads(raw))
        except (ValueError, RecursionError):
            return hash_args(raw)  # not JSON (or JSON with NaN): the text itself
    try:
        return hash_args(raw)
    except ValueError:
        return hash_args(str(raw))


def to_call(span: Span, op: str | None = None) -> Call | None:
    op = operation(span) if op is None else op
    a = span.attrs
    duration = (span.end_ns - span.start_ns) / 1e9 if span.end_ns >= span.start_ns > 0 else None
    if op in STEP_OPERATIONS:
        return Call("step", span.span_id, span.end_ns, duration,
                    model=_bounded(_first(a, "gen_ai.response.model", "gen_ai.request.model", "llm.model_name")),
                    tokens_in=_count(a, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens",
                                     "llm.token_count.prompt"),
                    tokens_out=_count(a, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
                                      "llm.token_count.completion"),
                    cached_tokens_in=_count(a, "gen_ai.usage.cache_read.input_tokens",
                                            "llm.token_count.prompt_details.cache_read"))
    if op == TOOL_OPERATION:
        name = _first(a, "gen_ai.tool.name", "tool.name")
        if name is None:
            name = span.name[len("execute_tool "):] if span.name.startswith("execute_tool ") else span.name
        err_class, err_msg = (None, None)
        if span.error:
            err_class, err_msg = error_fields(span.status_message or "span status ERROR")
            err_class = _bounded(_first(a, "error.type")) or "SpanError"
        call_id = _first(a, "gen_ai.tool.call.id")
        return Call("tool", span.span_id, span.end_ns, duration, tool=_bounded(name) or "unknown",
                    args_hash=args_hash(a.get("gen_ai.tool.call.arguments", a.get("input.value"))),
                    ok=not span.error, error_class=err_class, error_msg=err_msg,
                    call_id=call_id[:CALL_ID_MAX] if call_id else None)
    return None


def _bounded(name: str | None) -> str | None:
    if not name:
        return None
    if len(name) <= NAME_MAX and name.isprintable():  # the usual case: no regex
        return name
    return one_line(name, NAME_MAX)


def _pid(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, str) and v.isdigit() and len(v) < 10:
        v = int(v)
    return v if isinstance(v, int) and 0 < v < 2**31 else None


def groups(resources: Iterable[ResourceSpans]) -> list[Group]:
    """The request's spans grouped by run key, in the order the keys first appear."""
    out: dict[tuple[str, str], Group] = {}
    for rs in resources:
        res = rs.resource
        service = _bounded(_text(res.get("service.name")))
        claimed = _pid(res.get("process.pid"))
        run_id = _text(res.get(RUN_ID_ATTR))
        res_conv = _first(res, "gen_ai.conversation.id", "session.id")
        # A conversation named on any span of a trace names the whole trace in this request.
        conv_of_trace: dict[str, str] = {}
        for s in rs.spans:
            c = _first(s.attrs, "gen_ai.conversation.id", "session.id")
            if c and s.trace_id not in conv_of_trace:
                conv_of_trace[s.trace_id] = c
        for s in rs.spans:
            if run_id:
                key = ("run", run_id[:64])
            elif (c := conv_of_trace.get(s.trace_id) or res_conv):
                key = ("conversation", c[:256])
            else:
                key = ("trace", s.trace_id or s.span_id)
            g = out.get(key)
            if g is None:
                g = out[key] = Group(key, service or DEFAULT_AGENT, claimed)
            named = _bounded(_first(s.attrs, "gen_ai.agent.name"))
            if named:
                g.agent = named
            if s.trace_id:
                g.trace_ids.add(s.trace_id)
            g.spans += 1
            g.last_end_ns = max(g.last_end_ns, s.end_ns)
            op = operation(s)
            if op is None:
                continue
            g.genai = True
            call = to_call(s, op)
            if call is not None:
                g.calls.append(call)
            elif op == AGENT_OPERATION and not s.parent_id:
                g.root_ended = True
    return list(out.values())
