"""Judges sharded by run id on PostgreSQL: which shard a run is in, and the advisory locks that
say which judge holds a shard (watchdog.daemon.leases.shards).

A run's shard is a range of a 32-bit hash of its id (the first 32 bits of md5: a writer picks its
run's id, never its shard's judge), in BUCKETS buckets: the bucket is the hash's top 10 bits, and
PostgreSQL stores it with each run row and each new event (`shard`, revision 0016, computed by
the database from the run id), so a judge reads only its shards' rows (`Reach`). Shard i of n is held by whoever holds the session-level advisory lock
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

import functools
import hashlib
from collections.abc import Collection, Iterable

from sqlalchemy import text
from sqlalchemy.engine import Connection

from watchdog.store.leases import lock_key, try_lock, unlock

HASH_SPACE = 1 << 32
BUCKETS = 1024  # the stored `shard` column's range: a judge's shard is a range of these
MAX_SHARDS = BUCKETS
MAX_JUDGES = 256  # member slots
PG_ONLY = ("shard", "ix_runs_shard_change_seq")  # revision 0016's names, not in the models (read by name)
# revision 0016's expression, as the database computes `runs.shard` and `events.shard`
BUCKET_SQL = "((('x' || substr(md5({col}), 1, 8))::bit(32)::bigint >> 22)::smallint)"


def bucket_mask_sql(col: str, param: str) -> str:
    """A stored bucket (`col`, NULL: none) is among a Reach's, its `mask` bound as `param`."""
    return f"coalesce(get_bit(CAST({param} AS bytea), {col}) = 1, false)"


def run_hash(run_id: str) -> int:
    """The run id's place in [0, HASH_SPACE): the first 32 bits of md5 of its UTF-8 bytes, as the
    database computes it (BUCKET_SQL)."""
    return int.from_bytes(hashlib.md5(run_id.encode("utf-8", "surrogatepass")).digest()[:4], "big")


def bucket_of(run_id: str) -> int:
    """The run's stored bucket (`shard` on PostgreSQL): its hash's top 10 bits."""
    return run_hash(run_id) * BUCKETS // HASH_SPACE


_bucket = functools.lru_cache(maxsize=1 << 18)(bucket_of)  # a run's bucket, asked every tick it changes


def shard_of(run_id: str, n_shards: int) -> int:
    """The shard whose range of buckets holds the run: shard i of n is the buckets b with
    b * n // BUCKETS == i (n <= BUCKETS; every bucket in exactly one shard)."""
    return bucket_of(run_id) * n_shards // BUCKETS


def buckets_of(shards: Iterable[int], n_shards: int) -> tuple[int, ...]:
    """The stored buckets of these shards of n, sorted."""
    held = set(shards)
    return tuple(b for b in range(BUCKETS) if b * n_shards // BUCKETS in held)


class Reach(frozenset[str]):
    """What a sharded judge reads: the runs of its hosts (the set itself: the hosts whose
    processes it watches and whose stops it carries out) and, on any host, the runs of the
    buckets of its shards (`buckets`). Passed where the reads take the hosts they read
    (watchdog.store.scan, watchdog.store.changes); equal only to a Reach of the same hosts and
    buckets, so a change of either makes the tick's caches start over."""

    buckets: tuple[int, ...]
    # The buckets as a bit mask, bit b of byte b // 8 (low bit first: PostgreSQL's get_bit): the
    # reads test a row's bucket with one get_bit (bucket_mask_sql), not a compare with each bucket
    # of an array (a judge of 16 shards of 64 holds 256), nor the array built per statement.
    mask: bytes
    _set: frozenset[int]

    def __new__(cls, hosts: Collection[str], buckets: Iterable[int]) -> "Reach":
        self = super().__new__(cls, hosts)
        self._set = frozenset(buckets)
        self.buckets = tuple(sorted(self._set))
        mask = bytearray(BUCKETS // 8)
        for b in self.buckets:
            if 0 <= b < BUCKETS:
                mask[b // 8] |= 1 << (b % 8)
        self.mask = bytes(mask)
        return self

    def covers(self, run_id: str, host: object) -> bool:
        """The run is read by this reach: on one of its hosts, or of one of its buckets."""
        return host in self or (run_id.__class__ is str and _bucket(run_id) in self._set)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Reach) and self.buckets == other.buckets
                and frozenset.__eq__(self, other))

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((frozenset(self), self.buckets))

    def __reduce__(self) -> tuple[object, ...]:
        return (Reach, (frozenset(self), self.buckets))


@functools.lru_cache(maxsize=4096)  # every rebalance asks each shard's key
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


class Holders:
    """One read of who holds which advisory key (the session's one round trip of a rebalance:
    `judges`, `free_shards`, `squatted` and `squatted_members` answered from it, and its success
    proves the session, and so its locks, alive). A key this session takes or gives up after the
    read is told by the caller's own set (`mine`), not by this snapshot."""

    def __init__(self, conn: Connection) -> None:
        self.ours, self.others = _holders(conn)

    def judges(self) -> int:
        return len(self.ours & _MEMBERS.keys())

    def squatted_members(self) -> dict[int, str]:
        return {_MEMBERS[k]: who for k, who in self.others.items() if k in _MEMBERS}

    def free_shards(self, n_shards: int, mine: set[int]) -> list[int]:
        return [i for i in range(n_shards) if i not in mine and shard_key(i, n_shards) not in self.ours]

    def squatted(self, n_shards: int) -> dict[int, str]:
        out = {}
        for i in range(n_shards):
            key = shard_key(i, n_shards)
            if key in self.others and key not in self.ours:
                out[i] = self.others[key]
        return out


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
