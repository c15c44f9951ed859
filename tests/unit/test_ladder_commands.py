"""The judge's side of the stop ladder: which command a stopping run is due for, at each stage and
on each side of each grace, with the clock passed in (watchdog.daemon.stops.commands.judge).

No socket, process or database (tests/purity.py guards it): the judge reads a row and a clock.
The enforcer's half (attest, signal once) is tests/system/test_enforcer.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest

from watchdog.core import lifecycle as lc
from watchdog.core.config import DaemonConfig
from watchdog.daemon.stops.commands import ACTION_NO, KILL_CONFIRM_S, Command, Kind, Target, due, judge
from watchdog.daemon.stops.enforcer import Enforcer

UTC = dt.timezone.utc
T0 = dt.datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)
D = DaemonConfig(cancel_grace_s=10.0, term_grace_s=5.0, state_dir="/nonexistent", socket="/nonexistent/s",
                 key_file="/nonexistent/k")
HOST = "here"
EPS = 0.001


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def row(stage: str | None = None, *, kill_mode: str = lc.PROCESS, host: str = HOST, signalled_s: float | None = None,
        **kw: Any) -> SimpleNamespace:
    base: dict[str, Any] = dict(id="r" * 32, host=host, pid=4242, pid_create_time=1700000000.5, kill_mode=kill_mode,
                                signal_stage=stage, stop_requested_at=T0, status=lc.STOPPING,
                                signalled_at=None if signalled_s is None else at(signalled_s))
    base.update(kw)
    return SimpleNamespace(**base)


def only(commands: tuple[Command, ...]) -> Command:
    assert len(commands) == 1, commands
    return commands[0]


# -- the first step: after the cancel grace, not a moment before ------------------------------------------


@pytest.mark.parametrize("kill_mode, kind", [(lc.PROCESS, Kind.SIGTERM), (lc.TREE, Kind.SIGTERM),
                                             (lc.CGROUP, Kind.SIGTERM), (lc.COOPERATIVE, Kind.CANCEL)])
def test_the_first_step_is_due_at_the_cancel_grace_and_not_before(kill_mode: str, kind: Kind) -> None:
    r = row(kill_mode=kill_mode)
    assert judge(r, at(10 - EPS), D, HOST) == ()
    c = only(judge(r, at(10), D, HOST))
    assert (c.run_id, c.action_no, c.kind, c.from_stage, c.decided_at) == (r.id, 1, kind, None, at(10))
    assert c.target == Target(HOST, 4242, 1700000000.5, kill_mode)
    assert c.signals == (kind == Kind.SIGTERM) and not c.redriven and not c.give_up


def test_a_run_of_another_host_gets_no_signal_from_this_hosts_judge_but_a_shared_process_its_cancel() -> None:
    assert judge(row(host="elsewhere"), at(60), D, HOST) == ()
    assert only(judge(row(host="elsewhere", kill_mode=lc.COOPERATIVE), at(60), D, HOST)).kind == Kind.CANCEL


def test_a_cooperative_run_is_never_escalated_past_its_cancel() -> None:
    for stage in (lc.Stage.TERM, lc.Stage.KILL):
        assert judge(row(stage, kill_mode=lc.COOPERATIVE, signalled_s=10), at(600), D, HOST) == ()


# -- after SIGTERM: a look until the term grace, then SIGKILL (cgroup.kill for a cgroup run) ------------------


@pytest.mark.parametrize("kill_mode, kind", [(lc.PROCESS, Kind.SIGKILL), (lc.TREE, Kind.SIGKILL),
                                             (lc.CGROUP, Kind.CGROUP_KILL)])
def test_after_sigterm_the_kill_is_due_at_the_term_grace(kill_mode: str, kind: Kind) -> None:
    r = row(lc.Stage.TERM, kill_mode=kill_mode, signalled_s=10)
    look = only(judge(r, at(15 - EPS), D, HOST))
    assert (look.kind, look.action_no, look.from_stage, look.signals) == (Kind.CONFIRM, 3, lc.Stage.TERM, False)
    kill = only(judge(r, at(15), D, HOST))
    assert (kill.kind, kill.action_no, kill.from_stage, kill.signals) == (kind, 3, lc.Stage.TERM, True)


def test_after_sigkill_a_survivor_fails_the_stop_only_past_the_kill_confirmation() -> None:
    r = row(lc.Stage.KILL, signalled_s=15)
    before = only(judge(r, at(15 + KILL_CONFIRM_S - EPS), D, HOST))
    past = only(judge(r, at(15 + KILL_CONFIRM_S), D, HOST))
    assert (before.kind, before.action_no, before.give_up) == (Kind.CONFIRM, 4, False)
    assert (past.kind, past.action_no, past.give_up) == (Kind.CONFIRM, 4, True)


# -- stages that wait, and the operator's redrive ------------------------------------------------------------


@pytest.mark.parametrize("stage", [lc.Stage.REFUSED, lc.Stage.NOT_SIGNALLED, lc.Stage.FAILED, lc.Stage.DONE])
def test_a_waiting_or_ended_stage_gets_no_command(stage: str) -> None:
    assert judge(row(stage, signalled_s=10), at(3600), D, HOST) == ()
    assert not due(row(stage, signalled_s=10), at(3600), D, HOST)


def test_a_sealed_redrive_takes_the_first_step_again_from_refused_on_its_own_host_only() -> None:
    c = only(judge(row(lc.Stage.REFUSED, signalled_s=10), at(11), D, HOST, redriven=True))
    assert (c.kind, c.action_no, c.from_stage, c.redriven) == (Kind.SIGTERM, 2, lc.Stage.REFUSED, True)
    assert judge(row(lc.Stage.REFUSED, host="elsewhere"), at(11), D, HOST, redriven=True) == ()
    # A redrive means nothing to a run that is not refused: its ladder goes on as it would.
    assert only(judge(row(None), at(10), D, HOST, redriven=True)).redriven is False


# -- the key: (run_id, action_no) names one step of one run ----------------------------------------------------


def test_each_stage_is_left_by_one_numbered_step_and_no_stage_is_reached_twice() -> None:
    assert len(set(ACTION_NO.values())) == len(ACTION_NO)
    assert set(ACTION_NO) == set(lc.ACTING_STAGES) | {lc.Stage.REFUSED}

    def reachable(stage: str | None) -> set[str]:
        seen: set[str] = set()
        todo = list(lc.STAGE_MOVES[stage])  # type: ignore[index]
        while todo:
            s = todo.pop()
            if s not in seen:
                seen.add(s)
                todo += lc.STAGE_MOVES[s]  # type: ignore[index]
        return seen

    # Acyclic: a stage, once left, is never the run's stage again, so its step cannot come due twice.
    assert all(s not in reachable(s) for s in lc.STAGE_MOVES if s is not None)


def test_the_same_row_and_clock_give_the_same_frozen_commands() -> None:
    r = row(lc.Stage.TERM, signalled_s=10)
    first, again = judge(r, at(15), D, HOST), judge(r, at(15), D, HOST)
    assert first == again and first[0].key == (r.id, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first[0].kind = Kind.SIGTERM  # type: ignore[misc]


def test_the_enforcer_drops_a_command_for_another_host_or_a_changed_row_before_touching_the_store() -> None:
    killer = SimpleNamespace(host=HOST)
    enforcer = Enforcer(killer)  # type: ignore[arg-type]
    r = row()
    sigterm = only(judge(r, at(10), D, HOST))
    elsewhere = dataclasses.replace(sigterm, target=dataclasses.replace(sigterm.target, host="elsewhere"))
    assert not enforcer.execute(None, elsewhere, row(host="elsewhere"), None)  # type: ignore[arg-type]
    # The run's process changed since the judge read its row (a respawn, a rewrite): stale, dropped.
    assert not enforcer.execute(None, sigterm, row(pid=4343), None)  # type: ignore[arg-type]
    assert not enforcer.execute(None, sigterm, row(id="s" * 32), None)  # type: ignore[arg-type]
