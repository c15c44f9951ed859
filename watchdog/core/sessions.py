"""Which run a coding CLI's session is (pure): the hook names it, the OTLP logs receiver finds it.

A session id is the CLI's claim; the Unix user is the kernel's (the hook's own uid): another
user's session of the same id is another run. The id is also keyed by a secret only the hook's
user holds (`key`, watchdog.gateways.hooks.sessionkey): a run id nobody else can compute is a
run nobody else can create first (on PostgreSQL another login's row of that id would be
invisible to the hook under row-level security, and its insert would fail). The logs receiver
never computes it: it finds the run among the active hook runs whose owner is the sender
(watchdog.daemon.otlp.logs). `generation` counts the runs one session was split into by
silence (an idle session ended `completed` by the daemon).
"""

from __future__ import annotations

import hashlib
import hmac

MAX_GENERATIONS = 1000
KEY_BYTES = 32

# The log events' name prefix (their body, and event.name without it), by CLI.
EVENT_PREFIXES = {"claude_code.": "claude-code", "codex.": "codex", "gemini_cli.": "gemini"}


def run_id_for(cli: str, session_id: str, generation: int, uid: int, key: bytes) -> str:
    """32 hex characters: HMAC-SHA256 under the user's secret key (unguessable without it)."""
    msg = f"{cli}\x00{uid}\x00{session_id}\x00{generation}".encode("utf-8", "surrogateescape")
    return hmac.new(key, msg, hashlib.sha256).hexdigest()[:32]
