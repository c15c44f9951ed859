"""The MAC a run's attested process puts on its own records (`events.mac`): part of the table contract.

On SQLite every writer of the store can append events to, or rewrite, any run; no row can
prove who wrote it. At attestation the daemon hands the run's process a per-run key (only
that process learns it: over the Unix socket the kernel vouched for), and the process MACs
each record with it. Only records whose MAC verifies can justify a signal (docs/explanation/security.md).

Format `aw-ev/1` (what a plain-SQL writer in any language computes):

    key      = the 32 bytes from the attestation reply's "key" (hex)
    fields   = run id, seq, kind, tool, args_hash, ok, model, tokens_in, tokens_out,
               cached_tokens_in, reasoning_tokens, cost_ueur, attempt, at
    message  = "aw-ev/1" followed by, for each field in that order, "," then
               "~" if the field is NULL, else "<n>:<text>" (n = the UTF-8 byte length of text)
    text     = integers in decimal; ok as "1" / "0"; cost_ueur = round(cost_eur * 1e6) (micro-euros,
               an integer: no float spelling to agree on); strings as written; at = events.at as
               written on SQLite ("YYYY-MM-DD HH:MM:SS.ffffff"), NULL on PostgreSQL (the server's now())
    events.mac = lower-case hex of HMAC-SHA256(key, message)  (64 characters)

Each (run id, seq) counts once: a copy of a record into another run or under another seq does
not verify, a copy under its own seq is the same record. Pure: bytes and values in, hex out.
"""

from __future__ import annotations

import hashlib
import hmac

FORMAT = b"aw-ev/1"
KEY_BYTES = 32
MAC_HEX_CHARS = 64
_BLOCK_BYTES = 64  # SHA-256's

# The record's fields the MAC covers, in order (after run id and seq): what the daemon counts.
FIELDS: tuple[str, ...] = ("kind", "tool", "args_hash", "ok", "model", "tokens_in", "tokens_out",
                           "cached_tokens_in", "reasoning_tokens", "cost_eur", "attempt", "at")


def cost_ueur(cost_eur: float | None) -> int | None:
    """The cost as the MAC spells it: whole micro-euros."""
    return None if cost_eur is None else int(round(float(cost_eur) * 1_000_000))


def _s(v: object) -> str:
    if v is None:
        return ",~"
    t = str.__str__(v)  # TypeError for a non-string; a StrEnum's text
    return f",{len(t) if t.isascii() else len(t.encode('utf-8'))}:{t}"  # ASCII: chars = bytes


def _i(v: object) -> str:
    if v is None:
        return ",~"
    if v.__class__ is not int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"cannot MAC a {type(v).__name__} as an integer")
        v = int(v)
    t = str(v)
    return f",{len(t)}:{t}"


def _b(v: object) -> str:
    if v is None:
        return ",~"
    if v is True:
        return ",1:1"
    if v is False:
        return ",1:0"
    raise TypeError(f"cannot MAC a {type(v).__name__} as a boolean")


def message(run_id: str, seq: int, kind: str, tool: str | None, args_hash: str | None, ok: bool | None,
            model: str | None, tokens_in: int | None, tokens_out: int | None, cached_tokens_in: int | None,
            reasoning_tokens: int | None, cost_eur: float | None, attempt: int | None, at: str | None) -> bytes:
    """The bytes the MAC is computed over (see the module's docstring). One field after the other,
    no loop: this runs on the SDK's hot path, once per record."""
    return "".join((
        "aw-ev/1", _s(run_id), _i(seq), _s(kind), _s(tool), _s(args_hash), _b(ok), _s(model), _i(tokens_in),
        _i(tokens_out), _i(cached_tokens_in), _i(reasoning_tokens),
        _i(None if cost_eur is None else cost_ueur(cost_eur)), _i(attempt), _s(at),
    )).encode("utf-8")


class RecordMac:
    """The per-run key, ready to MAC records: HMAC-SHA256 (RFC 2104) with the key's inner and
    outer pads hashed once, so a record costs two hash copies (under a microsecond) on the SDK's
    hot path instead of a whole HMAC set-up."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes):
        if not isinstance(key, bytes) or len(key) != KEY_BYTES:
            raise ValueError(f"key: expected {KEY_BYTES} bytes")
        block = key.ljust(_BLOCK_BYTES, b"\0")  # a 32-byte key is shorter than SHA-256's block
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def __repr__(self) -> str:  # never the key
        return "RecordMac(...)"

    def mac(self, run_id: str, seq: int, *fields: object) -> str:
        """`fields`: FIELDS' values, in order. Equals hmac.new(key, message(...), sha256).hexdigest()."""
        h = self._inner.copy()
        h.update(message(run_id, seq, *fields))  # type: ignore[arg-type]
        o = self._outer.copy()
        o.update(h.digest())
        return o.hexdigest()

    def ok(self, given: object, run_id: str, seq: int, *fields: object) -> bool:
        if not isinstance(given, str) or len(given) != MAC_HEX_CHARS:
            return False
        try:
            expected = self.mac(run_id, seq, *fields)
        except (TypeError, ValueError, OverflowError):
            return False  # a forged row with a number where text belongs, or the reverse
        return hmac.compare_digest(expected, given)
