"""lifecycle.STATUS_MOVES as a table every status write asks (watchdog.store.run_rows.move)."""

from __future__ import annotations

import pytest

from watchdog.core import lifecycle as lc


def test_every_status_has_its_row_and_ended_runs_never_move():
    assert set(lc.STATUS_MOVES) == set(lc.Status)
    for end in lc.END_STATUSES:
        assert lc.STATUS_MOVES[end] == frozenset()


def test_the_moves_of_the_design():
    assert lc.can_move(lc.STATUS_MOVES, "running", "stopping")  # a plain string, as a row holds it
    for s in lc.STOPPABLE_STATUSES:
        lc.check_status_move(s, lc.STOPPING)
    for s in lc.ACTIVE_STATUSES:
        lc.check_status_move(s, lc.LOST)
    lc.check_status_move(lc.PAUSED, lc.RUNNING)
    lc.check_status_move(lc.STOPPING, lc.KILLED)


@pytest.mark.parametrize("current, new", [(lc.STOPPING, lc.RUNNING), (lc.STOPPING, lc.PAUSED),
                                          (lc.KILLED, lc.RUNNING), (lc.COMPLETED, lc.LOST), (None, lc.RUNNING),
                                          (lc.RUNNING, lc.RUNNING)])
def test_an_unlisted_move_is_an_illegal_status_move(current, new):
    with pytest.raises(lc.IllegalStatusMove) as err:
        lc.check_status_move(current, new)
    assert isinstance(err.value, lc.IllegalMove) and isinstance(err.value, AssertionError)
    assert (err.value.current, err.value.new) == (current, new)
    assert "lifecycle.STATUS_MOVES" in str(err.value)
