"""Rows of `attestations`: the process identities a daemon attested, with their seal.

Only the daemon writes here (on PostgreSQL the agents' role cannot, see
`sql/roles.sql`); on SQLite anyone in the store's group can, which is why every
row carries a MAC the daemon checks before it believes a word of it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Connection

from watchdog.core.budgets import RUN_BUDGET_KEYS
from watchdog.store.schema import attestations, runs


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
