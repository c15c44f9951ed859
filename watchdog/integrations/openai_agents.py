"""OpenAI Agents SDK: run hooks that record a run's model calls and tool calls, and stop it.

    from agents import Agent, Runner, function_tool
    from watchdog import Watchdog
    from watchdog.integrations.openai_agents import failure_error_function, hooks

    @function_tool(failure_error_function=failure_error_function)   # records tool errors
    def verify_iban(iban: str) -> str: ...

    wd = Watchdog("sqlite:///runs.db")
    result = await Runner.run(agent, "refund order 42", hooks=hooks(wd, agent="support-bot"))

Every model response is a step (model name, `response.usage` tokens), every local
tool call a tool call (arguments hashed). The SDK turns a tool's exception into a
string for the model and has no error hook: tools declared with this module's
`failure_error_function` get their failures recorded as failed calls.

Stops are real: `RunKilled` is a BaseException and the SDK's runner only converts
`Exception`s, so a stop raised in a hook — the daemon asked (seen on the run's next
write), or an in-process guard refuses the next model call (`on_llm_start`) or tool
call (`on_tool_start`, before the tool runs) — propagates out of `Runner.run` /
`Runner.run_sync` / the `run_streamed` result's `stream_events()`.

The hooks open the watchdog run at the first event and end it when the agent
produces its final output, or as killed when they raise a stop. Failures the hooks
cannot see (a model API error, MaxTurnsExceeded) are seen when you use the hooks as
a context manager (`with hooks(...) as h: Runner.run(..., hooks=h)`), or when they
join a run you opened yourself: `WatchdogRunHooks(run=run)` inside `with wd.run(...)`.

Nested agents are child runs (`run.child`: own budgets, never above what the parent has
left; spend rolled up into the parent):

- a **handoff** (the SDK calls `on_handoff` and then reports the new agent on every
  event): the agent handed to records on a child run of the hooks' run, named after it,
  ended when it hands off again or the run ends. A stop of that child ends the whole
  `Runner.run` (RunKilled is not an exception the runner can continue past), and the
  parent run is recorded as killed with it.
- an **agent as a tool** (`agent.as_tool(..., hooks=...)` runs a nested `Runner.run`
  with the hooks it is given, not the outer run's): give it `h.child(agent="researcher",
  max_steps=5)`; its run is a child of `h`'s, ended at the nested run's final output.
  The SDK reports no link between the two runs, so without those hooks the nested agent
  is not recorded at all.

Extra `openai-agents` (openai-agents >= 0.24): `pip install '.[openai-agents]'` from a checkout, or
`pip install 'agent-watchdog-daemon[openai-agents]'`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

try:
    from agents import RunHooks
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "watchdog.integrations.openai_agents needs the OpenAI Agents SDK (the `openai-agents` extra): "
        "pip install '.[openai-agents]' from a checkout of agent-watchdog, "
        "or pip install 'agent-watchdog-daemon[openai-agents]'"
    ) from exc

from watchdog.errors import RunKilled
from watchdog.integrations._common import PendingTool, RunBinding, after_tool, before_tool, tool_args

log = logging.getLogger("watchdog.integrations.openai_agents")

__all__ = ["WatchdogRunHooks", "hooks", "failure_error_function", "make_failure_error_function"]

_ERROR_ATTR = "_agent_watchdog_tool_error"
_UNKNOWN_ARGS = itertools.count(1)


def hooks(wd, agent: str, **run_kwargs) -> "WatchdogRunHooks":
    """`Runner.run(..., hooks=hooks(wd, agent="support-bot"))`: hooks that open their own run.

    `run_kwargs` are those of `Watchdog.run()` (kill_mode, labels, guards, max_steps, ...)
    and the hooks' own `estimated_cost_eur` and `model`.
    """
    return WatchdogRunHooks(wd, agent=agent, **run_kwargs)


def make_failure_error_function(
        formatter: Callable[[Any, Exception], str] | None = None) -> Callable[[Any, Exception], str]:
    """A `failure_error_function` for `@function_tool` that marks the call failed for the hooks.

    `formatter(ctx, error) -> str` writes the message the model reads; by default the
    SDK's own `default_tool_error_function` (which does not show the exception).
    """
    if formatter is None:
        from agents.tool import default_tool_error_function

        formatter = default_tool_error_function
    message = formatter

    def failure_error_function(ctx: Any, error: Exception) -> str:
        # The SDK hands the same ToolContext to on_tool_start, here and on_tool_end.
        try:
            setattr(ctx, _ERROR_ATTR, error)
        except Exception:  # noqa: BLE001 - a context we cannot annotate: the call is then recorded as ok
            log.debug("agent-watchdog: cannot mark tool error on %r", ctx)
        return message(ctx, error)

    return failure_error_function


failure_error_function = make_failure_error_function()


class WatchdogRunHooks(RunBinding, RunHooks):
    """Records model responses and tool calls on a watchdog run; raises RunKilled to stop it.

    Either give `wd` and `agent` (plus any `Watchdog.run()` keyword): the hooks open the
    run at the first event and end it at the final output (or, used as a context
    manager, when the `with` block ends, which also sees failures). Hooks reused for a
    later `Runner.run` open a new run; `.run` is the current (or last) one.

    Or give `run=` an already started Run: the hooks record on it and leave ending it
    to its owner. Use that for nested runs (`agent.as_tool(..., hooks=WatchdogRunHooks(run=h.run))`):
    hooks that own a run end it at the first final output they see.

    `estimated_cost_eur`: what one model call is expected to cost, for the money
    guard's pre-check before each call. `model`: the model name to record (and price)
    when `RunConfig(model=...)` overrides the agents' own; by default the agent's
    model name (or the SDK's default model).
    """

    def __init__(self, wd=None, *, agent: str | None = None, run=None, estimated_cost_eur: float = 0.0,
                 model: str | None = None, parent: "WatchdogRunHooks | None" = None, **run_kwargs):
        self._bind(wd, agent, run, estimated_cost_eur, run_kwargs, parent=parent)
        self._model = model
        self._tools: dict[Any, list[tuple[Any, PendingTool]]] = {}
        self._root_agent: int | None = None  # id() of the agent the run started with
        self._delegates: dict[int, Any] = {}  # id(agent handed off to) -> its child run

    def child(self, agent: str, **budgets) -> "WatchdogRunHooks":
        """Hooks for a nested agent run as a tool (`agent.as_tool(..., hooks=h.child(agent="researcher"))`):
        it records on a child run of this hooks' run, with `budgets` (never above what is left)."""
        return WatchdogRunHooks(agent=agent, parent=self, estimated_cost_eur=self._estimated, model=self._model,
                                **budgets)

    def _forget(self) -> None:
        delegates, self._delegates = list(self._delegates.values()), {}
        self._root_agent = None
        for child in delegates:  # a handoff's child run ends with its parent's
            _end_child(child)

    def _run_for(self, agent):
        """The run an agent's events are recorded on: its handoff child run, else the hooks' run."""
        run = self._open()
        if self._root_agent is None:
            self._root_agent = id(agent)
        return self._delegates.get(id(agent), run)

    async def on_handoff(self, context, from_agent, to_agent) -> None:
        self._obey(self._handoff, from_agent, to_agent)

    def _handoff(self, from_agent, to_agent):
        run = self._open()
        if self._root_agent is None:
            self._root_agent = id(from_agent)
        with self._lock:
            left = self._delegates.pop(id(from_agent), None)
        if left is not None:
            _end_child(left)
        if id(to_agent) == self._root_agent or id(to_agent) in self._delegates:
            return  # back to the agent the run started with: it records on the run itself
        child = run.child(_agent_name(to_agent)).start()
        with self._lock:
            self._delegates[id(to_agent)] = child

    # -- the run's lifecycle (open / end / with: RunBinding) ------------------------

    async def __aenter__(self) -> "WatchdogRunHooks":
        return self.__enter__()

    async def __aexit__(self, exc_type, exc, tb):
        return self.__exit__(exc_type, exc, tb)

    def _obey(self, fn, *args, **kwargs):
        """Run a recording step. Only stops reach the agent (ending our run as killed at once);
        any other failure of ours is logged, never raised into the agent."""
        try:
            return fn(*args, **kwargs)
        except RunKilled as stop:
            if not self._managed:
                self.end(stop)
            raise
        except Exception:  # noqa: BLE001
            log.warning("agent-watchdog: could not record an Agents SDK event on run %s", getattr(self.run, "id", None),
                        exc_info=True)
            return None

    # -- hooks ----------------------------------------------------------------------------

    async def on_agent_start(self, context, agent) -> None:
        self._obey(self._open)

    async def on_agent_end(self, context, agent, output) -> None:
        if not self._managed:
            self.end(None)

    async def on_llm_start(self, context, agent, system_prompt, input_items) -> None:
        # Pre-flight: stop requested, wall clock, max_steps, money: refuse the call before it is made.
        self._obey(lambda: self._run_for(agent).check_budget(self._estimated))

    async def on_llm_end(self, context, agent, response) -> None:
        self._obey(self._after_model, agent, response)

    def _after_model(self, agent, response):
        usage = getattr(response, "usage", None)
        tokens_in, tokens_out = _int(getattr(usage, "input_tokens", 0)), _int(getattr(usage, "output_tokens", 0))
        # The Responses API's details: cached input tokens and reasoning tokens (parts of the totals).
        cached = _int(getattr(getattr(usage, "input_tokens_details", None), "cached_tokens", 0))
        reasoning = _int(getattr(getattr(usage, "output_tokens_details", None), "reasoning_tokens", 0))
        self._run_for(agent).step(model=self._model or _model_name(agent), tokens_in=tokens_in, tokens_out=tokens_out,
                      cached_tokens_in=min(cached, tokens_in), reasoning_tokens=min(reasoning, tokens_out))

    async def on_tool_start(self, context, agent, tool) -> None:
        self._obey(self._before_tool, context, agent, tool)

    def _before_tool(self, context, agent, tool):
        run = self._run_for(agent)
        name = getattr(context, "tool_name", None) or getattr(tool, "name", None) or type(tool).__name__
        raw = getattr(context, "tool_arguments", None)
        # Local tools other than function tools (shell, computer, ...) show no arguments to hooks:
        # give each call its own, so that unknown arguments never count as identical calls.
        args = tool_args(raw) if raw is not None else {"unknown_args_call": next(_UNKNOWN_ARGS)}
        # Before the tool runs: a refusal raised here means the tool never runs.
        pending = before_tool(run, name, args, circuits=False)
        with self._lock:
            self._tools.setdefault(_call_key(context, tool), []).append((run, pending))

    async def on_tool_end(self, context, agent, tool, result) -> None:
        with self._lock:
            queue = self._tools.get(_call_key(context, tool))
            entry = queue.pop(0) if queue else None
            if queue == []:
                del self._tools[_call_key(context, tool)]
        if entry is None:
            return
        run, pending = entry
        error = getattr(context, _ERROR_ATTR, None)
        if error is not None:
            try:
                delattr(context, _ERROR_ATTR)
            except AttributeError:
                pass
        self._obey(after_tool, run, pending, ok=error is None, error=error)


def _end_child(child) -> None:
    try:
        child.__exit__(None, None, None)  # completed, or killed if it saw a stop
    except Exception:  # noqa: BLE001 - ending must never replace the agent's own outcome
        log.exception("agent-watchdog: could not end child run %s", child.id)


def _agent_name(agent) -> str:
    name = getattr(agent, "name", None)
    return name[:128] if isinstance(name, str) and name.strip() else type(agent).__name__[:128]


def _call_key(context, tool):
    # Function tools get their own ToolContext with a call id; other local tools share the run's context.
    call_id = getattr(context, "tool_call_id", None)
    return call_id if isinstance(call_id, str) and call_id else ("tool", getattr(tool, "name", None), id(context))


def _model_name(agent) -> str | None:
    model = getattr(agent, "model", None)
    if isinstance(model, str) and model:
        return model
    if model is None:
        try:
            from agents.models import get_default_model

            return get_default_model()
        except Exception:  # noqa: BLE001 - an older SDK: no name is better than no record
            return None
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else type(model).__name__


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
