"""PostgreSQL: the sessions holding a run's row locked, and ending one of them.

A login may leave a transaction open on a run's row: an agent's login on its own run (`SELECT …
FOR UPDATE`), a gateway's on any run (its witnessed event's insert locks the row through 0017's
seq-once trigger). The daemon's writes to that row then give up their bounded wait every tick
(engine.bound_lock_waits). These verbs let the tick find who holds it and end that session
(watchdog.daemon.tick.row_holders decides when): nothing here locks the row or waits on it.

Who holds it: the row's `xmax`, read without a lock (the newest committed version's, which names
the open transaction that locked or updated it), is a transaction id or, when several sessions
share the lock, a multixact whose members are. A transaction id maps to its session through the
lock every transaction holds on its own id (`pg_locks`, also a subtransaction's) and through
`pg_stat_activity.backend_xid` (the top-level one). Both are visible to every login (only the
query text and state are not): no `pg_read_all_stats` is needed. A session counts only if it is
in this database and holds a lock on `runs` itself (a row lock takes one), so a stale number can
name nobody else; and a number that reads both as a running transaction's and as a live
multixact's names nobody (SQL cannot see the tuple's flag that tells them apart).

Ending it takes `pg_signal_backend` (sql/postgres-roles.sql grants it to the tables' owner), which
never reaches a superuser's session; `end_session` re-checks, in the statement that signals, that
the pid still runs the transaction seen, so a pid reused or a transaction ended meanwhile is never
signalled.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from watchdog.store.engine import Connection, DAEMON_LOCK_TIMEOUT_MS, store_unavailable

__all__ = ["RowLocker", "row_lockers", "row_waiters", "may_end_sessions", "end_session", "daemon_logins",
           "END_GRANT"]

log = logging.getLogger("watchdog.store")

# What the daemon's login lacks when it may not end a session (the fix, for the warning).
END_GRANT = "GRANT pg_signal_backend TO <the daemon's login>"


@dataclass(frozen=True)
class RowLocker:
    """One session holding a run's row locked, as the catalog names it (no writer's text: a
    login is a role name the database checked)."""

    pid: int
    xid: str  # the transaction (or subtransaction) id that holds the lock, as text
    login: str
    superuser: bool
    bypasses_rls: bool
    daemons: bool  # the daemon's own login, or a member of the role owning the tables (another daemon)
    writer: bool  # a member of a confined writer role: the agents' or the gateway's (the roles script's)


# Sessions of this database running one of :xids, holding a lock on `runs`, with their login's facts.
# The writer roles are those the roles script confines with its witness-range policy on events
# (`aw_witness_range_<role>`: one for the agents' role, one for the gateway's, whatever their names).
_SESSIONS = text(r"""
SELECT a.pid, t.xid, a.usename, r.rolsuper, r.rolbypassrls,
       (a.usename = session_user OR a.usename = current_user OR pg_has_role(a.usesysid, o.relowner, 'MEMBER')),
       EXISTS (SELECT 1 FROM pg_policies p, unnest(p.roles) AS w(name)
                WHERE p.schemaname = current_schema() AND p.tablename = 'events'
                  AND p.policyname LIKE 'aw\_witness\_range\_%' AND w.name <> 'public'
                  AND pg_has_role(a.usesysid, w.name, 'MEMBER'))
  FROM (SELECT l.pid, l.transactionid::text AS xid FROM pg_locks l
         WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
           AND l.transactionid::text = ANY(:xids)
        UNION
        SELECT s.pid, s.backend_xid::text FROM pg_stat_activity s WHERE s.backend_xid::text = ANY(:xids)) AS t
  JOIN pg_stat_activity a ON a.pid = t.pid
  JOIN pg_roles r ON r.oid = a.usesysid
 CROSS JOIN (SELECT relowner FROM pg_class WHERE oid = 'runs'::regclass) AS o
 WHERE a.pid <> pg_backend_pid()
   AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND EXISTS (SELECT 1 FROM pg_locks rl WHERE rl.pid = a.pid AND rl.locktype = 'relation'
                AND rl.relation = 'runs'::regclass AND rl.granted)
 ORDER BY a.pid""")


def row_lockers(conn: Connection, run_id: str) -> list[RowLocker]:
    """The sessions holding run `run_id`'s row locked now ([] when none, on SQLite, and when the
    catalog cannot tell: this is a diagnosis, never the reason a tick fails). Reads only, in a
    SAVEPOINT of the caller's transaction (an invalid multixact number rolls back that alone)."""
    if conn.dialect.name != "postgresql":
        return []
    try:
        with conn.begin_nested():
            xmax = conn.execute(text("SELECT xmax::text FROM runs WHERE id = :id"), {"id": run_id}).scalar()
            if xmax is None or xmax == "0":
                return []
            direct = _sessions(conn, [str(xmax)])
        members = _members(conn, str(xmax))
        via_multi: list[RowLocker] = []
        if members:
            with conn.begin_nested():
                via_multi = _sessions(conn, list(members))
    except DBAPIError as exc:
        if store_unavailable(exc):
            raise  # the store, not this row: the tick retries whole
        log.debug("run %s: its row's lockers cannot be read (%s)", run_id[:40], type(exc.orig).__name__)
        return []
    if direct and via_multi:
        # SQL cannot tell a multixact from a transaction id (the tuple's flag says, which only
        # pageinspect reads): a number that is both a running transaction's and a live multixact's
        # names nobody, rather than perhaps the wrong session.
        return []
    # A member holding only FOR KEY SHARE (what a foreign key check takes) is never named: it never
    # conflicts with the daemon's writes to a run (no-key UPDATEs, key-share inserts), so it holds
    # nothing from the daemon, however long; named, it would be ended alongside whoever does hold
    # the row (a gateway's witnessed event beside it: review). It still makes the number a live
    # multixact above: a key-share-only multixact must not let the number be read as a running
    # transaction id instead (another login's, the pumped multixact counter having caught up).
    return direct or [lk for lk in via_multi if members.get(lk.xid) != "keysh"]


def _members(conn: Connection, xmax: str) -> dict[str, str]:
    """The transactions of multixact `xmax`, each with its lock's mode (a transaction in it twice:
    its strongest); {} when it is none (a plain transaction id beyond or before the multixacts the
    server keeps: "has not been created yet", "does no longer exist")."""
    try:
        with conn.begin_nested():
            out: dict[str, str] = {}
            for x, mode in conn.execute(text("SELECT xid::text, mode FROM pg_get_multixact_members(CAST(:x AS xid))"),
                                        {"x": xmax}):
                if out.get(str(x)) in (None, "keysh"):
                    out[str(x)] = str(mode)
            return out
    except DBAPIError as exc:
        if store_unavailable(exc):
            raise
        return {}


def _sessions(conn: Connection, xids: list[str]) -> list[RowLocker]:
    return [RowLocker(pid=int(pid), xid=str(xid), login=str(login), superuser=bool(su), bypasses_rls=bool(by),
                      daemons=bool(ours), writer=bool(writer))
            for pid, xid, login, su, by, ours, writer in conn.execute(_SESSIONS, {"xids": xids})]


# Sessions of :logins in this database queued (transitively) behind the sessions :pids on a lock,
# each with the same facts as _SESSIONS. A waiter may have no transaction id yet (a FOR UPDATE
# that has not got its row): it is named by pid and login. Waiting is read from pg_locks (a lock
# not granted) and pg_blocking_pids: pg_stat_activity's wait_event_type, like backend_start, is
# hidden from another login's session without pg_read_all_stats.
_WAITERS = text(r"""
WITH RECURSIVE behind(pid) AS (
  SELECT unnest(CAST(:pids AS int[]))
  UNION
  SELECT s.pid FROM pg_stat_activity s JOIN behind b ON b.pid = ANY(pg_blocking_pids(s.pid))
   WHERE s.usename = ANY(:logins)
     AND EXISTS (SELECT 1 FROM pg_locks w WHERE w.pid = s.pid AND NOT w.granted)
     AND s.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT a.pid, a.usename, r.rolsuper, r.rolbypassrls,
       (a.usename = session_user OR a.usename = current_user OR pg_has_role(a.usesysid, o.relowner, 'MEMBER')),
       EXISTS (SELECT 1 FROM pg_policies p, unnest(p.roles) AS w(name)
                WHERE p.schemaname = current_schema() AND p.tablename = 'events'
                  AND p.policyname LIKE 'aw\_witness\_range\_%' AND w.name <> 'public'
                  AND pg_has_role(a.usesysid, w.name, 'MEMBER'))
  FROM behind t
  JOIN pg_stat_activity a ON a.pid = t.pid
  JOIN pg_roles r ON r.oid = a.usesysid
 CROSS JOIN (SELECT relowner FROM pg_class WHERE oid = 'runs'::regclass) AS o
 WHERE a.pid <> pg_backend_pid() AND NOT (a.pid = ANY(CAST(:pids AS int[])))
 ORDER BY a.pid""")


def row_waiters(conn: Connection, pids: list[int], logins: list[str]) -> list[RowLocker]:
    """The sessions of `logins` waiting, directly or behind one another, on the sessions `pids`
    (those holding a run's row): when the holder is ended, the first of them would take the row
    before the daemon's step (a queued or reconnected session of the same login). [] on SQLite."""
    if conn.dialect.name != "postgresql" or not pids or not logins:
        return []
    try:
        with conn.begin_nested():
            return [RowLocker(pid=int(pid), xid="", login=str(login), superuser=bool(su), bypasses_rls=bool(by),
                              daemons=bool(ours), writer=bool(writer))
                    for pid, login, su, by, ours, writer in conn.execute(
                        _WAITERS, {"pids": [int(p) for p in pids], "logins": list(logins)})]
    except DBAPIError as exc:
        if store_unavailable(exc):
            raise
        log.debug("the sessions waiting behind %s cannot be read (%s)", pids[:5], type(exc.orig).__name__)
        return []


def daemon_logins(conn: Connection) -> frozenset[str]:
    """This session's logins (session_user, current_user): the daemon's own, never ended."""
    if conn.dialect.name != "postgresql":
        return frozenset()
    row = conn.execute(text("SELECT session_user::text, current_user::text")).one()
    return frozenset(str(v) for v in row)


def may_end_sessions(conn: Connection) -> bool:
    """Whether this login may end another login's session (pg_signal_backend, or a superuser)."""
    if conn.dialect.name != "postgresql":
        return False
    return bool(conn.execute(text(
        "SELECT pg_has_role(current_user, 'pg_signal_backend', 'USAGE') "
        "OR coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false)")).scalar())


def end_session(conn: Connection, locker: RowLocker) -> bool:
    """End the session `locker` names, only while it still runs the transaction that holds the
    lock (pid and xid checked in the signalling statement). Waits for it to exit (its locks then
    gone) at most DAEMON_LOCK_TIMEOUT_MS (PostgreSQL 14+; older servers only signal). True when it
    was signalled (and, where the server can say, has exited). A refusal (no pg_signal_backend, a
    superuser's session) is False, in a SAVEPOINT: the caller's transaction goes on."""
    if conn.dialect.name != "postgresql":
        return False
    major = (conn.dialect.server_version_info or (0,))[0]
    waits = isinstance(major, int) and major >= 14
    call = "pg_terminate_backend(a.pid, :ms)" if waits else "pg_terminate_backend(a.pid)"
    if locker.xid:  # a holder: still running the transaction that holds the lock
        still = """EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'transactionid'
                AND l.mode = 'ExclusiveLock' AND l.granted AND l.transactionid::text = :xid)"""
        params: dict[str, object] = {"pid": locker.pid, "xid": locker.xid}
    else:  # a waiter (row_waiters, no transaction id yet): of the same login, still waiting on a lock
        still = ("a.usename = :login AND cardinality(pg_blocking_pids(a.pid)) > 0 "
                 "AND EXISTS (SELECT 1 FROM pg_locks w WHERE w.pid = a.pid AND NOT w.granted)")
        params = {"pid": locker.pid, "login": locker.login}
    sql = text(f"""SELECT {call} FROM pg_stat_activity a
 WHERE a.pid = :pid AND a.pid <> pg_backend_pid() AND {still}""")
    if waits:
        params["ms"] = int(DAEMON_LOCK_TIMEOUT_MS)
    try:
        with conn.begin_nested():
            return bool(conn.execute(sql, params).scalar())
    except DBAPIError as exc:
        if store_unavailable(exc):
            raise
        log.debug("session %d: not ended (%s)", locker.pid, type(exc.orig).__name__)
        return False
