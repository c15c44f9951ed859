"""The run's vocabulary: statuses, stop reasons, kill modes, ladder stages, circuit states, and what a record may
hold.

The run lifecycle vocabulary: statuses, stop reasons, kill modes, ladder stages, circuit states.

These strings are public: they are stored in the table contract, printed by the
CLI and matched by scripts, so they never change spelling. Each is a `StrEnum`
(a member *is* its string: it binds to SQL and compares with what a row holds),
and each state machine has its transition table here, so code asks the table
(`can_move`) instead of repeating which stage may follow which.

Imports nothing: every side of the process boundary uses it.

Pure helpers for what the SDK records: argument hashes, error fields, validation.
"""

from __future__ import annotations

import hashlib
import json
import math
from enum import StrEnum
from typing import Any, Mapping

from watchdog.core.text import scrub, one_line, printable


class Status(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"  # on_breach = "pause": held at its next record until resume, kill or approval_timeout_s
    STOPPING = "stopping"  # the daemon (or a guard) asked; the SDK sees it on the run's next write
    COMPLETED = "completed"
    FAILED = "failed"
    KILLED = "killed"
    LOST = "lost"  # the process is gone without ending the run


class StopReason(StrEnum):
    WALL_CLOCK = "wall_clock"
    MAX_STEPS = "max_steps"
    MAX_TOOL_CALLS = "max_tool_calls"
    MAX_COST = "max_cost"
    MAX_TOKENS = "max_tokens"
    DAILY_BUDGET = "daily_budget"
    MONTHLY_BUDGET = "monthly_budget"
    LOOP_DETECTED = "loop_detected"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    TOOL_RATE = "tool_rate"
    PROCESS_GONE = "process_gone"
    MANUAL = "manual"


class KillMode(StrEnum):
    COOPERATIVE = "cooperative"  # shares its process: cancel the run, never signal
    PROCESS = "process"  # owns its process: SIGTERM / SIGKILL the process and its children
    TREE = "tree"  # owns its process group: signal the whole group
    CGROUP = "cgroup"  # the run's own cgroup v2, made by `agent-watchdog exec`: every process in it


class Source(StrEnum):
    """Which witness created a run (`runs.source`) or saw an event (`events.source`)."""

    SDK = "sdk"  # the Python SDK inside the agent's process
    EXEC = "exec"  # agent-watchdog exec, the supervisor of the command's process tree
    OTLP = "otlp"  # spans received by the daemon's OTLP receiver
    LITELLM = "litellm"  # the LiteLLM proxy callback (LLM gateway)
    MCP = "mcp"  # agent-watchdog mcp-proxy (tool gateway)
    HOOK = "hook"  # agent-watchdog hook: a coding CLI's tool-call hooks (Claude Code, Codex, Gemini)
    SQL = "sql"  # a plain-SQL writer that did not say (the column's server default)


class EventKind(StrEnum):
    STEP = "step"
    TOOL = "tool"
    HEARTBEAT = "heartbeat"


class Stage(StrEnum):
    """Where the stop ladder of a `stopping` run is (`runs.signal_stage`; NULL = cooperative stop only)."""

    TERM = "term"  # SIGTERM sent, waiting term_grace_s
    KILL = "kill"  # SIGKILL sent, waiting for the process to go
    REFUSED = "refused"  # the killer refused to signal (identity, user, not attested): waits for the process
    NOT_SIGNALLED = "not_signalled"  # cooperative run that did not stop: never signalled
    FAILED = "failed"  # still alive after SIGKILL (uninterruptible)
    DONE = "done"  # the run is killed


class Circuit(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# --- named groups ---------------------------------------------------------------

ACTIVE_STATUSES = (Status.RUNNING, Status.PAUSED, Status.STOPPING)
# A stop can be requested of these (a paused run is stopped by `kill` or its approval timeout).
STOPPABLE_STATUSES = (Status.RUNNING, Status.PAUSED)
END_STATUSES = (Status.COMPLETED, Status.FAILED, Status.KILLED, Status.LOST)
STATUSES = tuple(Status)
STOP_REASONS = tuple(StopReason)
KILL_MODES = tuple(KillMode)
SOURCES = tuple(Source)
EVENT_KINDS = tuple(EventKind)
CIRCUIT_STATES = tuple(Circuit)

# --- transitions: every move is listed; anything else is a bug -----------------

STATUS_MOVES: dict[Status, frozenset[Status]] = {
    Status.RUNNING: frozenset({Status.PAUSED, Status.STOPPING, Status.COMPLETED, Status.FAILED, Status.KILLED,
                               Status.LOST}),
    # resume → running; kill or approval timeout → stopping; it may also end while held (another
    # thread of the agent leaves the run, the process dies).
    Status.PAUSED: frozenset({Status.RUNNING, Status.STOPPING, Status.COMPLETED, Status.FAILED, Status.KILLED,
                              Status.LOST}),
    Status.STOPPING: frozenset({Status.KILLED, Status.COMPLETED, Status.FAILED, Status.LOST}),
    Status.COMPLETED: frozenset(),
    Status.FAILED: frozenset(),
    Status.KILLED: frozenset(),
    Status.LOST: frozenset(),
}

# None is the stage of a run whose cooperative stop was just requested.
STAGE_MOVES: dict[Stage | None, frozenset[Stage]] = {
    None: frozenset({Stage.TERM, Stage.REFUSED, Stage.NOT_SIGNALLED, Stage.DONE}),
    # TERM -> FAILED: the attestation stopped verifying after the SIGTERM: no SIGKILL on its word.
    Stage.TERM: frozenset({Stage.KILL, Stage.FAILED, Stage.DONE}),
    Stage.KILL: frozenset({Stage.FAILED, Stage.DONE}),
    # REFUSED -> TERM: the operator's sealed `kill` drove the stop again (watchdog.daemon.stops.redrive).
    Stage.REFUSED: frozenset({Stage.TERM, Stage.DONE}),
    Stage.NOT_SIGNALLED: frozenset({Stage.DONE}),
    Stage.FAILED: frozenset({Stage.DONE}),
    Stage.DONE: frozenset(),
}

CIRCUIT_MOVES: dict[Circuit, frozenset[Circuit]] = {
    Circuit.CLOSED: frozenset({Circuit.OPEN}),
    Circuit.OPEN: frozenset({Circuit.HALF_OPEN, Circuit.CLOSED}),  # closed: by hand
    Circuit.HALF_OPEN: frozenset({Circuit.CLOSED, Circuit.OPEN}),
}

# Stages where the ladder has nothing more to send: the run waits for its process to go.
WAITING_STAGES = (Stage.REFUSED, Stage.NOT_SIGNALLED, Stage.FAILED)
# Stages where the ladder still acts (a signal to send or to confirm).
ACTING_STAGES = tuple(s for s, moves in STAGE_MOVES.items() if s not in WAITING_STAGES and moves)


def can_move(table: Mapping[Any, frozenset[Any]], current: str | None, new: str) -> bool:
    """True when `table` lists current → new. A StrEnum member hashes and compares as its
    string, so the plain strings a row holds look up as well as the members."""
    return new in table.get(current, ())


class IllegalMove(AssertionError):
    """A state move its transition table does not list: a bug in the code that asked for it,
    never a condition of the data (an AssertionError, so no caller treats it as an outcome; in the
    tick, the per-run isolation quarantines that one run and the backstop still watches it)."""

    table_name = "a transition table"

    def __init__(self, current: str | None, new: str) -> None:
        super().__init__(f"{current} -> {new} is not a transition of lifecycle.{self.table_name}")
        self.current, self.new = current, new


class IllegalStageMove(IllegalMove):
    table_name = "STAGE_MOVES"


class IllegalCircuitMove(IllegalMove):
    table_name = "CIRCUIT_MOVES"


class IllegalStatusMove(IllegalMove):
    table_name = "STATUS_MOVES"


def check_stage_move(current: str | None, new: str) -> None:
    """Raise IllegalStageMove unless STAGE_MOVES lists current -> new."""
    if not can_move(STAGE_MOVES, current, new):
        raise IllegalStageMove(current, new)


def check_status_move(current: str | None, new: str) -> None:
    """Raise IllegalStatusMove unless STATUS_MOVES lists current -> new."""
    if not can_move(STATUS_MOVES, current, new):
        raise IllegalStatusMove(current, new)


def check_circuit_move(current: str | None, new: str) -> None:
    """Raise IllegalCircuitMove unless CIRCUIT_MOVES lists current -> new. None is a tool with
    no circuit row yet: it moves as a closed one."""
    if not can_move(CIRCUIT_MOVES, Circuit.CLOSED if current is None else current, new):
        raise IllegalCircuitMove(current, new)


# --- the names the rest of the code has always used -----------------------------

RUNNING, PAUSED, STOPPING = Status.RUNNING, Status.PAUSED, Status.STOPPING
COMPLETED, FAILED, KILLED, LOST = Status.COMPLETED, Status.FAILED, Status.KILLED, Status.LOST
WALL_CLOCK, MAX_STEPS, MAX_TOOL_CALLS, MAX_COST = (StopReason.WALL_CLOCK, StopReason.MAX_STEPS,
                                                   StopReason.MAX_TOOL_CALLS, StopReason.MAX_COST)
MAX_TOKENS, DAILY_BUDGET, MONTHLY_BUDGET = StopReason.MAX_TOKENS, StopReason.DAILY_BUDGET, StopReason.MONTHLY_BUDGET
LOOP_DETECTED, HEARTBEAT_TIMEOUT, TOOL_RATE = (StopReason.LOOP_DETECTED, StopReason.HEARTBEAT_TIMEOUT,
                                               StopReason.TOOL_RATE)
PROCESS_GONE, MANUAL = StopReason.PROCESS_GONE, StopReason.MANUAL
COOPERATIVE, PROCESS, TREE, CGROUP = KillMode.COOPERATIVE, KillMode.PROCESS, KillMode.TREE, KillMode.CGROUP
EV_STEP, EV_TOOL, EV_HEARTBEAT = EventKind.STEP, EventKind.TOOL, EventKind.HEARTBEAT


# -- Pure helpers for what the SDK records: argument hashes, error fields, validation ------------------------------

ERROR_MSG_MAX_CHARS = 200
SCRUB_MAX_CHARS = 20_000  # of a raw message, what is scrubbed (then cut to ERROR_MSG_MAX_CHARS)
# What of a tool's error is recorded (`record_errors`, the agent's own choice):
# the message with its secrets scrubbed out, or the exception's class alone.
RECORD_ERRORS_CHOICES = ("scrubbed", "class")
# Column widths of the table contract (watchdog.store): longer values are refused
# up front with a ValueError, never sent to a store that would reject the record.
AGENT_MAX_CHARS = 128
RUN_ID_MAX_CHARS = 32
TOOL_MAX_CHARS = 128
MODEL_MAX_CHARS = 128
ERROR_CLASS_MAX_CHARS = 128


# Built once: json.dumps with options builds a new encoder on every call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# The same C encoder, made once instead of on every call (JSONEncoder.encode builds one each
# time), without the circular-reference bookkeeping: a circular value then overflows the
# recursion limit, and canonical_json falls back to _CANONICAL to raise its ValueError.
_C_MAKE_ENCODER = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODE_STR = getattr(json.encoder, "c_encode_basestring", None)
_FAST_CANONICAL = (
    _C_MAKE_ENCODER(None, _CANONICAL.default, _C_ENCODE_STR, None, _CANONICAL.key_separator,
                    _CANONICAL.item_separator, True, False, False)
    if _C_MAKE_ENCODER is not None and _C_ENCODE_STR is not None else None
)


def canonical_json(args: Any) -> str:
    """Sorted keys, no whitespace: the same arguments always give the same text."""
    if _FAST_CANONICAL is not None:
        try:
            return "".join(_FAST_CANONICAL(args, 0))
        except RecursionError:
            pass  # circular (or absurdly deep): the checking encoder says so
    return _CANONICAL.encode(args)


def hash_args(args: Any, *, tool: str = "?") -> str:
    """sha256 of the canonical JSON of the arguments. Raw arguments are not stored by default."""
    try:
        text = canonical_json(args)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"args of tool {tool!r}: expected JSON-serialisable values ({exc})") from None
    # surrogatepass: JSON's lone surrogates ("\\ud800") hash too, never an error that lets a call through
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def error_fields(error: object, record_errors: str = "scrubbed") -> tuple[str | None, str | None]:
    """(error class, short one-line message) from an exception or a string.

    The one place an error is shaped for the store: the message is scrubbed of
    secrets (URL credentials and queries, tokens, keys, card numbers) before it
    is cut, so nothing after this sees the raw text; with record_errors =
    "class" there is no message at all."""
    if error is None or error is False:
        return None, None
    if isinstance(error, BaseException):
        cls, msg = type(error).__name__[:ERROR_CLASS_MAX_CHARS], str(error)
    else:
        cls, msg = "Error", str(error)
    if record_errors == "class":
        return cls, None
    # Scrubbed, then cut: a cut first could leave half a token the scrubber no longer recognises.
    # A huge message is first bounded at a word boundary (the scrub is linear, but not free).
    msg = " ".join(msg[:SCRUB_MAX_CHARS * 2].split())
    if len(msg) > SCRUB_MAX_CHARS:
        head, _, tail = msg[:SCRUB_MAX_CHARS].rpartition(" ")
        # A short word cut in two may be half a key the scrubber no longer recognises: drop it.
        msg = head if head and len(tail) < 256 else msg[:SCRUB_MAX_CHARS]
    msg = scrub(msg)
    if len(msg) > ERROR_MSG_MAX_CHARS:
        msg = msg[: ERROR_MSG_MAX_CHARS - 1] + "…"
    return cls, msg


def validate_record_errors(value: object) -> str:
    if not isinstance(value, str) or value not in RECORD_ERRORS_CHOICES:
        raise ValueError(f"record_errors: expected one of {', '.join(map(repr, RECORD_ERRORS_CHOICES))}, got {value!r}")
    return value


def validate_name(name: str, value: object, max_chars: int) -> str:
    """A non-empty string that fits its column."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}: expected a non-empty string, got {one_line(value, 60)}")
    if len(value) > max_chars:
        raise ValueError(f"{name}: expected at most {max_chars} characters, got {len(value)}")
    if not printable(value):
        raise ValueError(f"{name}: expected printable text on one line (no control, line-break or bidi "
                         f"characters), got {ascii(value)[:80]}")
    return value


# What one record may carry: the store's event columns are 32-bit, and its checks refuse
# amounts past MAX_AMOUNT (migration 0007). Refused here, with the fix, rather than dropped there.
MAX_COUNT = 2**31 - 1
MAX_AMOUNT = 1e15


def validate_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{name}: expected an integer from 0 to {MAX_COUNT}, got {one_line(value, 40)}")
    return value


def validate_tokens(tokens_in: object, tokens_out: object) -> tuple[int, int]:
    return validate_count("tokens_in", tokens_in), validate_count("tokens_out", tokens_out)


def validate_amount(name: str, value: object) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 <= value < MAX_AMOUNT):
        raise ValueError(f"{name}: expected a number from 0 to {MAX_AMOUNT:.0e}, got {one_line(value, 40)}")
    return float(value)
