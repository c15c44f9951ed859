"""When the daemon ends a session that keeps a run's row locked from it (PostgreSQL). Pure.

A login may hold a run's row in an open transaction: an agent's login its own run's, a gateway's
any run's (its witnessed event's insert locks the row). Until it ends, the daemon can write
nothing of that run: not its stop, not its audit row (judging.held). Left alone, whoever holds a
gateway's credential keeps any other user's runaway from ever being stopped. So the tick ends
that session itself, and only when all of these hold:

- the daemon's write met the lock at `HELD_TICKS` ticks in a row, and the very same transaction
  (pid and transaction id) held the row at the previous tick: a writer's own transaction lasts
  milliseconds, the daemon waited its lock_timeout each time, and one miss may be a race;
- its login is not the daemon's (this session's session_user or current_user), nor a member of
  the role owning the tables (another daemon, an operator's `agent-watchdog kill`);
- its login is not a superuser and does not bypass row-level security (not a confined writer);
- its login is a member of a confined writer role: the agents' or the gateway's.

Anything else holding the row (an operator's psql as a superuser, another daemon) is only
alerted, as before, for a human to decide.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from watchdog.store.row_lockers import RowLocker

__all__ = ["HELD_TICKS", "seen", "to_end", "may_end"]

HELD_TICKS = 2  # ticks in a row the daemon's write met the same transaction's lock before it ends that session


def seen(lockers: Sequence[RowLocker]) -> frozenset[tuple[int, str]]:
    """What the next tick compares with: the (pid, transaction id) of each locker seen."""
    return frozenset((lk.pid, lk.xid) for lk in lockers)


def may_end(lk: RowLocker, ours: Collection[str]) -> bool:
    """Whether this session's login is one the daemon may end at all (not when)."""
    return (lk.writer and not lk.superuser and not lk.bypasses_rls and not lk.daemons
            and lk.login not in ours)


def to_end(lockers: Sequence[RowLocker], before: Collection[tuple[int, str]], ticks: int,
           ours: Collection[str], offenders: Collection[str] = ()) -> list[RowLocker]:
    """The sessions to end now: `lockers` hold the row this tick, `before` is what the previous
    tick saw holding it (seen()), `ticks` the ticks in a row the daemon's write met the lock (this
    one included), `ours` the daemon's own logins, `offenders` the logins a session of which the
    daemon already ended for holding this run's row, its step not taken since: a new session of
    such a login holding it again (a reconnect) is ended at once, else each reconnect would buy
    it two more ticks and the run would never be stopped (review)."""
    return [lk for lk in lockers if may_end(lk, ours)
            and (lk.login in offenders or (ticks >= HELD_TICKS and (lk.pid, lk.xid) in before))]
