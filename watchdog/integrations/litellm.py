"""The LLM gateway: a LiteLLM proxy callback that makes every model call through the proxy a step
of a watched run, and refuses the call of a run that is stopped, paused or over budget.

    litellm_settings:
      callbacks: ["watchdog.integrations.litellm.proxy_handler"]

The run is the one the `x-litellm-trace-id` header names: a run another writer owns (exec's or
the SDK's run id, `$AGENT_WATCHDOG_RUN`) is joined — its row is read, never written; the call is
appended as an event marked `source = "litellm"` — and an unknown trace id is the callback's own
run (`source = "litellm"`, written through the SDK's write path). The agent (its profile) is the
key's alias; the request's metadata may name it only where the key's metadata allows it
(`agent_watchdog_agents: [...]`). A call without a trace id counts against period budgets only.
Checks run off the proxy's event loop within PRE_CALL_DEADLINE_S; a store outage fails open
with one warning. A refusal is HTTP 400 (a 429 or 5xx would be retried by OpenAI clients) whose
message begins `agent-watchdog: run stopped:` and names the reason. See docs/howto/gateways.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from watchdog.core import lifecycle as lc
from watchdog.core.lifecycle import AGENT_MAX_CHARS, MODEL_MAX_CHARS, RUN_ID_MAX_CHARS
from watchdog.core.text import one_line, printable
from watchdog.errors import RunKilled
from watchdog.integrations.litellm_preflight import Estimate, preflight
from watchdog.sdk.client import Watchdog
from watchdog.sdk.joined import JoinedRuns, RunState
from watchdog.sdk.run import Run
from watchdog.store import joined
from watchdog.store.access import missing_gateway_grants
from watchdog.store.engine import GATEWAY_LOCK_TIMEOUT_MS, GATEWAY_ROLE, gateway_misconfiguration, row_locked

log = logging.getLogger("watchdog.integrations.litellm")

SOURCE = lc.Source.LITELLM
DEFAULT_AGENT = "litellm"
PRE_CALL_DEADLINE_S = 2.0
ALLOW_KEY = "agent_watchdog_agents"  # in a key's metadata: the agents its requests may name
AGENT_KEY = "agent_watchdog_agent"  # in a request's metadata
RESOLVED_KEY = "agent_watchdog_resolved_agent"  # set by the pre-call hook, over whatever the client sent
# A store that answers but keeps this trace's run row locked (another login's open transaction):
# the call is refused, never let through unjudged.
LOCKED = ("agent-watchdog: run stopped: its row is locked in the store by another session's open "
          "transaction, so it cannot be judged; the call is refused until that transaction ends")
RUNS_MAX = 10_000  # own runs remembered (the oldest are forgotten; the store still has them)


def _name(value: Any, max_chars: int) -> str | None:
    return value if isinstance(value, str) and value.strip() and len(value) <= max_chars and printable(value) else None


class WatchdogProxyHandler(CustomLogger):
    """One per proxy process (`proxy_handler`); thread-safe."""

    def __init__(self, url: str | None = None):
        super().__init__()
        self._url = url
        self._wd: Watchdog | None = None
        self._lock = threading.Lock()
        # Own runs by (agent, trace id): a trace id is a claim any key can make; another key's
        # calls with the same trace are a run of that key's own, never counted on this one.
        self.runs: dict[tuple[str, str], Run] = {}
        self._joined: JoinedRuns | None = None  # joined runs, and this proxy's view of their steps
        self._warned = False
        self._misconfigured = False

    # -- plumbing --------------------------------------------------------------

    def wd(self) -> Watchdog:
        if self._wd is None:
            with self._lock:
                if self._wd is None:
                    wd = Watchdog(self._url, attest_socket="", lock_timeout_ms=GATEWAY_LOCK_TIMEOUT_MS)
                    wd.store_role = GATEWAY_ROLE
                    missing = missing_gateway_grants(wd.engine)
                    if missing is not None:  # loud at the first call: the runs it joins would record nothing
                        log.error("agent-watchdog: %s; their model calls pass unrecorded until then", missing)
                    self._joined = JoinedRuns(wd, SOURCE)
                    self._wd = wd
        return self._wd

    def joined(self) -> JoinedRuns:
        """The runs another writer owns that this proxy witnesses (made with its Watchdog)."""
        self.wd()
        assert self._joined is not None  # made with the Watchdog, before it is published
        return self._joined

    def _outage(self, exc: BaseException) -> None:
        """Fail open, said once: an outage, or (said once on its own, with the fix) a store that
        refuses this login: a missing grant, which refuses every call until fixed."""
        wrong = gateway_misconfiguration(exc, self._wd.url if self._wd is not None else (self._url or ""))
        if wrong is not None:
            if not self._misconfigured:
                self._misconfigured = True
                log.error("agent-watchdog: %s; model calls pass unrecorded and unguarded until then", wrong)
            return
        if not self._warned:
            self._warned = True
            log.warning("agent-watchdog: the store failed (%s: %s); model calls pass unguarded while it does",
                        type(exc).__name__, one_line(str(exc), 200))

    @staticmethod
    def agent_of(user_api_key_dict: Any, metadata: Any) -> str:
        key_meta = getattr(user_api_key_dict, "metadata", None) or {}
        alias = _name(getattr(user_api_key_dict, "key_alias", None), AGENT_MAX_CHARS) or DEFAULT_AGENT
        allowed = key_meta.get(ALLOW_KEY) if isinstance(key_meta, dict) else None
        asked = metadata.get(AGENT_KEY) if isinstance(metadata, dict) else None
        if asked is not None and isinstance(allowed, list) and asked in allowed and _name(asked, AGENT_MAX_CHARS):
            return asked
        return alias

    # -- before the call -------------------------------------------------------------

    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):  # noqa: D401
        from fastapi import HTTPException

        trace = data.get("litellm_trace_id") if isinstance(data, dict) else None
        if trace is not None and _name(trace, RUN_ID_MAX_CHARS) is None:
            raise HTTPException(status_code=400, detail={"error": (
                f"agent-watchdog: bad request: x-litellm-trace-id must be a run id (printable, at most "
                f"{RUN_ID_MAX_CHARS} characters)")})
        metadata = data.get("metadata") if isinstance(data, dict) else None
        if metadata is not None and not isinstance(metadata, dict):
            raise HTTPException(status_code=400, detail={"error": (
                f"agent-watchdog: bad request: metadata must be an object, got {type(metadata).__name__}")})
        agent = self.agent_of(user_api_key_dict, metadata)
        if isinstance(data, dict):  # the agent as resolved here, for the success hook (never the client's word)
            data["metadata"] = {**(metadata or {}), RESOLVED_KEY: agent}
        try:
            verdict = await asyncio.wait_for(asyncio.to_thread(self.check, trace, agent, data), PRE_CALL_DEADLINE_S)
        except asyncio.TimeoutError:
            self._outage(TimeoutError(f"no answer within {PRE_CALL_DEADLINE_S:g} s"))
            return data
        except Exception as exc:  # noqa: BLE001 — fail open
            if row_locked(exc):  # not an outage: another session holds this run's row (fail closed)
                raise HTTPException(status_code=400, detail={"error": LOCKED}) from None
            self._outage(exc)
            return data
        if verdict is not None:
            raise HTTPException(status_code=400, detail={"error": verdict})
        return data

    def check(self, trace: str | None, agent: str, data: dict | None = None) -> str | None:
        """The refusal text for a call of `agent` in run `trace`, or None to let it through."""
        wd = self.wd()
        estimate = preflight(data, wd.config().pricing.eur_per_usd) if trace is not None else Estimate()
        refused = wd.refusal(agent, None)  # a spent period budget: for every call of the agent
        if refused is not None:
            return refusal(*refused)
        if trace is None:
            return None
        with self._lock:
            run = self.runs.get((agent, trace))
        if run is not None:
            status = joined.own_status(wd.writer, run.id)
            if status is not None and quietly_ended(status[0], status[1]):
                run, status = self._new_run(trace, run.agent, fresh=True), None
            return self._check_own(run, estimate, status)
        state = self.joined().state(trace)
        if state is None:
            return self._check_own(self._new_run(trace, agent), estimate)
        if state.source == SOURCE and state.agent != agent:
            # The callback's own run of this trace, made for another key: this key's calls are a
            # run of its own (a fresh id), never counted on, nor refused by, the other's.
            return self._check_own(self._new_run(trace, agent, fresh=True), estimate)
        return self._check_joined(state, estimate)

    def _check_own(self, run: Run, estimate: Estimate,
                   status: tuple[str, str | None, str | None] | None = None) -> str | None:
        if status is None and run.status is not None and run.steps:  # a new run needs no read
            status = joined.own_status(self.wd().writer, run.id)
        if status is not None and status[0] == lc.PAUSED:
            return f"agent-watchdog: run stopped: paused (run {run.id[:8]} waits for a human to approve more budget)"
        if status is not None and status[0] not in (lc.RUNNING, lc.PAUSED):
            run.cancel(RunKilled(status[1] or status[0], status[2] or f"the run is {status[0]}"))
        try:
            run.check()
            guard = run.guard
            if guard is not None:
                run.guarded(lambda: guard.before_model(estimate.cost_eur, run.elapsed_s, estimate.tokens))
        except RunKilled as stop:
            return refusal(stop.reason, stop.detail)
        return None

    def _check_joined(self, state: RunState, estimate: Estimate) -> str | None:
        if state.status != lc.RUNNING:
            if quietly_ended(state.status, state.stop_reason) and state.source == SOURCE:
                # The callback's own run of this trace ended by silence: the next call is a new run.
                return self._check_own(self._new_run(trace=state.id, agent=state.agent, fresh=True), estimate)
            if state.status == lc.PAUSED:
                return "agent-watchdog: run stopped: paused (it waits for a human to approve more budget)"
            return refusal(state.stop_reason or state.status, state.stop_detail)
        runs = self.joined()
        guard = runs.guard(state)  # the larger of this witness's count and the run's, never the sum
        try:
            guard.before_model(estimate.cost_eur, runs.elapsed_s(state), estimate.tokens)
        except RunKilled as stop:
            return refusal(stop.reason, stop.detail)
        return None

    def _new_run(self, trace: str, agent: str, fresh: bool = False) -> Run:
        """The callback's own run for `trace` (its id, or with `fresh` a new id: that one has ended)."""
        run = self.wd().run(agent, run_id=None if fresh else trace)
        run.source = SOURCE
        run.never_hold()  # the callback never waits inside the proxy for a human to answer a pause
        try:
            run.start()
        except ValueError:  # another proxy process made it a moment ago: judge it as a joined run
            pass
        with self._lock:
            if len(self.runs) >= RUNS_MAX:
                self.runs.pop(next(iter(self.runs)))
            self.runs[(agent, trace)] = run
        return run

    # -- after the call --------------------------------------------------------------

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        try:
            await asyncio.to_thread(self.record, kwargs, response_obj)
        except Exception as exc:  # noqa: BLE001 — bookkeeping never fails a call
            self._outage(exc)

    def record(self, kwargs: dict, response_obj: Any) -> None:
        raw_trace = kwargs.get("litellm_trace_id")
        if raw_trace is None:
            slo = kwargs.get("standard_logging_object") or {}
            raw_trace = slo.get("trace_id") if isinstance(slo, dict) else None
        trace = _name(raw_trace, RUN_ID_MAX_CHARS)
        usage = getattr(response_obj, "usage", None)
        tokens_in = _count(getattr(usage, "prompt_tokens", 0))
        tokens_out = _count(getattr(usage, "completion_tokens", 0))
        usd = kwargs.get("response_cost")
        wd = self.wd()
        cost_eur = float(usd) * wd.config().pricing.eur_per_usd \
            if isinstance(usd, (int, float)) and not isinstance(usd, bool) and 0 <= usd < 1e9 else None
        model = _name(kwargs.get("model"), MODEL_MAX_CHARS)
        if trace is None:
            self._record_untraced(kwargs, model, tokens_in, tokens_out, cost_eur)
            return
        agent = resolved_agent(kwargs)
        with self._lock:
            run = self.runs.get((agent, trace))
        if run is not None:
            try:
                run.step(model=model, tokens_in=tokens_in, tokens_out=tokens_out, cost_eur=cost_eur)
            except RunKilled:
                pass  # the next call is refused
            return
        self._record_joined(trace, agent, _name(kwargs.get("litellm_call_id"), 128), model, tokens_in, tokens_out,
                            cost_eur)

    def _record_joined(self, trace: str, agent: str, call_id: str | None, model: str | None, tokens_in: int,
                       tokens_out: int, cost_eur: float | None) -> None:
        runs = self.joined()
        state = runs.state(trace)
        if state is None or (state.source == SOURCE and state.agent != agent):
            return  # no run, or the callback's own run of this trace for another key (check() made this key's)
        try:
            runs.append(trace, kind=lc.EV_STEP, call_id=call_id, model=model, tokens_in=tokens_in,
                        tokens_out=tokens_out, cost_eur=cost_eur)
        finally:  # seen, whatever the store did with it: a run holding its own row locked (its event
            guard = runs.known(trace)  # waits on it, then gives up) is still refused past its budget
            if guard is not None:
                guard.after_step(cost_eur or 0.0, tokens_in + tokens_out)


    def _record_untraced(self, kwargs: dict, model: str | None, tokens_in: int, tokens_out: int,
                         cost_eur: float | None) -> None:
        """A call with no trace id is a run of one call (created and ended at once): the period
        budgets count its spend, and no run budget can trip on a run that is already over."""
        run = self.wd().run(resolved_agent(kwargs), guards=False)
        run.source = SOURCE
        run.start()
        try:
            run.step(model=model, tokens_in=tokens_in, tokens_out=tokens_out, cost_eur=cost_eur)
        except RunKilled:
            pass
        run.end(lc.COMPLETED, None, None)


def resolved_agent(kwargs: dict) -> str:
    """The agent the pre-call hook resolved for this call (the key's; never the client's word)."""
    meta = (kwargs.get("litellm_params") or {}).get("metadata") or {}
    return (_name(meta.get(RESOLVED_KEY), AGENT_MAX_CHARS) if isinstance(meta, dict) else None) or DEFAULT_AGENT


def quietly_ended(status: str, reason: str | None) -> bool:
    """Ended by silence (or completed): a later call of the same trace is a new run, not refused."""
    return status == lc.COMPLETED or (status in lc.END_STATUSES and reason == lc.HEARTBEAT_TIMEOUT)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else 0


def refusal(reason: str, detail: str | None) -> str:
    text = f"agent-watchdog: run stopped: {reason}"
    if detail:
        text += f" ({one_line(detail, 200)})"
    return text + ". Do not retry this request; finish with what you have."


def _handler() -> WatchdogProxyHandler:
    url = os.environ.get("AGENT_WATCHDOG_DB")
    if not url:  # loud at start: the proxy runs, but nothing is watched
        log.error("agent-watchdog: AGENT_WATCHDOG_DB is not set: the LiteLLM callback cannot reach a store and lets "
                  "every call through; set it to the store's URL (e.g. sqlite:////var/lib/agent-watchdog/runs.db)")
    return WatchdogProxyHandler(url)


proxy_handler = _handler()
