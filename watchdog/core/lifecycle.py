"""The run lifecycle vocabulary: statuses, stop reasons, kill modes.

These strings are public: they are stored in the table contract, printed by the
CLI and matched by scripts, so they never change spelling.
"""

# Run statuses. `running` and `stopping` are the active ones the daemon scans.
RUNNING = "running"
STOPPING = "stopping"
COMPLETED = "completed"
FAILED = "failed"
KILLED = "killed"
LOST = "lost"

ACTIVE_STATUSES = (RUNNING, STOPPING)
END_STATUSES = (COMPLETED, FAILED, KILLED, LOST)
STATUSES = ACTIVE_STATUSES + END_STATUSES

# Stop reasons: data, never a boolean.
WALL_CLOCK = "wall_clock"
MAX_STEPS = "max_steps"
MAX_TOOL_CALLS = "max_tool_calls"
MAX_COST = "max_cost"
LOOP_DETECTED = "loop_detected"
HEARTBEAT_TIMEOUT = "heartbeat_timeout"
TOOL_RATE = "tool_rate"
PROCESS_GONE = "process_gone"
MANUAL = "manual"

STOP_REASONS = (
    WALL_CLOCK,
    MAX_STEPS,
    MAX_TOOL_CALLS,
    MAX_COST,
    LOOP_DETECTED,
    HEARTBEAT_TIMEOUT,
    TOOL_RATE,
    PROCESS_GONE,
    MANUAL,
)

# Kill modes: what the run owns.
COOPERATIVE = "cooperative"  # shares its process: cancel the run, never signal
PROCESS = "process"  # owns its process: SIGTERM / SIGKILL the process and its children
TREE = "tree"  # owns its process group: signal the whole group
KILL_MODES = (COOPERATIVE, PROCESS, TREE)

# Event kinds written by the SDK.
EV_STEP = "step"
EV_TOOL = "tool"
EV_HEARTBEAT = "heartbeat"
EVENT_KINDS = (EV_STEP, EV_TOOL, EV_HEARTBEAT)
