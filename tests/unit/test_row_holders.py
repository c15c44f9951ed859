"""When the daemon ends a session holding a run's row locked (watchdog.daemon.tick.row_holders):
the same transaction at two ticks in a row, a confined writer's login, never the daemon's own, a
superuser's, another daemon's or a login that bypasses row-level security. Pure."""

from __future__ import annotations

import dataclasses

import pytest

from watchdog.daemon.tick.row_holders import HELD_TICKS, may_end, seen, to_end
from watchdog.store.row_lockers import RowLocker

GW = RowLocker(pid=4242, xid="777", login="aw_gl", superuser=False, bypasses_rls=False, daemons=False, writer=True)
OURS = frozenset({"agent_watchdog"})


def test_a_writers_transaction_seen_at_two_ticks_in_a_row_is_ended():
    assert HELD_TICKS == 2
    assert to_end([GW], seen([GW]), 2, OURS) == [GW]
    assert to_end([GW], seen([GW]), 5, OURS) == [GW]  # and at any later tick that still finds it


def test_a_first_miss_is_never_ended():
    assert to_end([GW], seen([GW]), 1, OURS) == []
    assert to_end([GW], frozenset(), 1, OURS) == []


def test_a_different_transaction_or_session_than_the_last_ticks_is_not_ended_yet():
    """Two short transactions that each met the daemon's wait are no proof of one held lock."""
    assert to_end([GW], seen([dataclasses.replace(GW, xid="778")]), 2, OURS) == []
    assert to_end([GW], seen([dataclasses.replace(GW, pid=4243)]), 2, OURS) == []
    assert to_end([GW], frozenset(), 3, OURS) == []  # nobody seen at the last miss


@pytest.mark.parametrize("who", [
    dict(superuser=True),
    dict(daemons=True),  # another daemon's login (a member of the tables' owner)
    dict(login="agent_watchdog"),  # this daemon's own login
    dict(writer=False),  # not a member of the agents' or the gateway's role (a viewer, another application)
    dict(bypasses_rls=True),  # not a confined writer
])
def test_never_the_daemons_own_a_superusers_or_a_login_outside_the_writer_roles(who):
    lk = dataclasses.replace(GW, **who)
    assert not may_end(lk, OURS)
    assert to_end([lk], seen([lk]), 3, OURS) == []


def test_only_the_sessions_that_qualify_among_several():
    su = dataclasses.replace(GW, pid=1, xid="5", login="postgres", superuser=True)
    agent = dataclasses.replace(GW, pid=2, xid="6", login="aw_a")
    assert to_end([su, agent, GW], seen([su, agent, GW]), 2, OURS) == [agent, GW]


def test_a_new_session_of_a_login_already_ended_on_this_run_is_ended_at_its_first_miss():
    """Review: each reconnect of the same login bought it two more ticks, the run never stopped."""
    again = dataclasses.replace(GW, pid=4343, xid="778")
    assert to_end([again], frozenset(), 1, OURS, offenders={"aw_gl"}) == [again]
    assert to_end([again], frozenset(), 1, OURS, offenders={"someone_else"}) == []
    # never a login the daemon may not end, offender or not
    ours = dataclasses.replace(again, login="agent_watchdog")
    assert to_end([ours], frozenset(), 1, OURS, offenders={"agent_watchdog"}) == []
    su = dataclasses.replace(again, superuser=True)
    assert to_end([su], frozenset(), 1, OURS, offenders={"aw_gl"}) == []
