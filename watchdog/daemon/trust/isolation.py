"""Rows anyone may have written by hand, as the tick judges them: one bad row or event costs
only itself. The chunked, key-by-key reads live in the store (watchdog.store.isolated); what
makes a tool event unusable to the judges is decided here.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from watchdog.store.isolated import CHUNK, Defect, read_isolated

__all__ = ["CHUNK", "Defect", "event_defect", "read_isolated"]


def event_defect(e: Any) -> str | None:
    """What makes a tool event unusable (None: nothing): it must name its run and tool and
    carry a timestamp the rate window can compare."""
    if not isinstance(e.run_id, str):
        return "its run_id is not text"
    if getattr(e, "kind", "tool") != "tool":  # a step (issue 20's fold): only its run and time matter
        return None if isinstance(e.at, dt.datetime) else "its timestamp `at` is missing"
    if not isinstance(e.tool, str) or not e.tool:
        return "its tool is missing (NULL or empty)"
    if not isinstance(e.at, dt.datetime):
        return "its timestamp `at` is missing"
    if e.ok not in (True, False, None, 0, 1):
        return "its `ok` is not a boolean"
    for name in ("args_hash", "error_msg"):
        if getattr(e, name) is not None and not isinstance(getattr(e, name), str):
            return f"its {name} is not text"
    if e.attempt is not None and (isinstance(e.attempt, bool) or not isinstance(e.attempt, int)):
        return "its attempt is not an integer"
    return None
