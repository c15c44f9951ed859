"""The transition tables' checks (watchdog.core.lifecycle): every move a table lists passes,
every other raises the table's own IllegalMove, naming both states."""

from __future__ import annotations

import itertools

import pytest

from watchdog.core import lifecycle as lc


@pytest.mark.parametrize("current, new", list(itertools.product([None, *lc.Circuit], lc.Circuit)))
def test_a_circuit_move_passes_exactly_when_circuit_moves_lists_it(current, new):
    listed = new in lc.CIRCUIT_MOVES[lc.Circuit.CLOSED if current is None else current]
    if listed:
        lc.check_circuit_move(current, new)
        return
    with pytest.raises(lc.IllegalCircuitMove) as err:
        lc.check_circuit_move(current, new)
    assert (err.value.current, err.value.new) == (current, new)
    assert "CIRCUIT_MOVES" in str(err.value) and str(new) in str(err.value)


@pytest.mark.parametrize("current, new", list(itertools.product([None, *lc.Stage], lc.Stage)))
def test_a_stage_move_passes_exactly_when_stage_moves_lists_it(current, new):
    if new in lc.STAGE_MOVES[current]:
        lc.check_stage_move(current, new)
        return
    with pytest.raises(lc.IllegalStageMove, match="STAGE_MOVES"):
        lc.check_stage_move(current, new)


def test_the_plain_strings_a_row_holds_are_checked_as_their_members():
    lc.check_circuit_move("open", "half_open")
    lc.check_stage_move("term", "kill")
    with pytest.raises(lc.IllegalCircuitMove):
        lc.check_circuit_move("closed", "half_open")
    with pytest.raises(lc.IllegalCircuitMove):
        lc.check_circuit_move("not a state", "open")


def test_an_illegal_move_is_an_assertion_error_so_no_caller_treats_it_as_an_outcome():
    assert issubclass(lc.IllegalCircuitMove, AssertionError) and issubclass(lc.IllegalStageMove, AssertionError)
