"""The run lifecycle vocabulary: statuses, stop reasons, kill modes, ladder stages, circuit states.

These strings are public: they are stored in the table contract, printed by the
CLI and matched by scripts, so they never change spelling. Each is a `StrEnum`
(a member *is* its string: it binds to SQL and compares with what a row holds),
and each state machine has its transition table here, so code asks the table
(`can_move`) instead of repeating which stage may follow which.

Imports nothing: every side of the process boundary uses it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Mapping


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
