"""HMAC seals: what only the daemon can write, checked wherever it is read back.

The store is writable by every agent (on SQLite by anyone in its group), so no
row is trusted with a privilege on its own word. The daemon seals, with
HMAC-SHA256 under a key only it can read, the three things that carry one:

- an attested process identity (run id, host, pid, create time, uid, kill mode, and
  exec's cgroup for the run): the only identities (and cgroups) the killer may signal;
- the targets a SIGTERM reached (run id + their identities): the only processes
  the SIGKILL that follows may be sent to beyond what it enumerates itself;
- an alert (dedupe key, title, body): the outbox delivers nothing else.

Pure: bytes and values in, hex out. Every field goes into the message with its
length, so no two different tuples can spell the same message.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import datetime as dt

# What a seal covers: texts and numbers (_canon refuses anything else). The *_ok checks take the
# values a row holds: a genuine row the types the seal took, a forged one anything (False, never raised).
Field = str | int | float

KEY_MIN_BYTES = 32


class Sealer:
    """`host`: whose daemon holds the key (alerts say which daemon sealed them)."""

    def __init__(self, key: bytes, host: str = ""):
        if not isinstance(key, bytes) or len(key) < KEY_MIN_BYTES:
            raise ValueError(f"key: expected at least {KEY_MIN_BYTES} bytes")
        self._key = key
        self.host = host

    def __repr__(self) -> str:  # never the key
        return f"Sealer(host={self.host!r})"

    def _mac(self, kind: str, *fields: Field) -> str:
        h = hmac.new(self._key, digestmod=hashlib.sha256)
        for f in (kind, *fields):
            b = _canon(f).encode("utf-8")
            h.update(len(b).to_bytes(4, "big"))
            h.update(b)
        return h.hexdigest()

    @staticmethod
    def _ok(expected: str, given: object) -> bool:
        return isinstance(given, str) and hmac.compare_digest(expected, given)

    # -- attested identity -------------------------------------------------------

    def identity(self, run_id: str, host: str, pid: int, create_time: float, uid: int, kill_mode: str,
                 cgroup: str | None = None) -> str:
        """`cgroup`: the run's own cgroup exec made (sealed with the identity: a row cannot move it)."""
        if cgroup is None:
            return self._mac("identity/1", run_id, host, int(pid), float(create_time), int(uid), kill_mode)
        return self._mac("identity/2", run_id, host, int(pid), float(create_time), int(uid), kill_mode, cgroup)

    def identity_ok(self, mac: object, run_id: str, host: str, pid: int, create_time: float, uid: int,
                    kill_mode: str, cgroup: str | None = None) -> bool:
        try:
            expected = self.identity(run_id, host, pid, create_time, uid, kill_mode, cgroup)
        except (TypeError, ValueError):
            return False  # a forged row with a non-number where a number belongs
        return self._ok(expected, mac)

    # -- the per-run evidence key (watchdog.core.evidence_mac) --------------------------

    def run_key(self, run_id: str, nonce: str) -> bytes:
        """The key the attested process of `run_id` MACs its records with: derived, never stored,
        so a restarted daemon verifies with the same key from the attestation's nonce."""
        return bytes.fromhex(self._mac("run-key/1", run_id, nonce))

    def evidence(self, run_id: str, nonce: str, attested_at: str, budgets: str) -> str:
        """The seal over what the daemon recorded at attestation besides the identity: the nonce
        of the run's key, when it attested (the wall clock of a signal runs from there) and the
        budgets the run registered with (JSON), so no writer can lower them afterwards."""
        return self._mac("evidence/1", run_id, nonce, attested_at, budgets)

    def evidence_ok(self, mac: object, run_id: str, nonce: str, attested_at: str, budgets: str) -> bool:
        try:
            return self._ok(self.evidence(run_id, nonce, attested_at, budgets), mac)
        except (TypeError, ValueError):
            return False

    # -- the OTLP receiver's senders (watchdog.daemon.otlp.auth) -----------------------------

    def otlp_token(self, run_id: str) -> str:
        """The bearer token of one run (handed to its attested process, e.g. exec's command):
        derived, never stored; it lets its holder report spans for that run only."""
        return f"aw1.{run_id}.{self._mac('otlp-token/1', run_id)}"

    def otlp_token_ok(self, token: str) -> str | None:
        """The run id a token of `otlp_token` names, if it is this daemon's; else None."""
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != "aw1" or not 0 < len(parts[1]) <= 32:
            return None
        return parts[1] if self._ok(self._mac("otlp-token/1", parts[1]), parts[2]) else None

    def sender(self, run_id: str, identity: str, anonymous: bool) -> str:
        """Who sent the spans the receiver started run `run_id` for (a token's owner, or the
        socket owner of an anonymous sender): what the run is booked under."""
        return self._mac("sender/1", run_id, identity, "anonymous" if anonymous else "token")

    def sender_ok(self, mac: object, run_id: str, identity: object, anonymous: object) -> bool:
        if not isinstance(identity, str) or not isinstance(anonymous, bool):
            return False
        return self._ok(self.sender(run_id, identity, anonymous), mac)

    # -- what a SIGTERM reached ----------------------------------------------------

    def targets(self, run_id: str, targets: Iterable[tuple[str, int, float, int]]) -> str:
        """(host, pid, create time, uid or -1) of each process."""
        flat = [x for host, pid, ct, uid in sorted(targets, key=lambda t: (t[0], int(t[1])))
                for x in (host, int(pid), float(ct), int(uid))]
        return self._mac("targets/1", run_id, len(flat), *flat)

    def targets_ok(self, mac: object, run_id: str, targets: Iterable[tuple[str, int, float, int]]) -> bool:
        try:
            expected = self.targets(run_id, targets)
        except (TypeError, ValueError, IndexError):  # a forged row's odd shapes
            return False
        return self._ok(expected, mac)

    # -- alerts ----------------------------------------------------------------------

    def alert(self, dedupe_key: str, title: str, body: str, created_at: dt.datetime | None = None) -> str:
        """The seal of an alert; with `created_at` (every alert the outbox queues) its age is
        sealed too, so a delivered alert cannot be made new again (and sent again) by hand."""
        if created_at is None:
            return self._mac("alert/1", dedupe_key, title, body)
        return self._mac("alert/2", dedupe_key, title, body, _instant(created_at))

    def alert_ok(self, mac: object, dedupe_key: str, title: str, body: str,
                 created_at: dt.datetime | None = None) -> bool:
        """A row sealed before the age was (alert/1) still verifies: it expires (alert_expire_s)
        like any other, and retention removes it."""
        try:
            if created_at is not None and self._ok(self.alert(dedupe_key, title, body, created_at), mac):
                return True
            return self._ok(self.alert(dedupe_key, title, body), mac)
        except (TypeError, ValueError, AttributeError):
            return False


    # -- a resume that raised budgets (issue 20) --------------------------------------------

    def grant(self, run_id: str, resumes: int, budgets: Iterable[float | None]) -> str:
        """An operator's `resume`: the run's `resumes`-th, and the budget columns it left (None
        spelled "-"). Only a resume sealed so lets a run's budgets stand above its profile."""
        return self._mac("grant/1", run_id, int(resumes), *("-" if b is None else float(b) for b in budgets))

    def grant_ok(self, mac: object, run_id: str, resumes: int, budgets: Iterable[float | None]) -> bool:
        try:
            return self._ok(self.grant(run_id, resumes, list(budgets)), mac)
        except (TypeError, ValueError):
            return False


def _instant(t: object) -> str:
    """One text per instant, whatever the database gives back (aware UTC, microseconds)."""
    import datetime as dt

    if not isinstance(t, dt.datetime):
        raise TypeError(f"cannot seal a {type(t).__name__} as a time")
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.astimezone(dt.timezone.utc).isoformat(timespec="microseconds")


def _canon(value: object) -> str:
    if isinstance(value, bool) or value is None:
        raise TypeError(f"cannot seal {value!r}")
    if isinstance(value, float):
        return repr(value)  # the shortest text that round-trips: the same float, the same text
    if isinstance(value, (int, str)):
        return str(value)
    raise TypeError(f"cannot seal a {type(value).__name__}")
