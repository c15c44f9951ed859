"""One agent run as the SDK sees it: a context manager that records and obeys stops."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
import uuid
import weakref
from collections import Counter
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, NoReturn, Protocol, Self, Sequence, TypeVar, Unpack

from watchdog.core import policies as ap, budgets as bud, lifecycle as lc
from watchdog.core.evidence_mac import RecordMac
from watchdog.core.procid import current_create_time, hostname
from watchdog.core.lifecycle import (MODEL_MAX_CHARS, TOOL_MAX_CHARS, error_fields, hash_args, validate_amount,
                                     validate_count, validate_name, validate_tokens)
from watchdog.errors import RunKilled, StoreMisconfigured
from watchdog.sdk import obey, toolcall
from watchdog.sdk.guards import Guard
from watchdog.sdk.obey import Hold, pause_statements
from watchdog.store.engine import row_locked
from watchdog.store.lineage import Lineage
from watchdog.core.periods import utcnow

from watchdog.sdk.seams import WatchdogLike

if TYPE_CHECKING:
    from watchdog.sdk.attest import Attester
    from watchdog.sdk.burst import Bursts
    from watchdog.store.lineage import Statement

T = TypeVar("T")


PARTIAL_MAX_CHARS = 2000
# Records of a run waiting for its attestation whose MAC is written once the key arrives (beyond
# these, the earliest records stay unauthenticated: they still stop the run cooperatively).
PENDING_MAC_MAX = 10_000


# Tool names already found valid in this process: an agent calls the same few tools over and over,
# and validating a name (printable, one line, fits its column) is work each record would repeat.
_VALID_TOOLS: set[str] = set()
VALID_TOOLS_CACHED_MAX = 4096  # distinct names remembered; past that, the rest are checked every time


class Maker(WatchdogLike, Protocol):
    """What a run asks of the Watchdog that made it (watchdog.sdk.client.Watchdog: a protocol, so
    this module never imports the client, which imports it)."""

    @property
    def record_args(self) -> bool: ...

    @property
    def record_errors(self) -> str: ...

    @property
    def attest_socket(self) -> str: ...

    def write(self, statements: Sequence[Statement], *, raise_conflict: bool = False) -> Sequence[Any] | None: ...

    @property
    def bursts(self) -> Bursts: ...

    def price_eur(self, model: str | None, tokens_in: int, tokens_out: int, cached_tokens_in: int = 0,
                  reasoning_tokens: int = 0) -> float | None: ...

    def run(self, agent: str, *, kill_mode: str = lc.COOPERATIVE, labels: dict[str, str] | None = None,
            run_id: str | None = None, guards: bool = True, parent_id: str | None = None, _parent: Run | None = None,
            _left: dict[str, float] | None = None, **budgets: Unpack[bud.RunBudgets]) -> Run: ...


def _valid_tool(name: object) -> None:
    validate_name("name", name, TOOL_MAX_CHARS)
    if type(name) is str and len(_VALID_TOOLS) < VALID_TOOLS_CACHED_MAX:
        _VALID_TOOLS.add(name)  # a plain str only: a subclass could compare equal and hash alike, yet differ


class Run:
    """Created by `Watchdog.run()`. Every record is one transaction that also reads
    the run's status back: when the daemon asked the run to stop, it raises RunKilled;
    when it paused the run (on_breach = "pause"), the record waits for a human's answer."""

    _t0: float  # the monotonic clock at start()

    def __init__(self, wd: Maker, *, agent: str, kill_mode: str, labels: dict[str, str] | None,
                 run_id: str | None, budgets: Mapping[str, float], profile: bud.Budgets | None, guards: bool,
                 parent: Run | None = None, ancestors: tuple[str, ...] = (), source: str = "sdk") -> None:
        self.wd = wd
        # Which witness writes this run (runs.source): the SDK, or a gateway that uses the SDK's
        # write path (the MCP proxy, the LiteLLM callback).
        self.source = source
        self.id = run_id or uuid.uuid4().hex
        self.agent = agent
        self.kill_mode = kill_mode
        self.labels = labels
        self.requested = dict(budgets)
        self.profile = profile if profile is not None else bud.Budgets()
        self.budgets = bud.effective(self.profile, self.requested)  # what the daemon holds it to too
        self.guards_enabled = guards
        self._lock = threading.Lock()
        self._seq = 0
        self._stop: RunKilled | None = None
        self.started_at: dt.datetime | None = None
        self.steps = self.tool_calls = self.tool_errors = 0
        self.tokens_in = self.tokens_out = 0
        self.cost_eur = 0.0  # what the SDK priced; the daemon adds the steps it prices later
        self.cost_unpriced_tokens = 0
        self.tool_counts: Counter[str] = Counter()  # per tool, for the alert of an in-process stop
        self.tool_error_counts: Counter[str] = Counter()
        self.status: str | None = None
        # (tool, args hash) -> (stored at, result) of read-only calls
        self.dedupe_cache: dict[tuple[str, str], tuple[float, Any]] = {}
        self.guard = Guard(self.budgets.to_json()) if guards else None
        self._attester: Attester | None = None  # set while a run that may be signalled is not attested yet
        # The run's evidence key from its attestation (watchdog.core.evidence_mac): its records
        # carry a MAC only its process can compute; on SQLite only those can justify a signal.
        self._evmac: RecordMac | None = None
        self._pending_mac: list[tuple[int, tuple[Any, ...]]] | None = None  # (seq, MAC'd fields) before the key came
        # Set (within a second, while a tool is in flight) when the run is asked to stop:
        # a long tool polls it (`if run.cancelled.is_set(): return what_i_have`).
        self.cancelled = threading.Event()
        self._stop_raised = False  # the agent has been told (RunKilled raised) of self._stop
        self._cancel_waiters: set[threading.Event] = set()  # Events a stop also sets (a tool waited on with timeout_s)
        self.partial_result: str | None = None
        self.parent = parent  # the in-process parent Run of a child run, else None
        if parent is not None:
            ancestors = (parent.id, *parent.lineage.ancestors)
        self.parent_id = ancestors[0] if ancestors else None
        self._children: weakref.WeakSet[Run] = weakref.WeakSet()
        self.lineage: Lineage = Lineage(wd.writer.dialect, self.id, ancestors)
        self.hold = Hold(self)  # the pause gate every record of this run waits at while it is paused
        self.holds = True  # False (never_hold): a pause never holds this run's threads

    def effective_budgets(self) -> dict[str, Any]:
        """The profile's budgets lowered by the run's own request (what the daemon applies too)."""
        return self.budgets.to_json()

    # -- lifecycle -----------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def start(self) -> Self:
        d = self.wd.writer.dialect
        now = utcnow()
        self.started_at = now
        self._t0 = time.monotonic()
        params = (
            self.id, self.agent, lc.RUNNING, self.kill_mode, hostname(), os.getpid(), current_create_time(),
            d.json(self.labels), *(self.requested.get(k) for k in bud.RUN_BUDGET_KEYS),
            d.seen(now), d.seen(now),  # the store's clock (Dialect.clock_ph)
            self.source,
        )
        statements: list[Statement] = [(self.wd.writer.sql.insert_run, params)]
        if self.parent_id is not None:
            statements.append(self.lineage.set_parent(self.parent_id))
        try:
            self.wd.write(statements, raise_conflict=True)
        except StoreMisconfigured:
            raise  # the store cannot be used by this process: its one line names the fix
        except Exception as exc:  # a duplicate id (events would land in the other run), or a gateway's lock wait
            if row_locked(exc):  # another session's open INSERT of this id: not a run to join (Watchdog.write)
                raise
            raise ValueError(f"run_id: a run {self.id!r} already exists in the store; give each run its own id") from None
        self.status = lc.RUNNING
        if self.kill_mode != lc.COOPERATIVE:  # a shared process is never signalled: nothing to attest
            from watchdog.sdk.attest import Attester

            self._attester = Attester(self.wd.attest_socket, self.id, self.kill_mode)
            self._pending_mac = []
            self._attest()
            if self._attester is not None and self.wd.attest_socket:  # issue 19: said once, and on the run
                self._unattested(self._attester.why)
        return self

    def _unattested(self, why: str) -> None:
        from watchdog.sdk.attest import warn_unattested

        note = warn_unattested(self.id, self.kill_mode, why)
        try:
            self.wd.writer.transaction([(self.wd.writer.sql.set_progress, (note, self.id))])  # never buffered
        except Exception:  # noqa: BLE001 — a note must never fail the run
            pass

    @property
    def attested(self) -> bool:
        """The daemon of this host attested this run's process identity: it may signal it
        (kill_mode process/tree) if the run does not stop by itself. Unattested runs are
        still watched and stopped cooperatively."""
        return self.kill_mode != lc.COOPERATIVE and self._attester is None

    def _attest(self) -> None:
        """One socket round trip; while the daemon is away, retried at most every RETRY_S
        seconds from _record (a time check per record until it succeeds)."""
        att = self._attester
        if att is not None and att.due() and att.attempt():
            self._attester = None
            if att.key is not None:
                self._evmac = RecordMac(att.key)
                self._mac_pending()
            self._pending_mac = None

    def _mac_pending(self) -> None:
        """MAC the records written before the key came (SQLite, where they count for a signal):
        one transaction, once; a failure leaves them unauthenticated, never fails the run."""
        pending, d = self._pending_mac, self.wd.writer.dialect
        if not pending or not d.sqlite:
            return
        mac = self._evmac
        if mac is None:
            return
        try:
            self.wd.writer.transaction([(self.wd.writer.sql.mac_event, (mac.mac(self.id, seq, *fields), self.id, seq))
                                        for seq, fields in pending])
        except Exception:  # noqa: BLE001 — only the signal's evidence is lost, not the records
            pass

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if isinstance(exc, RunKilled):
            self.end(lc.KILLED, exc.reason, exc.detail)
        elif exc_type is not None:
            cls, msg = error_fields(exc, self.wd.record_errors)
            self.end(lc.FAILED, None, f"{cls}: {msg}" if msg else cls)
        elif self._stop is not None:  # the agent caught the stop and left quietly: still a kill
            self.end(lc.KILLED, self._stop.reason, self._stop.detail)
        else:
            self.end(lc.COMPLETED, None, None)
        return False

    def end(self, status: str, reason: str | None, detail: str | None) -> None:
        d = self.wd.writer.dialect
        self.wd.write([self.wd.writer.sql.end(self.id, status, d.seen(utcnow()), reason, detail)])
        self.status = status

    @property
    def stop_requested(self) -> RunKilled | None:
        return self._stop

    def check(self) -> None:
        """Raise RunKilled if this run was stopped; cheap, no I/O."""
        if self._stop is not None:
            self._stop_raised = True
            raise self._stop

    def _check_recorded(self) -> None:
        """`check` for a record of something that already happened (a model call, a tool call):
        a stop seen in the background (the in-flight poll) lets this one record through first,
        then the record's own status read raises it."""
        if self._stop is not None and self._stop_raised:
            raise self._stop

    # -- pause, cancellation, child runs, partial results ----------------------------

    def cancel(self, stop: RunKilled) -> None:
        """The run was asked to stop (a status read back, a gateway's or a guard's verdict):
        remember `stop`, set `cancelled`, wake whatever waits on it (a held record, a tool with
        timeout_s), and cancel this process's child runs too. Nothing is written: the stop
        raises at the run's next `check` or record."""
        if self._stop is None:
            self._stop = stop
        self.cancelled.set()
        for event in list(self._cancel_waiters):
            event.set()
        self.hold.wake()
        for child in list(self._children):
            if not child.cancelled.is_set():
                child.cancel(RunKilled(stop.reason, f"its parent run {self.id[:8]} was stopped: {stop.detail}"))

    def raise_stop(self, stop: RunKilled) -> NoReturn:
        """Cancel the run for `stop`, note that the agent has been told, and raise it."""
        self.cancel(stop)
        self._stop_raised = True
        raise stop

    def watch_cancel(self, event: threading.Event) -> None:
        """A stop of this run sets `event` too (at once if it is stopped already), until unwatched."""
        self._cancel_waiters.add(event)
        if self.cancelled.is_set():
            event.set()

    def unwatch_cancel(self, event: threading.Event) -> None:
        """Stop setting `event` on a stop (see `watch_cancel`)."""
        self._cancel_waiters.discard(event)

    def never_hold(self) -> None:
        """For a gateway's run: a pause never holds the calling thread (its client would see a
        hung call). A guard's breach stops the run instead of pausing it, and a record that
        reads back `paused` returns at once: the gateway refuses the next call until resumed."""
        self.holds = False

    def set_budgets(self, budgets: bud.Budgets) -> None:
        """New limits (a human resumed the run with more): the guards hold it to them from now on."""
        self.budgets = budgets
        if self.guard is not None:
            self.guard.budgets.update(budgets.to_json())

    def _absorb(self, steps: int, calls: int, errors: int, tokens_in: int, tokens_out: int, cost_eur: float) -> None:
        """A child run's record: it counts on this run's totals and budgets too (not on its loops)."""
        with self._lock:
            self.steps += steps
            self.tool_calls += calls
            self.tool_errors += errors
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out
            self.cost_eur += cost_eur
        if self.guard is not None:
            self.guard.absorb(steps, calls, cost_eur, tokens_in + tokens_out)

    def child(self, agent: str, *, labels: dict[str, str] | None = None, run_id: str | None = None,
              guards: bool | None = None, kill_mode: str = lc.COOPERATIVE, **budgets: Unpack[bud.RunBudgets]) -> Run:
        """A child run (a sub-agent) with its own budgets, never above what this run has left;
        its steps, tool calls and spend count on this run too. Use it as a context manager.

        It shares this process: it is stopped cooperatively, never signalled (a sub-agent in its
        own process opens with `wd.run(..., parent_id=run.id, kill_mode="process")`). When this
        run has nothing left to give, this run's own breach is raised (or it pauses)."""
        if kill_mode != lc.COOPERATIVE:
            raise ValueError("kill_mode: a child run shares its parent's process and is stopped cooperatively; "
                             "open a sub-agent in its own process with wd.run(..., parent_id=...) to have it signalled")
        if self.started_at is None:
            raise ValueError("child(): start the parent run first (inside its `with` block)")
        self.check()
        left: dict[str, float] = {}

        def room() -> None:
            left.clear()
            left.update(obey.left_of(self.budgets, obey.spent_in_process(self)))
            obey.no_room(self, left)

        self.guarded(room)
        child = self.wd.run(agent, kill_mode=lc.COOPERATIVE, labels=labels, run_id=run_id,
                            guards=self.guards_enabled if guards is None else guards, _parent=self, _left=left,
                            **budgets)
        self._children.add(child)
        return child

    def partial(self, result: object) -> None:
        """Keep what the run has produced so far (a string, or JSON data): `show` and the stop
        alert report it. Allowed after a stop too (that is what it is for)."""
        text = result if isinstance(result, str) else json.dumps(result, default=str, ensure_ascii=False)
        text = text[:PARTIAL_MAX_CHARS]
        self.partial_result = text
        self.wd.write([self.lineage.partial(text)])

    # -- records ---------------------------------------------------------------

    def step(self, model: str | None = None, tokens_in: int = 0, tokens_out: int = 0, cost_eur: float | None = None,
             *, cached_tokens_in: int = 0, reasoning_tokens: int = 0) -> None:
        """Record one model call (a step) that happened; its cost is recorded even when over budget.

        `tokens_in` counts every input token (`cached_tokens_in` of them read from the
        provider's prompt cache), `tokens_out` every output token (`reasoning_tokens` of
        them reasoning), as OpenAI and LangChain's usage_metadata report them.
        Without `cost_eur` the step is priced from the table the daemon publishes; a
        model that table does not hold yet is recorded unpriced (no cost, never 0):
        the daemon prices it within a tick, or reports the model if no table knows it.

        The in-process guard then stops the run if it is over a budget (steps, cost,
        tokens, wall-clock). Call `check_budget` *before* each model call to refuse the
        call that would exceed it instead.
        """
        if model is not None:
            validate_name("model", model, MODEL_MAX_CHARS)
        tokens_in, tokens_out = validate_tokens(tokens_in, tokens_out)
        cached = validate_count("cached_tokens_in", cached_tokens_in)
        reasoning = validate_count("reasoning_tokens", reasoning_tokens)
        if cached > tokens_in:
            raise ValueError(f"cached_tokens_in: expected at most tokens_in ({tokens_in}), got {cached}")
        if reasoning > tokens_out:
            raise ValueError(f"reasoning_tokens: expected at most tokens_out ({tokens_out}), got {reasoning}")
        if cost_eur is None:
            cost_eur = self.wd.price_eur(model, tokens_in, tokens_out, cached, reasoning)  # None: unpriced
        else:
            cost_eur = validate_amount("cost_eur", cost_eur)
        self._check_recorded()
        if self.guard:
            self.guard.after_step(cost_eur or 0.0, tokens_in + tokens_out)
        self._record(lc.EV_STEP, model=model, tokens_in=tokens_in, tokens_out=tokens_out, cost_eur=cost_eur,
                     cached_tokens_in=cached or None, reasoning_tokens=reasoning or None,
                     unpriced=(tokens_in + tokens_out) if cost_eur is None else 0)
        if self.guard:
            guard = self.guard
            self.guarded(lambda: guard.check_totals(self.elapsed_s))

    def check_budget(self, estimated_cost_eur: float = 0.0) -> None:
        """Pre-flight: call before a model call so a money budget overshoots by at most one call."""
        estimated_cost_eur = validate_amount("estimated_cost_eur", estimated_cost_eur)
        self.check()
        if self.guard:
            guard = self.guard
            self.guarded(lambda: guard.before_model(estimated_cost_eur, self.elapsed_s))

    def heartbeat(self, progress: str | None = None) -> None:
        """Say "alive" (with optional progress) without a step or a tool call."""
        if progress is not None and not isinstance(progress, str):
            raise ValueError(f"progress: expected a string, got {type(progress).__name__}")
        self.check()
        self._record(lc.EV_HEARTBEAT, progress=progress)

    def record_tool(self, name: str, args: object = None, *, ok: bool = True, error: BaseException | str | None = None,
                    duration_s: float | None = None, attempt: int = 1) -> None:
        """Record a tool call that a framework ran itself (`attempt` > 1: a retry of the same call)."""
        if type(name) is not str or name not in _VALID_TOOLS:
            _valid_tool(name)
        if duration_s is not None:
            duration_s = validate_amount("duration_s", duration_s)
        args = {} if args is None else args
        args_hash = hash_args(args, tool=name)
        ok = bool(ok) and not error
        cls, msg = error_fields(error, self.wd.record_errors) if not ok else (None, None)
        if not ok and cls is None:
            cls, msg = "Error", None if self.wd.record_errors == "class" else "tool reported failure"
        self._check_recorded()
        self._record(lc.EV_TOOL, tool=name, args_hash=args_hash, args=args, ok=ok,
                     error_class=cls, error_msg=msg, duration_s=duration_s, attempt=attempt if attempt > 1 else None)

    def tool_call(self, name: str, args: dict[str, Any] | None, fn: Callable[..., T], read_only: bool = False,
                  **policy: Unpack[toolcall.ToolPolicy]) -> T:
        """Call `fn(**args)`, record it, return its result; the tool's exception is re-raised.
        `policy`: `retries=`, `retry_on=`, `backoff_s=`, `timeout_s=` (watchdog.sdk.toolcall.call_tool)."""
        if type(name) is not str or name not in _VALID_TOOLS:  # before the tool runs: it could not be recorded
            _valid_tool(name)
        return toolcall.call_tool(self, name, {} if args is None else args, fn, read_only=read_only, **policy)

    def before_tool(self, name: str, args: dict[str, Any] | None = None, *,
                    circuits: bool = True) -> toolcall.PendingTool:
        """For a tool the caller runs itself: the checks `tool_call` makes before the tool runs
        (stop, guards, circuit). Raises RunKilled or ToolUnavailable; else call the tool and
        then `after_tool` with what it returned."""
        if type(name) is not str or name not in _VALID_TOOLS:
            _valid_tool(name)
        return toolcall.before_tool(self, name, {} if args is None else args, circuits=circuits)

    def after_tool(self, pending: toolcall.PendingTool, *, ok: bool = True,
                   error: BaseException | str | None = None) -> None:
        """Count and record the call `before_tool` admitted (raises RunKilled if a stop was asked)."""
        toolcall.after_tool(self, pending, ok=ok, error=error)

    @property
    def elapsed_s(self) -> float:
        """Seconds since the run started, on the monotonic clock (0 before it starts)."""
        return time.monotonic() - self._t0 if self.started_at else 0.0

    def guarded(self, check: Callable[[], None]) -> None:
        """Run an in-process guard check. A breach stops the run (RunKilled), or, with the
        profile's on_breach = "pause" for it, pauses it and waits for a human: the check runs
        again with the budgets the run was resumed with."""
        while True:
            try:
                check()
                return
            except RunKilled as stop:
                if self._stop is None and ap.pauses(self.budgets, stop.reason) and self._pause(stop):
                    continue  # resumed with more: check again
                self.cancel(stop)
                self._stop_raised = True
                self.publish_stop(stop)
                raise

    def _pause(self, stop: RunKilled) -> bool:
        """Pause the run in the store for a guard's breach and hold until a human answers.
        True when resumed; False when it could not pause (the store is unreachable: a pause
        nobody can see or answer would be a hang, so the run stops as without pause; and for a
        run that never holds, see `never_hold`)."""
        if not self.holds:
            return False
        try:
            row = self.wd.writer.transaction(pause_statements(self, stop, utcnow()))
        except Exception:  # noqa: BLE001
            return False
        if row is None:
            return False
        if row[0] == lc.RUNNING and (row[3] if len(row) > 3 else self.id) == self.id:
            return False  # not paused (it was not running): stop
        self._obey(row)
        return True

    def publish_stop(self, stop: RunKilled) -> None:
        """Say at once, in the store, that an in-process guard stopped this run.

        The run goes to `stopping` like a daemon stop, so an agent that swallows the
        RunKilled and lingers is still taken down by the daemon's ladder. Only the
        stop request is written: the daemon records it and composes the alert.
        """
        try:
            self.wd.write(self.lineage.stop_request(stop.reason, stop.detail, utcnow()))
        except Exception:  # noqa: BLE001 — a stop must never fail for want of bookkeeping
            pass

    def _record(self, kind: str, *, tool: str | None = None, args_hash: str | None = None, args: object = None,
                ok: bool | None = None, error_class: str | None = None, error_msg: str | None = None,
                duration_s: float | None = None, model: str | None = None, tokens_in: int | None = None,
                tokens_out: int | None = None, cost_eur: float | None = None, progress: str | None = None,
                attempt: int | None = None, cached_tokens_in: int | None = None,
                reasoning_tokens: int | None = None, unpriced: int = 0) -> None:
        # Every field a named parameter (not **kwargs read back with .get): this runs on every record.
        writer = self.wd.writer
        d, sql = writer.dialect, writer.sql
        at = d.seen_now()  # the event's time and the run's last_seen_at: the store's clock, one reading
        record_args = self.wd.record_args  # this process's own choice, never the store's
        steps = 1 if kind == lc.EV_STEP else 0
        calls = 1 if kind == lc.EV_TOOL else 0
        errors = 1 if calls and not ok else 0
        t_in, t_out, cost = tokens_in or 0, tokens_out or 0, cost_eur or 0.0
        with self._lock:
            self._seq += 1
            seq = self._seq
            self.steps += steps
            self.tool_calls += calls
            self.tool_errors += errors
            if calls:
                self.tool_counts[tool] += 1  # type: ignore[index]  # a tool record names its tool
                self.tool_error_counts[tool] += errors  # type: ignore[index]
            self.tokens_in += t_in
            self.tokens_out += t_out
            self.cost_eur += cost
            self.cost_unpriced_tokens += unpriced
        evmac, pending = self._evmac, self._pending_mac
        mac = None
        if evmac is not None or pending is not None:
            macd = (kind, tool, args_hash, ok, model, tokens_in, tokens_out, cached_tokens_in, reasoning_tokens,
                    cost_eur, attempt, at)
            if evmac is not None:
                mac = evmac.mac(self.id, seq, *macd)
            elif pending is not None and len(pending) < PENDING_MAC_MAX:
                pending.append((seq, macd))
        event = (
            self.id, seq, at, kind, tool, args_hash, d.json(args) if record_args else None, ok, error_class,
            error_msg, duration_s, model, tokens_in, tokens_out, cost_eur, progress, attempt, cached_tokens_in,
            reasoning_tokens, mac,
        )
        update = (steps, calls, errors, t_in, t_out, cost, cached_tokens_in or 0, reasoning_tokens or 0, unpriced,
                  seq, at, progress, self.id)
        statements: list[Statement] = sql.record(event, update)
        if self.lineage.ancestors:  # a child: count on its ancestors too, obey theirs as well as its own status
            counts = update[:6]
            statements += self.lineage.record_statements(counts, at)
            ancestor = self.parent
            while ancestor is not None:
                ancestor._absorb(*counts)
                ancestor = ancestor.parent
            row = self.wd.write(statements)
        else:
            if not d.returning:
                statements.append((sql.select_status, (self.id,)))
            # With other threads' records at the same moment: one transaction (watchdog.sdk.burst).
            row = self.wd.bursts.record(event, update, statements)
        if self._attester is not None:
            self._attest()
        if row is not None:
            self._obey(row)

    def _obey(self, row: Sequence[Any]) -> None:
        """Act on the status a record read back: stopped → RunKilled; paused → wait for a human."""
        if row[0] == lc.RUNNING and len(row) == 3:  # the rule: its own row, running
            self.status = lc.RUNNING
            return
        if len(row) < 4 or row[3] == self.id:
            self.status = row[0]
        stop = obey.obeyed_stop(row, self.id)
        if stop is None and row[0] == lc.PAUSED:
            if self.holds:
                self.hold.wait(row)  # returns once resumed (budgets re-read), raises RunKilled when stopped
            return
        if stop is not None:
            self.cancel(stop)
            self._stop = stop
            self._stop_raised = True
            raise stop
