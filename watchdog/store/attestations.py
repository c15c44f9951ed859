"""Rows of `attestations`: a run's attested identity and its sealed evidence, and the MAC'd events that evidence
is checked against.

Rows of `attestations`: the process identities a daemon attested, with their seal.

Only the daemon writes here (on PostgreSQL the agents' role cannot, see
`sql/roles.sql`); on SQLite anyone in the store's group can, which is why every
row carries a MAC the daemon checks before it believes a word of it.

The SQL behind a run's own evidence: the sealed record of its key, and its MAC'd records.

The daemon writes `attestations.evidence` (JSON, sealed: watchdog.daemon.trust.authentic) next to
the identity it attested; it reads back a run's events that carry a MAC to count only those
the run's attested process wrote (watchdog.core.evidence_mac). Both only at attestation and
before a first signal: never on the tick's hot path.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Sequence

from sqlalchemy import delete, insert, select, String, and_, type_coerce, update
from sqlalchemy.engine import Connection

from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.store.schema import attestations, runs, events


@dataclass(frozen=True)
class Attestation:
    run_id: str
    host: str
    pid: int
    pid_create_time: float
    uid: int
    kill_mode: str
    attested_at: dt.datetime
    mac: str
    cgroup: str | None = None  # exec's cgroup for the run (kill_mode cgroup), sealed in `mac`


def load(conn: Connection, run_id: str) -> Attestation | None:
    r = conn.execute(select(attestations).where(attestations.c.run_id == run_id)).first()
    if r is None:
        return None
    return Attestation(r.run_id, r.host, r.pid, r.pid_create_time, r.uid, r.kill_mode, r.attested_at, r.mac,
                       r.cgroup)


@dataclass(frozen=True)
class RegisteredRun:
    """What a run's row registers that an attestation is checked against (as stored: any
    writer of the row chose it), and the budgets it asked for when attested."""

    id: str
    host: Any
    pid: Any
    pid_create_time: Any
    kill_mode: Any
    status: Any
    budgets: dict[str, Any]


def registered(conn: Connection, run_id: str) -> RegisteredRun | None:
    """The run's registered identity and budgets; None: no such run."""
    r = conn.execute(select(runs.c.id, runs.c.host, runs.c.pid, runs.c.pid_create_time, runs.c.kill_mode,
                            runs.c.status, *(runs.c[k] for k in RUN_BUDGET_KEYS))
                     .where(runs.c.id == run_id)).first()
    if r is None:
        return None
    return RegisteredRun(r.id, r.host, r.pid, r.pid_create_time, r.kill_mode, r.status,
                         {k: v for k, v in zip(RUN_BUDGET_KEYS, r[6:])})


def replace(conn: Connection, a: Attestation) -> None:
    """Write `a` as the run's one attestation (whatever row was there: it may be forged)."""
    conn.execute(delete(attestations).where(attestations.c.run_id == a.run_id))
    conn.execute(insert(attestations).values(
        run_id=a.run_id, host=a.host, pid=a.pid, pid_create_time=a.pid_create_time, uid=a.uid,
        kill_mode=a.kill_mode, attested_at=a.attested_at, mac=a.mac, cgroup=a.cgroup))


# -- The SQL behind a run's own evidence: the sealed record of its key, and its MAC'd records -----------

# What the MAC covers (watchdog.core.evidence_mac.FIELDS), plus the id, the seq and the MAC. The
# time as the writer wrote it (SQLite text): the MAC covers that text.
_EVENT_COLS = (events.c.id, events.c.seq, events.c.kind, events.c.tool, events.c.args_hash, events.c.ok,
               events.c.model, events.c.tokens_in, events.c.tokens_out, events.c.cached_tokens_in,
               events.c.reasoning_tokens, events.c.cost_eur, events.c.attempt,
               type_coerce(events.c.at, String).label("at_text"), events.c.mac)

# At most this many of a run's records are read per check (the rest at the next tick): whatever a
# writer appends, one check costs a bounded time.
CHUNK = 20_000


def save_evidence(conn: Connection, run_id: str, evidence_json: str) -> None:
    conn.execute(update(attestations).where(attestations.c.run_id == run_id).values(evidence=evidence_json))


def load_evidence(conn: Connection, run_id: str) -> Any:
    """The run's attestation row with its evidence (None: never attested)."""
    return conn.execute(select(attestations).where(attestations.c.run_id == run_id)).first()


def macd_events(conn: Connection, run_id: str, after_id: int = 0, limit: int = CHUNK) -> Sequence[Any]:
    """The run's events that carry a MAC (the others can never be the run's own) with an id above
    `after_id`, oldest first, at most `limit`."""
    q = (select(*_EVENT_COLS).where(and_(events.c.run_id == run_id, events.c.mac.is_not(None),
                                         events.c.id > after_id))
         .order_by(events.c.id).limit(limit))
    return conn.execute(q).all()
