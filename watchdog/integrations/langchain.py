"""LangChain: a callback handler that records a run's model calls and tool calls, and stops it.

    from watchdog import Watchdog
    from watchdog.integrations.langchain import handler

    wd = Watchdog("sqlite:///runs.db")
    agent.invoke(question, config={"callbacks": [handler(wd, agent="support-bot")]})

Every chat-model / LLM call is a step (model name, `usage_metadata` tokens), every
tool call a tool call (arguments hashed). The handler opens the watchdog run at the
first event and ends it — completed, failed or killed — when the outermost chain
ends; it can also join a run you opened yourself (`WatchdogCallbackHandler(run=run)`),
which it then never ends.

Stops are real: the handler sets `raise_error = True` and `RunKilled` is a
BaseException, so a stop raised in a callback — the daemon asked (seen on the run's
next write), or an in-process guard refuses the next model or tool call before it
runs — propagates out of `invoke()` / `ainvoke()` / `stream()`. LangChain's callback
manager only catches `Exception` around handlers (see
`langchain_core.callbacks.manager.handle_event`), and its runnables, chat models and
tools re-raise what they catch after reporting it (`on_chain_error`, `on_llm_error`,
`on_tool_error`).

A LangGraph **subgraph** (a compiled graph used as a node, or invoked from one) is a
child run of the handler's run, named after its node: its model and tool calls are
recorded on it, with its own budgets capped by what the parent has left, its spend
rolled up into the parent. LangGraph reports it in the callback metadata only: every
event inside a subgraph carries `langgraph_checkpoint_ns` "node:id|inner:id" (one
"|"-separated segment per graph level). The child run opens at the first event inside
it and ends when the node's chain ends; a subgraph inside a subgraph is a grandchild. `subgraph_budgets={"research": {"max_steps": 5}}` gives a node's subgraph
its own budgets. A stop of a child run raises through the graph like any stop (the
graph cannot go on past it), so the parent run ends killed with it unless your code
catches RunKilled around the subgraph.

Extra `langchain` (langchain-core >= 0.3): `pip install '.[langchain]'` from a checkout, or
`pip install 'agent-watchdog-daemon[langchain]'`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from uuid import UUID

try:
    from langchain_core.callbacks import BaseCallbackHandler
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "watchdog.integrations.langchain needs langchain-core (the `langchain` extra): "
        "pip install '.[langchain]' from a checkout of agent-watchdog, or pip install \"$(ls dist/*.whl)[langchain]\" "
        "with a wheel built from it (docs/howto/langchain.md)"
    ) from exc

from watchdog.errors import RunKilled, ToolUnavailable
from watchdog.integrations._common import PendingTool, RunBinding, after_tool, before_tool, tool_args

if TYPE_CHECKING:
    from langchain_core.outputs import LLMResult  # not followed (pyproject): Any to mypy

    from watchdog.sdk.client import Watchdog
    from watchdog.sdk.run import Run

log = logging.getLogger("watchdog.integrations.langchain")

from watchdog.integrations import lc_quiet  # noqa: E402 — issue 19: our refusals are not callback errors

lc_quiet.install()

__all__ = ["WatchdogCallbackHandler", "handler"]

_MODEL_KEYS = ("model", "model_name", "model_id", "deployment_name")


def handler(wd: Watchdog, agent: str, **run_kwargs: Any) -> WatchdogCallbackHandler:
    """`callbacks=[handler(wd, agent="support-bot")]`: a handler that opens its own run.

    `run_kwargs` are those of `Watchdog.run()` (kill_mode, labels, guards, max_steps, ...)
    and the handler's own `estimated_cost_eur` and `circuits`.
    """
    return WatchdogCallbackHandler(wd, agent=agent, **run_kwargs)


class WatchdogCallbackHandler(RunBinding, BaseCallbackHandler):
    """Records LangChain model and tool calls on a watchdog run; raises RunKilled to stop it.

    Either give `wd` and `agent` (plus any `Watchdog.run()` keyword): the handler opens
    the run at its first event and ends it when the outermost chain ends. Used as a
    context manager (`with handler:`), the block is the run instead: for loops with no
    enclosing chain, or several invocations as one run. A handler reused for a later
    invocation opens a new run; `.run` is the current (or last) one.

    Or give `run=` an already started Run: the handler records on it and leaves
    ending it to its owner (the `with wd.run(...)` block).

    `estimated_cost_eur`: what one model call is expected to cost, for the money
    guard's pre-check before each call. `circuits`: fail a tool call fast with
    ToolUnavailable (an ordinary exception, recorded) while the daemon holds the
    tool's circuit open, like `Run.tool_call` does.
    """

    raise_error: bool = True  # without it LangChain logs a callback's exception and goes on
    run_inline: bool = True  # async runs call us in order, on the event loop's thread

    def __init__(self, wd: Watchdog | None = None, *, agent: str | None = None, run: Run | None = None,
                 estimated_cost_eur: float = 0.0, circuits: bool = True,
                 subgraph_budgets: dict[str, dict[str, Any]] | None = None, **run_kwargs: Any) -> None:
        super().__init__()
        self._bind(wd, agent, run, estimated_cost_eur, run_kwargs)
        self._subgraph_budgets = dict(subgraph_budgets or {})
        self._subgraphs: dict[str, Run] = {}  # LangGraph checkpoint namespace of a subgraph -> its child run
        self._chain_ns: dict[UUID, str] = {}  # chains in flight inside a graph -> their namespace
        self._circuits = circuits
        self._roots: set[UUID] = set()  # outermost chains in flight
        self._models: dict[UUID, tuple[str | None, Run]] = {}  # LangChain run id -> requested model, its run
        self._tools: dict[UUID, tuple[Run, PendingTool]] = {}  # LangChain run id -> tool call in flight

    # -- the run's lifecycle (open / end / with: RunBinding) ------------------------

    def _forget(self) -> None:
        self._roots.clear()
        children, self._subgraphs = list(self._subgraphs.values()), {}
        self._chain_ns.clear()
        for child in reversed(children):  # a subgraph's child run ends with its parent's
            _end_child(child, None)

    # -- LangGraph subgraphs: child runs ------------------------------------------------

    def _run_for(self, kwargs: dict[str, Any]) -> Run:
        """The run an event is recorded on: the child run of the innermost subgraph it is in
        (opened now if this is its first event), else ours."""
        run = self._open()
        ns = (kwargs.get("metadata") or {}).get("langgraph_checkpoint_ns")
        if not isinstance(ns, str) or "|" not in ns:
            return run
        parts = ns.split("|")
        for k in range(1, len(parts)):  # outermost subgraph first: each is its parent's child
            key = "|".join(parts[:k])
            child = self._subgraphs.get(key)
            if child is None:
                node = parts[k - 1].split(":", 1)[0] or "subgraph"
                child = run.child(node[:128], **self._subgraph_budgets.get(node, {})).start()
                with self._lock:
                    self._subgraphs[key] = child
            run = child
        return run

    def _chain_done(self, run_id: UUID, error: BaseException | None) -> None:
        """A chain inside a graph ended: if it is the node that holds a subgraph, that child run ends
        (with the subgraphs inside it)."""
        with self._lock:
            ns = self._chain_ns.pop(run_id, None)
            if ns is None or ns not in self._subgraphs:
                return
            done = sorted((k for k in self._subgraphs if k == ns or k.startswith(ns + "|")), key=len, reverse=True)
            children = [self._subgraphs.pop(k) for k in done]
        for child in children:  # innermost first
            _end_child(child, error)

    def _obey(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> object:
        """Run a recording step. Only stops (and ToolUnavailable) reach the agent: a stop ends our run
        at once unless a chain or `with` block will; any other failure of ours is logged, never raised."""
        try:
            return fn(*args, **kwargs)
        except RunKilled as stop:
            with self._lock:
                someone_else_will_end_it = self._managed or bool(self._roots)
            if not someone_else_will_end_it:
                self.end(stop)
            raise
        except ToolUnavailable:
            raise
        except Exception:  # noqa: BLE001 - raise_error is on: a bug of ours must not fail the agent
            log.warning("agent-watchdog: could not record a LangChain event on run %s", getattr(self.run, "id", None), exc_info=True)
            return None

    # -- chains: the outermost one bounds the run -----------------------------------

    def on_chain_start(self, serialized, inputs, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any):
        if parent_run_id is None:
            self._obey(self._root_start, run_id)
            return
        ns = (kwargs.get("metadata") or {}).get("langgraph_checkpoint_ns")
        if isinstance(ns, str) and ns and not self._ended:  # a chain inside a LangGraph graph
            with self._lock:
                self._chain_ns[run_id] = ns
            if "|" in ns:  # inside a subgraph: its child run opens with its first node
                self._obey(self._run_for, kwargs)

    def _root_start(self, run_id: UUID) -> None:
        self._open()
        with self._lock:
            self._roots.add(run_id)

    def on_chain_end(self, outputs, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any):
        if run_id in self._chain_ns:
            self._chain_done(run_id, None)
        self._root_done(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None,
                       **kwargs: Any):
        if run_id in self._chain_ns:
            self._chain_done(run_id, error)
        self._root_done(run_id, error)

    def _root_done(self, run_id: UUID, error: BaseException | None) -> None:
        with self._lock:
            if run_id not in self._roots:
                return
            self._roots.discard(run_id)
            last = not self._roots and not self._managed
        if last:
            self.end(error)

    # -- model calls: a step each -------------------------------------------------------

    def on_chat_model_start(self, serialized, messages, *, run_id: UUID, parent_run_id: UUID | None = None,
                            **kwargs: Any):
        self._model_start(run_id, kwargs)

    def on_llm_start(self, serialized, prompts, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any):
        self._model_start(run_id, kwargs)

    def _model_start(self, run_id: UUID, kwargs: dict[str, Any]) -> None:
        self._obey(self._before_model, run_id, kwargs)

    def _before_model(self, run_id: UUID, kwargs: dict[str, Any]) -> None:
        run = self._run_for(kwargs)
        self._models[run_id] = (_requested_model(kwargs), run)
        # Pre-flight: stop requested, wall clock, max_steps, money: refuse the call before it is made.
        run.check_budget(self._estimated)

    def on_llm_end(self, response, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any):
        self._obey(self._after_model, run_id, response)

    def _after_model(self, run_id: UUID, response: LLMResult) -> None:
        requested, run = self._models.pop(run_id, (None, self.run))
        if run is None:  # a child binding's end before any start: no run to count it on
            return
        served, tokens_in, tokens_out, cached, reasoning = _usage(response)
        run.step(model=requested or served, tokens_in=tokens_in, tokens_out=tokens_out,
                               cached_tokens_in=min(cached, tokens_in), reasoning_tokens=min(reasoning, tokens_out))

    def on_llm_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None,
                     **kwargs: Any):
        self._models.pop(run_id, None)

    # -- tool calls -------------------------------------------------------------------------

    def on_tool_start(self, serialized, input_str: str, *, run_id: UUID, parent_run_id: UUID | None = None,
                      inputs: dict | None = None, **kwargs: Any):
        self._obey(self._before_tool, run_id, serialized, input_str, inputs, kwargs)

    def _before_tool(self, run_id: UUID, serialized: dict[str, Any] | None, input_str: str,
                     inputs: dict[str, Any] | None, kwargs: dict[str, Any]) -> None:
        run = self._run_for(kwargs)
        name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
        # Before the tool runs: a refusal raised here means the tool never runs.
        pending = before_tool(run, name, tool_args(inputs if inputs is not None else input_str),
                              circuits=self._circuits)
        self._tools[run_id] = (run, pending)

    def on_tool_end(self, output, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any):
        entry = self._tools.pop(run_id, None)
        if entry is None:
            return
        run, pending = entry
        # A tool with handle_tool_error returns its error as a ToolMessage with status "error".
        failed = getattr(output, "status", None) == "error"
        self._obey(after_tool, run, pending, ok=not failed, error=_message_text(output) if failed else None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None,
                      **kwargs: Any):
        entry = self._tools.pop(run_id, None)  # on_tool_error carries no tool name: the start had it
        if entry is None:
            return
        run, pending = entry
        self._obey(after_tool, run, pending, ok=False, error=error)


def _end_child(child: Run, error: BaseException | None) -> None:
    try:
        if error is None:
            child.__exit__(None, None, None)
        else:
            child.__exit__(type(error), error, error.__traceback__)
    except Exception:  # noqa: BLE001 - ending must never replace the agent's own outcome
        log.exception("agent-watchdog: could not end child run %s", child.id)


def _requested_model(kwargs: dict[str, Any]) -> str | None:
    params = kwargs.get("invocation_params") or {}
    for key in _MODEL_KEYS:
        if isinstance(params.get(key), str) and params[key]:
            return params[key]
    name = (kwargs.get("metadata") or {}).get("ls_model_name")
    return name if isinstance(name, str) and name else None


def _usage(response: LLMResult) -> tuple[str | None, int, int, int, int]:
    """(model name served, input tokens, output tokens, cached input tokens, reasoning tokens)
    of one LLMResult: usage_metadata's input_token_details.cache_read and
    output_token_details.reasoning, else the OpenAI-style token_usage details."""
    model = None
    tokens_in = tokens_out = cached = reasoning = 0
    found = False
    try:
        generation = response.generations[0][0]
    except (AttributeError, IndexError, TypeError):
        generation = None
    message = getattr(generation, "message", None)
    if message is not None:
        usage = getattr(message, "usage_metadata", None)
        if usage:
            tokens_in, tokens_out, found = _int(usage.get("input_tokens")), _int(usage.get("output_tokens")), True
            cached = _int(_get(usage.get("input_token_details"), "cache_read"))
            reasoning = _int(_get(usage.get("output_token_details"), "reasoning"))
        meta = getattr(message, "response_metadata", None) or {}
        model = meta.get("model_name") or meta.get("model")
    llm_output = getattr(response, "llm_output", None) or {}
    if not found:
        usage = llm_output.get("token_usage") or llm_output.get("usage") or {}
        if isinstance(usage, dict):
            tokens_in = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
            tokens_out = _int(usage.get("completion_tokens", usage.get("output_tokens")))
            cached = _int(_get(usage.get("prompt_tokens_details"), "cached_tokens"))
            reasoning = _int(_get(usage.get("completion_tokens_details"), "reasoning_tokens"))
    model = model or llm_output.get("model_name") or llm_output.get("model")
    return (model if isinstance(model, str) and model else None), tokens_in, tokens_out, cached, reasoning


def _get(details: object, key: str) -> object:
    return details.get(key) if isinstance(details, dict) else None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _message_text(output: object) -> str:
    content = getattr(output, "content", output)
    return content if isinstance(content, str) else str(content)
