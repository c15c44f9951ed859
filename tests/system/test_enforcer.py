"""The enforcer carries each of the judge's commands out once, against a real process and real signals.

The judge's list is decided once, then executed again and again: by the same enforcer, by one
restarted from the same state file, and after a store writer put the row's stage back to NULL.
The agent logs every SIGTERM it receives (tests/agent_procs.py, signal_log); after the last
execution the test sends a sentinel SIGUSR1 and waits for it in the log, so "exactly one SIGTERM"
is read off the process's own record, never inferred from a pause.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from sqlalchemy import text, update

from agent_procs import WAIT_S, wait_until
from daemon_support import ME, actions, config, later, run_row
from watchdog.core import lifecycle as lc
from watchdog.core.budgets import Budgets
from watchdog.daemon.stops.commands import Kind, judge
from watchdog.daemon.stops.enforcer import Checks, Enforcer
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.stops.steps import Said
from watchdog.daemon.stops.stopping import facts
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.memory import Memory
from watchdog.store.schema import runs, utcnow

RUNAWAY = dict(kill_mode="process", budgets={"max_steps": 3}, steps=4, then="hang")


def received(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def sentinel(pid: int, log: Path) -> list[str]:
    """SIGUSR1, then the log once it shows it: every signal sent before it is in the log by then."""
    os.kill(pid, signal.SIGUSR1)
    assert wait_until(lambda: "SIGUSR1" in received(log)), received(log)
    return received(log)


def checks(row, now, sealer) -> Checks:
    return Checks(Said(now, "test-daemon", facts(row, now=now), Budgets(), sealer), 0.5, 0.5, confirmed=lambda: True)


def execute(engine, enforcer: Enforcer, commands, now, sealer) -> list[bool]:
    """Each command in its own transaction, with the row as the store has it now (as the tick does)."""
    done = []
    for command in commands:
        row = run_row(engine, command.run_id)
        with engine.begin() as conn:
            done.append(enforcer.execute(conn, command, row, checks(row, now, sealer)))
    return done


def stopped_runaway(db_url, engine, procs, attestor, log: Path):
    """A runaway that logs its signals, stopped by a tick at t: (agent, t, the config)."""
    agent = procs.start("runaway", db_url, **RUNAWAY, signal_log=str(log))
    cfg = config()
    t = utcnow()
    tk = Ticker(engine, cfg, Killer(allowed_users=[ME]), sealer=attestor.sealer)
    assert tk.tick(t).stops == [(agent.run_id, lc.MAX_STEPS)]
    return agent, t, cfg


def test_the_same_command_list_executed_again_restarted_and_after_a_forged_stage_signals_once(
        db_url, engine, procs, attest, tmp_path):
    attestor = attest(db_url)
    log = tmp_path / "signals.log"
    agent, t, cfg = stopped_runaway(db_url, engine, procs, attestor, log)

    now = later(t, 0.6)  # past the cancel grace (0.5 s)
    commands = judge(run_row(engine, agent.run_id), now, cfg.daemon, Killer().host)  # decided once
    assert [(c.kind, c.action_no, c.from_stage) for c in commands] == [(Kind.SIGTERM, 1, None)]

    state = str(tmp_path / "daemon.state")
    first = Enforcer(Killer(allowed_users=[ME]), Memory(state))
    assert execute(engine, first, commands, now, attestor.sealer) == [True]
    assert wait_until(lambda: "SIGTERM" in received(log)), agent.log()
    assert run_row(engine, agent.run_id).signal_stage == lc.Stage.TERM

    assert execute(engine, first, commands, now, attestor.sealer) == [False]  # the same list again
    first.memory.close()
    restarted = Enforcer(Killer(allowed_users=[ME]), Memory(state))  # nothing kept but the state file
    assert execute(engine, restarted, commands, now, attestor.sealer) == [False]
    other = Enforcer(Killer(allowed_users=[ME]), Memory(str(tmp_path / "other.state")))  # another daemon's file
    assert execute(engine, other, commands, now, attestor.sealer) == [False]  # the row says the step was taken
    # A store writer puts the stage back, to be signalled again: the daemon's own record says no.
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == agent.run_id).values(signal_stage=None))
    assert execute(engine, restarted, commands, later(t, 0.7), attestor.sealer) == [False]

    assert sentinel(agent.pid, log) == ["SIGTERM", "SIGUSR1"]
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]


def test_the_tick_carries_the_judges_commands_out_through_the_tickers_own_enforcer(
        db_url, engine, procs, attest, tmp_path):
    """The Ticker holds one Enforcer, over its killer and its state file, for its whole life: the
    tick's judge step decides the SIGTERM and that enforcer sends it, once; the same list handed to
    it again after the tick is dropped."""
    attestor = attest(db_url)
    log = tmp_path / "signals.log"
    agent = procs.start("runaway", db_url, **RUNAWAY, signal_log=str(log))
    cfg, killer = config(), Killer(allowed_users=[ME])
    tk = Ticker(engine, cfg, killer, sealer=attestor.sealer, memory=Memory(str(tmp_path / "daemon.state")))
    enforcer = tk.enforcer
    assert (enforcer.killer, enforcer.memory) == (killer, tk.memory)
    t = utcnow()
    assert tk.tick(t).stops == [(agent.run_id, lc.MAX_STEPS)]

    now = later(t, 0.6)  # past the cancel grace (0.5 s)
    commands = judge(run_row(engine, agent.run_id), now, cfg.daemon, killer.host)  # what the tick decides
    assert [(c.kind, c.action_no) for c in commands] == [(Kind.SIGTERM, 1)]
    tk.tick(now)
    assert wait_until(lambda: "SIGTERM" in received(log)), agent.log()
    assert tk.enforcer is enforcer and run_row(engine, agent.run_id).signal_stage == lc.Stage.TERM
    assert execute(engine, enforcer, commands, now, attestor.sealer) == [False]  # carried out by the tick

    assert sentinel(agent.pid, log) == ["SIGTERM", "SIGUSR1"]
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]


def test_an_enforcer_restarted_between_decide_and_execute_signals_once(db_url, engine, procs, attest, tmp_path):
    attestor = attest(db_url)
    log = tmp_path / "signals.log"
    agent, t, cfg = stopped_runaway(db_url, engine, procs, attestor, log)
    state = str(tmp_path / "daemon.state")
    before = Enforcer(Killer(allowed_users=[ME]), Memory(state))

    now = later(t, 0.6)
    commands = judge(run_row(engine, agent.run_id), now, cfg.daemon, Killer().host)
    before.memory.close()  # the enforcer goes down after the judge decided, before it executed
    after = Enforcer(Killer(allowed_users=[ME]), Memory(state))
    assert execute(engine, after, commands, now, attestor.sealer) == [True]
    assert wait_until(lambda: "SIGTERM" in received(log)), agent.log()
    # The next tick's list: the judge sees `term` inside the term grace and asks for a look only.
    look = judge(run_row(engine, agent.run_id), later(t, 0.8), cfg.daemon, Killer().host)
    assert [(c.kind, c.action_no) for c in look] == [(Kind.CONFIRM, 3)]
    assert execute(engine, after, look, later(t, 0.8), attestor.sealer) == [True]  # alive: nothing to end yet
    assert execute(engine, after, commands, later(t, 0.8), attestor.sealer) == [False]  # the stale SIGTERM

    assert sentinel(agent.pid, log) == ["SIGTERM", "SIGUSR1"]
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]
    assert run_row(engine, agent.run_id).status == lc.STOPPING


class Crash(Exception):
    """The daemon dies inside the enforcer's transaction: the store rolls it back."""


def test_a_crash_after_the_signal_before_the_commit_sends_no_second_sigterm(db_url, engine, procs, attest, tmp_path):
    attestor = attest(db_url)
    log = tmp_path / "signals.log"
    agent, t, cfg = stopped_runaway(db_url, engine, procs, attestor, log)
    state = str(tmp_path / "daemon.state")
    now = later(t, 0.6)
    row = run_row(engine, agent.run_id)
    commands = judge(row, now, cfg.daemon, Killer().host)
    dying = Enforcer(Killer(allowed_users=[ME]), Memory(state))
    with pytest.raises(Crash):
        with engine.begin() as conn:
            assert dying.execute(conn, commands[0], row, checks(row, now, attestor.sealer))
            assert wait_until(lambda: "SIGTERM" in received(log)), agent.log()
            raise Crash
    assert run_row(engine, agent.run_id).signal_stage is None  # the store never heard of the SIGTERM
    dying.memory.close()

    # Restarted: a daemon with the same state file ticks, inside and then past the term grace.
    memory = Memory(state)
    tk = Ticker(engine, cfg, Killer(allowed_users=[ME]), sealer=attestor.sealer, memory=memory)
    tk.tick(later(t, 0.7))
    assert run_row(engine, agent.run_id).signal_stage == lc.Stage.TERM  # put back from the state file
    assert execute(engine, Enforcer(Killer(allowed_users=[ME]), memory), commands, later(t, 0.7),
                   attestor.sealer) == [False]  # and the replayed list finds its step taken
    assert sentinel(agent.pid, log) == ["SIGTERM", "SIGUSR1"]
    tk.tick(later(t, 1.2))  # the ladder goes on from there: SIGKILL
    assert agent.wait() == -signal.SIGKILL
    assert actions(engine, agent.run_id)[-1] == "sigkill"


# PostgreSQL only: SQLite's writers never overlap (BEGIN IMMEDIATE); the sequential cases above cover it.
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_two_enforcers_racing_on_one_postgresql_store_take_the_step_once(db_url, engine, procs, attest, tmp_path):
    """Two daemons, two state files, one command, at once: the second waits on the row's lock
    until the first commits, then finds the stage moved."""
    attestor = attest(db_url)
    log = tmp_path / "signals.log"
    agent, t, cfg = stopped_runaway(db_url, engine, procs, attestor, log)
    now = later(t, 0.6)
    row = run_row(engine, agent.run_id)
    (command,) = judge(row, now, cfg.daemon, Killer().host)
    one = Enforcer(Killer(allowed_users=[ME]), Memory(str(tmp_path / "one.state")))
    other = Enforcer(Killer(allowed_users=[ME]), Memory(str(tmp_path / "other.state")))

    outcome: dict[str, bool] = {}

    def race() -> None:
        with engine.begin() as conn:
            outcome["other"] = other.execute(conn, command, row, checks(row, now, attestor.sealer))

    with engine.connect() as conn:
        with conn.begin():
            assert one.execute(conn, command, row, checks(row, now, attestor.sealer))
            assert wait_until(lambda: "SIGTERM" in received(log)), agent.log()
            racer = threading.Thread(target=race)
            racer.start()
            assert wait_until(lambda: lock_waiters(engine) >= 1)  # the other one waits on the row
        racer.join(WAIT_S)
    assert outcome == {"other": False}
    assert sentinel(agent.pid, log) == ["SIGTERM", "SIGUSR1"]
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]


def lock_waiters(engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                     "AND datname = current_database()")).scalar_one())


@pytest.mark.parametrize("column, changed", [("pid_create_time", lambda v: v + 1.0), ("kill_mode", lambda v: lc.TREE),
                                             ("host", lambda v: v + "-elsewhere")])
def test_a_command_whose_target_changed_under_it_is_dropped_and_nothing_is_signalled(
        db_url, engine, procs, attest, tmp_path, column, changed):
    """The tick hands the Ticker's enforcer the very row the judge read: the target is read again
    under the row lock (store.ladder.stage_now), so a row re-registered in between drops the step."""
    attestor = attest(db_url)
    log = tmp_path / "signals.log"
    agent, t, cfg = stopped_runaway(db_url, engine, procs, attestor, log)
    now = later(t, 0.6)
    read = run_row(engine, agent.run_id)  # the judge's read
    commands = judge(read, now, cfg.daemon, Killer().host)
    assert [c.kind for c in commands] == [Kind.SIGTERM]
    with engine.begin() as conn:  # a writer moves the row's target between the judge's read and the step
        conn.execute(update(runs).where(runs.c.id == agent.run_id)
                     .values({column: changed(getattr(read, column))}))
    enforcer = Enforcer(Killer(allowed_users=[ME]), Memory(str(tmp_path / "daemon.state")))
    with engine.begin() as conn:  # the row object the judge read, as the tick passes it
        assert enforcer.execute(conn, commands[0], read, checks(read, now, attestor.sealer)) is False

    assert sentinel(agent.pid, log) == ["SIGUSR1"]
    assert actions(engine, agent.run_id) == ["stop_requested"]
    assert run_row(engine, agent.run_id).signal_stage is None
