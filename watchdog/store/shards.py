"""Judges sharded by run id on PostgreSQL: which shard a run is in, and the advisory locks that
say which judge holds a shard (watchdog.daemon.shards).

A run's shard is a range of a 32-bit hash of its id (blake2b: a writer picks its run's id, never
its shard's judge). Shard i of n is held by whoever holds the session-level advisory lock
`lock_key("shard:<n>:<i>")`, on a session of its own; a judge that is present holds one
"member" lock (`lock_key("judge:<slot>")`), so every judge can count the others from pg_locks
without a row anyone could write. A judge that dies loses its session and with it every lock:
the others take its shards at their next rebalance.
"""

from __future__ import annotations

import hashlib

from sqlalchemy.engine import Connection

from watchdog.store.leases import held_keys, lock_key, try_lock, unlock

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


def join(conn: Connection) -> int | None:
    """Take the first free member slot on this session; its number (None: all taken)."""
    taken = held_keys(conn)
    for key, slot in _MEMBERS.items():
        if key not in taken and try_lock(conn, key):
            return slot
    return None


def judges(conn: Connection) -> int:
    """How many judges are present now (their member locks held)."""
    return len(held_keys(conn) & _MEMBERS.keys())


def free_shards(conn: Connection, n_shards: int, mine: set[int]) -> list[int]:
    """The shards no session holds (ours excluded), lowest first."""
    taken = held_keys(conn)
    return [i for i in range(n_shards) if i not in mine and shard_key(i, n_shards) not in taken]


def take(conn: Connection, index: int, n_shards: int) -> bool:
    return try_lock(conn, shard_key(index, n_shards))


def give_up(conn: Connection, index: int, n_shards: int) -> None:
    unlock(conn, shard_key(index, n_shards))
