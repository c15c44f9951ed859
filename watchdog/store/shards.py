"""Judges sharded by run id on PostgreSQL: which shard a run is in, and the advisory locks that
say which judge holds a shard (watchdog.daemon.leases.shards).

A run's shard is a range of a 32-bit hash of its id (blake2b: a writer picks its run's id, never
its shard's judge). Shard i of n is held by whoever holds the session-level advisory lock
`lock_key("shard:<n>:<i>")`, on a session of its own; a judge that is present holds one
"member" lock (`lock_key("judge:<slot>")`), so every judge can count the others from pg_locks
without a row anyone could write. A judge that dies loses its session and with it every lock:
the others take its shards at their next rebalance.

The keys are public (a hash of a fixed name) and any login may take an advisory lock: only a
session of the daemon's role (its login, or a member of the role that owns the tables) counts
as a holder. A key another login holds is a squat: its shard is judged by every judge anyway
(`squatted`), its member slot is skipped.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import text
from sqlalchemy.engine import Connection

from watchdog.store.leases import lock_key, try_lock, unlock

HASH_SPACE = 1 << 32
MAX_JUDGES = 256  # member slots


def run_hash(run_id: str) -> int:
    """The run id's place in [0, HASH_SPACE)."""
    return int.from_bytes(hashlib.blake2b(run_id.encode("utf-8", "surrogatepass"), digest_size=4).digest(), "big")


def shard_of(run_id: str, n_shards: int) -> int:
    """The shard whose hash range holds the run: shard i covers [i, i + 1) * HASH_SPACE / n."""
    return run_hash(run_id) * n_shards // HASH_SPACE


def shard_key(index: int, n_shards: int) -> int:
    return lock_key(f"shard:{n_shards}:{index}")


def member_key(slot: int) -> int:
    return lock_key(f"judge:{slot}")


_MEMBERS = {member_key(s): s for s in range(MAX_JUDGES)}

# Every advisory key (bigint form) held in this database, with the holder's login and whether
# that login is the daemon's: this session's login, or a member of the role owning `runs`.
# pg_stat_activity shows every session's login to every login; a lock with no session row (a
# prepared transaction) is nobody's.
_HOLDERS = text(
    "SELECT l.classid::bigint, l.objid::bigint, a.usename, "
    "coalesce(a.usename = session_user OR pg_has_role(a.usename, o.relowner, 'MEMBER'), false) "
    "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
    "CROSS JOIN (SELECT relowner FROM pg_class WHERE oid = to_regclass('runs')) o "
    "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())")


def _holders(conn: Connection) -> tuple[set[int], dict[int, str]]:
    """(keys the daemon's sessions hold, key -> login of every other holder)."""
    ours: set[int] = set()
    others: dict[int, str] = {}
    for hi, lo, login, daemons in conn.execute(_HOLDERS):
        unsigned = (int(hi) << 32) | int(lo)
        key = unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned
        if daemons:
            ours.add(key)
        else:
            others.setdefault(key, login or "?")
    return ours, others


def join(conn: Connection) -> int | None:
    """Take the first member slot no judge holds on this session; its number (None: every slot is
    a judge's or squatted by another login: `judges` tells which)."""
    ours, others = _holders(conn)
    for key, slot in _MEMBERS.items():
        if key not in ours and key not in others and try_lock(conn, key):
            return slot
    return None


def judges(conn: Connection) -> int:
    """How many judges are present now (member locks held by the daemon's sessions)."""
    return len(_holders(conn)[0] & _MEMBERS.keys())


def squatted_members(conn: Connection) -> dict[int, str]:
    """Member slot -> login, for the slots another login's session holds."""
    return {_MEMBERS[k]: who for k, who in _holders(conn)[1].items() if k in _MEMBERS}


def free_shards(conn: Connection, n_shards: int, mine: set[int]) -> list[int]:
    """The shards no judge holds (ours excluded), lowest first; a squatted one is among them
    (`take` then fails: see `squatted`)."""
    ours = _holders(conn)[0]
    return [i for i in range(n_shards) if i not in mine and shard_key(i, n_shards) not in ours]


def squatted(conn: Connection, n_shards: int) -> dict[int, str]:
    """Shard -> login, for the shards whose key another login's session holds and no judge does."""
    ours, others = _holders(conn)
    out = {}
    for i in range(n_shards):
        key = shard_key(i, n_shards)
        if key in others and key not in ours:
            out[i] = others[key]
    return out


def take(conn: Connection, index: int, n_shards: int) -> bool:
    return try_lock(conn, shard_key(index, n_shards))


def give_up(conn: Connection, index: int, n_shards: int) -> None:
    unlock(conn, shard_key(index, n_shards))
