"""Review (hostile): a store writer that moves its stopping run's `signal_stage` forward, to `term`
with a `signalled_at` long past (as if the SIGTERM had been sent and ignored), gets no SIGKILL from
the judge's command: the enforcer goes by the daemon's own record of the stages it reached, which
says none, and drops it. The cooperative stage and the SIGTERM are not skipped."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import update

from daemon_support import ME, later, run_row
from test_enforcer import execute, received, sentinel, stopped_runaway
from watchdog.core import lifecycle as lc
from watchdog.daemon.stops.commands import Kind, judge
from watchdog.daemon.stops.enforcer import Enforcer
from watchdog.daemon.stops.killer import Killer
from watchdog.store.memory import Memory
from watchdog.store.schema import runs


def test_a_forged_term_stage_gets_no_sigkill(db_url, engine, procs, attest, tmp_path):
    attestor = attest(db_url)
    log = tmp_path / "signals.log"
    agent, t, cfg = stopped_runaway(db_url, engine, procs, attestor, log)
    with engine.begin() as conn:  # the writer's forgery: "SIGTERMed an hour ago"
        conn.execute(update(runs).where(runs.c.id == agent.run_id).values(
            signal_stage=lc.Stage.TERM, signalled_at=t - dt.timedelta(hours=1)))
    now = later(t, 0.6)
    commands = judge(run_row(engine, agent.run_id), now, cfg.daemon, Killer().host)
    assert [c.kind for c in commands] == [Kind.SIGKILL]  # the judge believes the row: the enforcer must not
    enforcer = Enforcer(Killer(allowed_users=[ME]), Memory(str(tmp_path / "daemon.state")))
    assert execute(engine, enforcer, commands, now, attestor.sealer) == [False]
    assert sentinel(agent.pid, log) == ["SIGUSR1"]  # alive, and never signalled
    assert received(log) == ["SIGUSR1"]
