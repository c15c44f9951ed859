"""Pure helpers for what the SDK records: argument hashes, error fields, validation."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from watchdog.core.scrub import scrub
from watchdog.core.text import one_line, printable

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
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


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
