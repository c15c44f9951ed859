"""The daemon's own record of who sent a span-only run, and the key its pinned sender's spans are MAC'd with.

A run the receiver starts is booked under its sender (a token's owner, or `uid N` for an
anonymous sender), never under the agent name the spans claim. The row cannot say so: on
PostgreSQL the database sets `runs.owner` to the daemon's login, and on SQLite any writer can
rewrite it. So the receiver writes the run's attestation itself (only the daemon may, on
PostgreSQL), sealed with its key, with the sender in its evidence record (sealed too):

- a run whose sender the kernel confirmed (`[otlp] kill_mode = "process"`): the pinned process
  (pid + create time, uid) and, as an SDK's attestation has, a nonce for the run's evidence key:
  the receiver MACs every event it writes for the run with it, so that the signal check
  (watchdog.daemon.trust.authentic) counts only what the daemon itself received from that sender;
- any other run: pid 0 (no process: nothing to signal, the ladder's identity check refuses it),
  the socket owner's uid (-1 when not local), kill mode cooperative.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from watchdog.core import lifecycle as lc
from watchdog.core.evidence_mac import RecordMac
from watchdog.core.rowviews import AttestationView
from watchdog.core.seal import Sealer
from watchdog.daemon.otlp.sender import Pinned
from watchdog.daemon.trust.authentic import new_evidence, parse_evidence, run_key
from watchdog.store import attestations as evstore
from watchdog.store.attestations import Attestation, replace as replace_attestation
from watchdog.store.engine import Connection
from watchdog.store.witness import MacFn, WitnessedCall

NO_UID = -1


def record(conn: Connection, sealer: Sealer, *, run_id: str, host: str, name: str, anonymous: bool,
           uid: int | None, pinned: Pinned | None, now: dt.datetime) -> RecordMac | None:
    """Write the run's sealed attestation with its sender; the MAC for its events when pinned."""
    if pinned is not None:
        pid, create_time, uid, kill_mode = pinned.pid, pinned.create_time, pinned.uid, lc.PROCESS
    else:
        pid, create_time, uid, kill_mode = 0, 0.0, NO_UID if uid is None else uid, lc.COOPERATIVE
    mac = sealer.identity(run_id, host, pid, create_time, uid, kill_mode)
    replace_attestation(conn, Attestation(run_id, host, pid, create_time, uid, kill_mode, now, mac))
    evidence: dict[str, Any] = json.loads(new_evidence(sealer, run_id, {}, now)) if pinned is not None else {"v": 1}
    evidence.update(sender=name, anonymous=anonymous, sender_mac=sealer.sender(run_id, name, anonymous))
    text = json.dumps(evidence)
    evstore.save_evidence(conn, run_id, text)
    if pinned is None:
        return None
    sealed = parse_evidence(sealer, run_id, text)
    return None if sealed is None else RecordMac(run_key(sealer, run_id, sealed))


@dataclass(frozen=True)
class Recorded:
    """What the receiver recorded (sealed) of a run it started."""

    name: str
    anonymous: bool
    uid: int | None  # the socket's owner (None: not a local socket)
    pinned: tuple[RecordMac, int, float] | None  # its events' MAC, the pinned pid + create time


def _verified(conn: Connection, sealer: Sealer | None, run_id: str) -> tuple[AttestationView, dict[str, Any]] | None:
    if sealer is None:
        return None
    a: AttestationView | None = evstore.load_evidence(conn, run_id)  # (a store Row, typed Any there)
    if a is None or not sealer.identity_ok(a.mac, a.run_id, a.host, a.pid, a.pid_create_time, a.uid, a.kill_mode,
                                           a.cgroup):
        return None
    try:
        d = json.loads(a.evidence) if isinstance(a.evidence, str) else None
    except ValueError:
        return None
    if not isinstance(d, dict) or not sealer.sender_ok(d.get("sender_mac"), run_id, d.get("sender"),
                                                       d.get("anonymous")):
        return None
    return a, d


def sender_of(conn: Connection, sealer: Sealer | None, run_id: str) -> tuple[str, bool] | None:
    """(who sent the run's spans, whether anonymously), if the receiver recorded it (sealed)."""
    found = _verified(conn, sealer, run_id)
    return None if found is None else (str(found[1]["sender"]), bool(found[1]["anonymous"]))


def recorded(conn: Connection, sealer: Sealer | None, run_id: str) -> Recorded | None:
    """The receiver's sealed record of a run it started (read back after a restart)."""
    found = _verified(conn, sealer, run_id)
    if found is None or sealer is None:
        return None
    a, d = found
    pinned = None
    if a.kill_mode == lc.PROCESS:
        sealed = parse_evidence(sealer, run_id, a.evidence)
        if sealed is not None:
            pinned = RecordMac(run_key(sealer, run_id, sealed)), int(a.pid), float(a.pid_create_time)
    return Recorded(str(d["sender"]), bool(d["anonymous"]), None if a.uid == NO_UID else int(a.uid), pinned)


def event_mac(mac: RecordMac, run_id: str) -> MacFn:
    """The witness.append MAC function of a pinned run's events (the fields a step or tool call
    written by the receiver has: no reasoning tokens, no attempt, a token-less step's cost 0)."""

    def of(seq: int, c: WitnessedCall, at_text: str | None) -> str:
        cost = 0.0 if c.kind == lc.EV_STEP and not (c.tokens_in or c.tokens_out) else None
        return mac.mac(run_id, seq, c.kind, c.tool, c.args_hash, c.ok, c.model, c.tokens_in, c.tokens_out,
                       c.cached_tokens_in, None, cost, None, at_text)

    return of
