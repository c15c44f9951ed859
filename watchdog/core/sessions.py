"""Which run a coding CLI's session is (pure): the hook and the OTLP logs receiver name it alike.

A session id is the CLI's claim; the Unix user is the kernel's (the hook's own uid; for logs the
loopback sender's socket owner): so another user's session of the same id is another run, and a
session seen by its hooks and by its log events is one run. `generation` counts the runs one
session was split into by silence (an idle session ended `completed` by the daemon).
"""

from __future__ import annotations

import uuid

_NS = uuid.UUID("6f1d3c1e-2b7a-4c55-9a0e-7d1b0c2f9e41")  # names hook runs (uuid5), nothing else
MAX_GENERATIONS = 1000

# The log events' name prefix (their body, and event.name without it), by CLI.
EVENT_PREFIXES = {"claude_code.": "claude-code", "codex.": "codex", "gemini_cli.": "gemini"}


def run_id_for(cli: str, session_id: str, generation: int, uid: int) -> str:
    return uuid.uuid5(_NS, f"{cli}\x00{uid}\x00{session_id}\x00{generation}").hex
