"""The agent SDK: register a run, record steps and tool calls, see stops.

Light on purpose: importing this module never imports psutil, apprise or
APScheduler. Each record is one short transaction (see `watchdog.store.agent_writes`).
"""

from __future__ import annotations

import atexit
import importlib
import logging
import math
import os
import threading
import time
import warnings
import weakref
from collections import deque
from types import ModuleType
from typing import TYPE_CHECKING, Any, Sequence, Unpack

from watchdog.core import budgets as bud, lifecycle as lc, periods
from watchdog.core.config import ENV_CONFIG, ENV_DB, Config
from watchdog.core.config import load as load_config
from watchdog.core.lifecycle import AGENT_MAX_CHARS, RUN_ID_MAX_CHARS, validate_name, validate_record_errors
from watchdog.errors import ConfigError, RunKilled, StoreError, StoreMisconfigured, ToolUnavailable
from watchdog.sdk.attest import socket_path
from watchdog.sdk.burst import Bursts
from watchdog.sdk.circuits import CIRCUIT_CACHE_MAX_S, Circuits
from watchdog.sdk import obey
from watchdog.sdk.inflight import InflightTools
from watchdog.sdk.run import Run
from watchdog.store.engine import make_engine, misconfiguration, normalise_url, row_locked
from watchdog.store.agent_writes import POOL_SIZE, Writer
from watchdog.core.periods import utcnow
from watchdog.store.lineage import Statement
from watchdog.store.settings import CONFIG_KEY

if TYPE_CHECKING:
    from watchdog.sdk.circuits import CircuitGate

log = logging.getLogger("watchdog.client")

# A transaction (watchdog.store.agent_writes.Writer): [(sql, params), ...] (store.lineage.Statement);
# the last statement's first row is what `write` returns.
Statements = Sequence[Statement]

BUFFER_MAX_EVENTS = 10_000
SETTINGS_TTL_S = 5.0
# An unreachable PostgreSQL host must cost a record seconds, not the OS's TCP timeout.
PG_CONNECT_TIMEOUT_S = 5
# What this agent records is its own choice, never the store's: constructor, else these, else its config file.
ENV_RECORD_ARGS = "AGENT_WATCHDOG_RECORD_ARGS"
ENV_RECORD_ERRORS = "AGENT_WATCHDOG_RECORD_ERRORS"
# Set by `agent-watchdog exec` for its command: wd.run() there joins exec's run as its child.
ENV_EXEC_RUN = "AGENT_WATCHDOG_RUN"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")

__all__ = ["Watchdog", "RunKilled", "ToolUnavailable"]


class Watchdog:
    """A handle on the shared store for one agent process. Thread-safe."""

    def __init__(self, url: str | None = None, *, buffer_max: int = BUFFER_MAX_EVENTS,
                 circuit_cache_s: float | None = None, record_args: bool | None = None,
                 record_errors: str | None = None, attest_socket: str | None = None,
                 pool_size: int = POOL_SIZE, lock_timeout_ms: int | None = None) -> None:
        """`circuit_cache_s`: how long the tool circuits the daemon wrote are cached
        (default: one daemon tick as published in the store, at most 5 s).

        What this process records is decided here, never by the store (anyone who can
        write the store could turn it up): `record_args` (store tools' raw arguments;
        default $AGENT_WATCHDOG_RECORD_ARGS, else `[store] record_args` of the config this
        process reads, else False) and `record_errors` ("scrubbed", the default: error
        messages with secrets removed; "class": the exception class only; default
        $AGENT_WATCHDOG_RECORD_ERRORS, else `[store] record_errors`).
        `attest_socket`: the daemon's attestation socket (default $AGENT_WATCHDOG_SOCKET,
        else /run/agent-watchdog/attest.sock; "" = never attest: runs are then stopped
        cooperatively only, never signalled).
        `pool_size`: store connections this process's threads share (one more for the
        rare circuit-probe writes); through PgBouncer these are cheap client connections.
        `lock_timeout_ms` (PostgreSQL): how long a statement may wait for a lock another
        session holds (the gateways pass GATEWAY_LOCK_TIMEOUT_MS; an agent's SDK waits)."""
        url = url or os.environ.get(ENV_DB)
        if not url:
            raise ValueError(f"Watchdog(url): no store URL given and ${ENV_DB} is not set")
        if isinstance(buffer_max, bool) or not isinstance(buffer_max, int) or buffer_max < 0:
            raise ValueError(f"buffer_max: expected an integer >= 0, got {buffer_max!r}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size: expected an integer >= 1, got {pool_size!r}")
        try:
            url = normalise_url(url)
        except StoreError as exc:
            raise ValueError(f"url: {exc}") from None
        kw: dict[str, Any] = ({"connect_args": {"connect_timeout": PG_CONNECT_TIMEOUT_S}}
                              if url.startswith("postgresql") else {})
        # The writer keeps its pool_size connections checked out of the engine's pool; the one
        # overflow connection serves the SQLAlchemy statements (circuit probes): bounded per process.
        # What a PostgreSQL login needs granted, as a fix names it (a gateway's: the gateway's role).
        self.store_role = "the agents' role"
        self.url = url  # as given (the engine's may be rewritten: a SQLite file URI that never creates it)
        # The ping before each checkout (PostgreSQL): a connection a failover left half-open is
        # replaced before an agent's record fails on it (the daemon checks sockets instead).
        kw.setdefault("pool_pre_ping", True)
        self.engine = make_engine(url, pool_size=pool_size, max_overflow=1, pool_timeout=PG_CONNECT_TIMEOUT_S * 2,
                                  create=False, lock_timeout_ms=lock_timeout_ms, **kw)
        self.lock_timeout_ms = lock_timeout_ms
        self.writer = Writer(self.engine, pool_size, lock_timeout_ms=lock_timeout_ms)
        # Records of this process's threads that meet at the store go in one transaction (issue 35).
        self.bursts = Bursts(self, pool_size)
        self.closed = False
        self._buffer: deque[Statements] = deque()
        self._buffer_max = buffer_max
        self._buffer_lock = threading.RLock()
        self.dropped_events = 0
        self.rejected_events = 0
        self._warned_outage = False
        self._warned_rejected = False
        # A write has gone through: from then on a failing store is an outage (buffered), never
        # a misconfiguration raised at the agent (watchdog.store.engine.misconfiguration).
        self._written = False
        self._settings: dict[str, Any] | None = None
        self._settings_at = 0.0
        self._judged_by: str | None = None
        self._config: Config | None = None
        self._config_src: dict[str, Any] | None = None
        self._local = _local_config()
        self.record_args = _record_args(record_args, self._local)
        self.record_errors = _record_errors(record_errors, self._local)
        self.attest_socket = socket_path(attest_socket)
        self.inflight = InflightTools(self)
        # Records buffered during an outage get one last chance when the agent exits.
        atexit.register(_flush_at_exit, weakref.ref(self))
        self.circuits = Circuits(self.writer, cache_s=CIRCUIT_CACHE_MAX_S if circuit_cache_s is None else circuit_cache_s)
        if circuit_cache_s is None:  # follow the daemon's tick: a circuit it opens is seen within one tick
            self.circuits.cache_s = min(CIRCUIT_CACHE_MAX_S, self.config().daemon.tick_s)

    # -- runs --------------------------------------------------------------

    def run(self, agent: str, *, kill_mode: str = lc.COOPERATIVE, labels: dict[str, str] | None = None,
            run_id: str | None = None, guards: bool = True, parent_id: str | None = None, _parent: Run | None = None,
            _left: dict[str, float] | None = None, **budgets: Unpack[bud.RunBudgets]) -> Run:
        """Open a run; use it as a context manager. `parent_id`: the run is a child of that run
        (a sub-agent in another process; in the same process use `run.child(...)`)."""
        validate_name("agent", agent, AGENT_MAX_CHARS)
        if run_id is not None:
            validate_name("run_id", run_id, RUN_ID_MAX_CHARS)
        if kill_mode not in lc.KILL_MODES:
            raise ValueError(f"kill_mode: expected one of {', '.join(lc.KILL_MODES)}, got {kill_mode!r}")
        if labels is not None and not isinstance(labels, dict):
            raise ValueError(f"labels: expected a dict, got {type(labels).__name__}")
        profile = self.config().profile(agent)
        for key, value in budgets.items():
            if value is None and key in bud.RUN_BUDGET_KEYS:
                continue  # None = the profile's
            err = bud.request_error(key, value, profile, agent)
            if err:
                raise ValueError(err)
        refused = self.refusal(agent, labels)
        if refused is not None:  # before the run exists: no model call is ever made for it
            raise RunKilled(*refused)
        asked: dict[str, Any] = {k: v for k, v in budgets.items() if v is not None}  # checked just above
        ancestors: tuple[str, ...] = ()
        joined = parent_id is None and _parent is None and bool(os.environ.get(ENV_EXEC_RUN))
        if joined:  # inside `agent-watchdog exec`: the run is a child of exec's run
            parent_id = os.environ[ENV_EXEC_RUN]
        if parent_id is not None and _parent is None:
            validate_name("parent_id", parent_id, RUN_ID_MAX_CHARS)
            try:
                ancestors, _pb, _left = obey.from_store(self, parent_id)
            except ValueError as exc:
                if not joined or "no run" not in str(exc):
                    raise
                # exec's run is in another store than this Watchdog's: a run of its own.
                log.warning("agent-watchdog: $%s names run %s, not in this store; this run is not its child",
                            ENV_EXEC_RUN, parent_id[:8])
                parent_id = None
            else:
                hit = obey.exhausted(_left)
                if hit is not None:
                    raise ValueError(f"parent_id: run {parent_id[:8]} has no {hit[0].label} left for a child run")
        if _left:  # a child: its own budgets, never above what its parent has left
            asked = obey.clamp(asked, profile, _left)
        return Run(self, agent=agent, kill_mode=kill_mode, labels=labels, run_id=run_id, budgets=asked,
                   profile=profile, guards=guards, parent=_parent, ancestors=ancestors)

    # -- published settings (prices, profiles) ------------------------------

    def settings(self) -> dict[str, Any]:
        """The raw config the daemon published in the store; {} when none is (or the store is down)."""
        now = time.monotonic()
        if self._settings is None or now - self._settings_at > SETTINGS_TTL_S:
            try:
                rows = self.writer.query(self.writer.sql.select_settings, (CONFIG_KEY,))
                value = self.writer.dialect.parse_json(rows[0][0]) if rows else {}
                self._settings = value if isinstance(value, dict) else {}
            except Exception as exc:  # an unreachable store must not stop the agent
                if self._written or self._misconfigured(exc) is None:  # else the run's start raises it
                    self._note_outage(exc)
                self._settings = self._settings or {}
            self._settings_at = now
        return self._settings

    def config(self) -> Config:
        """What runs are judged by: the profiles and prices a daemon published in the store;
        before any daemon published, the config this process can read ($AGENT_WATCHDOG_CONFIG)
        or else the documented defaults. The guards never wait for a daemon."""
        published = self.settings()
        if published is self._config_src and self._config is not None:
            return self._config  # the hot path: nothing new was read from the store
        self._config_src = published
        if published:
            judged_by = "the profiles the daemon published in the store"
            config = self._local.with_published(published)
        else:
            judged_by = (f"the config {self._local.path} (no daemon has published profiles to this store yet)"
                         if self._local.path else
                         f"the built-in default budgets (no daemon has published profiles to this store yet and "
                         f"${ENV_CONFIG} is not set)")
            config = self._local
        if judged_by != self._judged_by:
            self._judged_by = judged_by
            log.info("agent-watchdog: runs are judged by %s", judged_by)
        self._config = config
        return config

    # The integrations' handler / hooks classes are typed in their modules, which the SDK never
    # imports (they pull in a framework): Any here, so they pass wherever the framework wants them.
    def langchain(self, agent: str, **run_kwargs: Any) -> Any:
        """LangChain callback handler recording and stopping one run: callbacks=[wd.langchain(agent="support-bot")]."""
        return _integration("langchain").handler(self, agent=agent, **run_kwargs)

    def openai_agents(self, agent: str, **run_kwargs: Any) -> Any:
        """OpenAI Agents SDK hooks recording and stopping one run: Runner.run(..., hooks=wd.openai_agents(agent=...))."""
        return _integration("openai_agents").hooks(self, agent=agent, **run_kwargs)

    def circuit_for(self, tool: str) -> CircuitGate | None:
        """The open or half-open circuit of `tool`, or None when it is closed."""
        return self.circuits.get(tool)

    def price_eur(self, model: str | None, tokens_in: int, tokens_out: int, cached_tokens_in: int = 0,
                  reasoning_tokens: int = 0) -> float | None:
        """The step's cost from the published price table, or None when it holds no price for
        the model (the step is then recorded unpriced and the daemon prices it). Never a
        silent 0: only a step of no tokens costs nothing without a price."""
        if tokens_in + tokens_out == 0:
            return 0.0
        price = self.config().prices.get(model or "")
        if price is None:
            return None
        cost = price.cost_eur(tokens_in, tokens_out, cached_tokens_in, reasoning_tokens)
        return cost if cost is not None and math.isfinite(cost) and cost >= 0 else None

    def refusal(self, agent: str, labels: dict[str, str] | None) -> tuple[str, str] | None:
        """(reason, detail) when a spent period budget covers a new run of `agent`, else None.

        Read from the store at every run start (one small row, never cached): a budget the
        daemon closed a moment ago refuses the next run at once, in every process and host.
        The store down: None (the daemon still stops the run within a tick)."""
        try:
            rows = self.writer.query(self.writer.sql.select_settings, (periods.CLOSED_KEY,))
            value = self.writer.dialect.parse_json(rows[0][0]) if rows else None
        except Exception as exc:  # noqa: BLE001 — an unreachable store must not stop the agent
            self._raise_if_misconfigured(exc)
            self._note_outage(exc)
            return None
        return periods.refusal(value, agent, labels, utcnow())

    # -- the write path, with the outage buffer ------------------------------

    def write(self, statements: Statements, *, raise_conflict: bool = False) -> Sequence[Any] | None:
        """Run one transaction; on a store failure buffer it (bounded) and return None.

        A record the store refuses (a constraint or data error) is dropped and
        counted instead: retrying it could never succeed, and buffered ahead of
        every later record it would keep the run from ever seeing a stop.
        With `raise_conflict`, an integrity error (a duplicate key) is raised instead."""
        if self._buffer:  # read without the lock first: a record with nothing buffered (the rule) takes none
            with self._buffer_lock:
                if self._buffer and not self._flush():
                    self._enqueue(statements)
                    return None
        try:
            row: Sequence[Any] | None = self.writer.transaction(statements)
        except Exception as exc:
            self._raise_if_misconfigured(exc)
            if self.lock_timeout_ms is not None and row_locked(exc):
                # A gateway (lock_timeout_ms): a row another session holds is not an outage. Buffered,
                # the record would head the buffer and every later record of every run this process
                # witnesses would wait on that lock first; raised, the gateway refuses that one call.
                raise
            if self.writer.is_rejection(exc):
                if raise_conflict and self.writer.is_conflict(exc):
                    raise
                self._note_rejected(exc)
                return None
            self._note_outage(exc)
            with self._buffer_lock:
                self._enqueue(statements)
            return None
        self._written = True
        return row

    def note_written(self) -> None:
        """A write went through outside `write` (a burst, watchdog.sdk.burst)."""
        self._written = True

    def _enqueue(self, statements: Statements) -> None:
        if len(self._buffer) >= self._buffer_max:
            self.dropped_events += 1
            return
        self._buffer.append(statements)

    def _flush(self) -> bool:
        while self._buffer:
            try:
                self.writer.transaction(self._buffer[0])
            except Exception as exc:
                if not self.writer.is_rejection(exc):
                    self._note_outage(exc)
                    return False
                self._note_rejected(exc)
            else:
                self._written = True
            self._buffer.popleft()
        if self._warned_outage:
            log.warning("agent-watchdog store is reachable again; buffered events written, %d dropped",
                        self.dropped_events)
            self._warned_outage = False
        return True

    def flush(self) -> bool:
        """Write buffered records now; True when nothing is left buffered."""
        with self._buffer_lock:
            return self._flush()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def _misconfigured(self, exc: BaseException) -> str | None:
        return misconfiguration(exc, self.url, role=self.store_role)

    def _raise_if_misconfigured(self, exc: BaseException) -> None:
        """At a run's first contact, a store that answers but cannot be used by this process
        (read-only, unmigrated, wrong credentials) is the developer's to fix now: raised, one
        line with the URL (password masked) and the fix. Once a write went through, the same
        failure is an outage: buffered and warned once, the agent goes on."""
        if self._written:
            return
        msg = self._misconfigured(exc)
        if msg is not None:
            raise StoreMisconfigured(f"agent-watchdog: {msg}") from None

    def _note_outage(self, exc: BaseException) -> None:
        if not self._warned_outage:
            self._warned_outage = True
            first = f"{type(exc).__name__}: {(str(getattr(exc, 'orig', None) or exc).splitlines() or [''])[0][:200]}"
            fix = self._misconfigured(exc)
            if fix is not None:  # reachable, but unusable: say the fix, not "unreachable"
                msg = (f"agent-watchdog: {fix} ({first}); "
                       f"buffering up to {self._buffer_max} records in memory, the agent goes on")
            else:
                msg = (f"agent-watchdog store unreachable ({first}); "
                       f"buffering up to {self._buffer_max} records in memory, the agent goes on")
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=4)

    def _note_rejected(self, exc: BaseException) -> None:
        self.rejected_events += 1
        msg = (f"agent-watchdog store rejected a record ({type(exc).__name__}: "
               f"{(str(exc).splitlines() or [''])[0][:200]}); dropped it, the agent goes on "
               f"({self.rejected_events} rejected so far)")
        log.warning(msg)
        if not self._warned_rejected:
            self._warned_rejected = True
            warnings.warn(msg, RuntimeWarning, stacklevel=4)

    def close(self) -> None:
        self.closed = True  # a run still held in a pause gives up (watchdog.sdk.obey)
        self.flush()
        self.writer.close()
        self.engine.dispose()


def _integration(name: str) -> ModuleType:
    """The integration module `name`, loaded on first use. The integrations are built on the
    SDK, not the reverse: the SDK names them by string only, so it never imports a framework
    (nor, statically, the integrations package)."""
    return importlib.import_module(f"watchdog.integrations.{name}")


def _local_config() -> Config:
    """The config file this agent process can read, if any: a broken one is the developer's
    mistake and says so at once (ConfigError); none at all is the defaults."""
    if not os.environ.get(ENV_CONFIG):
        return Config()
    try:
        return load_config()
    except ConfigError:
        raise
    except OSError as exc:  # pragma: no cover — load() turns these into ConfigError
        raise ConfigError(str(exc)) from None


def _record_args(explicit: object, local: Config) -> bool:
    if explicit is not None:
        if not isinstance(explicit, bool):
            raise ValueError(f"record_args: expected True or False, got {explicit!r}")
        return explicit
    env = os.environ.get(ENV_RECORD_ARGS)
    if env is not None:
        if env.strip().lower() in _TRUE:
            return True
        if env.strip().lower() in _FALSE:
            return False
        raise ValueError(f"${ENV_RECORD_ARGS}: expected 1 or 0 (true / false), got {env!r}")
    return local.store.record_args


def _record_errors(explicit: object, local: Config) -> str:
    if explicit is not None:
        return validate_record_errors(explicit)
    env = os.environ.get(ENV_RECORD_ERRORS)
    if env is not None:
        try:
            return validate_record_errors(env.strip())
        except ValueError as exc:
            raise ValueError(f"${ENV_RECORD_ERRORS}: {exc}") from None
    return local.store.record_errors


def _flush_at_exit(ref: weakref.ref[Watchdog]) -> None:
    wd = ref()
    if wd is not None and wd.buffered:
        try:
            if not wd.flush():
                log.warning("agent-watchdog: %d buffered records could not be written before exit", wd.buffered)
        except Exception:  # noqa: BLE001 — never fail an agent's exit
            pass
