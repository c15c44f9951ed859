"""Pure helpers for what the SDK records: argument hashes, error fields, validation."""

from __future__ import annotations

import hashlib
import json
import math

ERROR_MSG_MAX_CHARS = 200
# Column widths of the table contract (watchdog.store): longer values are refused
# up front with a ValueError, never sent to a store that would reject the record.
AGENT_MAX_CHARS = 128
RUN_ID_MAX_CHARS = 32
TOOL_MAX_CHARS = 128
MODEL_MAX_CHARS = 128
ERROR_CLASS_MAX_CHARS = 128


# Built once: json.dumps with options builds a new encoder on every call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(args) -> str:
    """Sorted keys, no whitespace: the same arguments always give the same text."""
    return _CANONICAL.encode(args)


def hash_args(args, *, tool: str = "?") -> str:
    """sha256 of the canonical JSON of the arguments. Raw arguments are not stored by default."""
    try:
        text = canonical_json(args)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"args of tool {tool!r}: expected JSON-serialisable values ({exc})") from None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def error_fields(error) -> tuple[str | None, str | None]:
    """(error class, short one-line message) from an exception or a string."""
    if error is None or error is False:
        return None, None
    if isinstance(error, BaseException):
        cls, msg = type(error).__name__[:ERROR_CLASS_MAX_CHARS], str(error)
    else:
        cls, msg = "Error", str(error)
    msg = " ".join(msg.split())
    if len(msg) > ERROR_MSG_MAX_CHARS:
        msg = msg[: ERROR_MSG_MAX_CHARS - 1] + "…"
    return cls, msg


def validate_name(name: str, value, max_chars: int) -> str:
    """A non-empty string that fits its column."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}: expected a non-empty string, got {value!r}")
    if len(value) > max_chars:
        raise ValueError(f"{name}: expected at most {max_chars} characters, got {len(value)}")
    return value


def validate_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
    return value


def validate_tokens(tokens_in, tokens_out) -> tuple[int, int]:
    return validate_count("tokens_in", tokens_in), validate_count("tokens_out", tokens_out)


def validate_amount(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: expected a number >= 0, got {value!r}")
    return float(value)
