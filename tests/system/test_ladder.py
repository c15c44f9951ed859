"""The stop ladder against real agent processes and real signals.

cooperative stop → (cancel_grace) SIGTERM → (term_grace) SIGKILL, with its
state in the store. The clock is explicit: each tick is given its `now`, so
the graces (0.5 s here) are never slept; only real process exits are waited
for, with generous bounds. Agents are real child processes writing through
the SDK (tests/agent_procs.py).
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from sqlalchemy import text
from sqlalchemy import update

from agent_procs import process_gone, wait_until, sigterm_pending
from daemon_support import ME, actions, alerts_of, config, interventions_of, later, run_row
from watchdog.core import lifecycle as lc
from watchdog.daemon.process.service import Daemon
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.alerts.notify import Notifier
from watchdog.store.schema import runs, utcnow
from watchdog.daemon.tick.ticker import Ticker

AGENT_WATCHDOG = str(Path(sys.executable).parent / "agent-watchdog")
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


@pytest.fixture
def attestor(attest, db_or_sqlite_url):
    """This host's daemon socket on the test's store: the agents attest to it, the ticker verifies."""
    return attest(db_or_sqlite_url)


@pytest.fixture
def db_or_sqlite_url(request):
    return request.getfixturevalue("db_url" if "db_url" in request.fixturenames else "sqlite_url")


def ticker(engine, attestor, cfg=None, killer=None) -> Ticker:
    return Ticker(engine, cfg or config(), killer or Killer(allowed_users=[ME]), sealer=attestor.sealer)




def outcome_of(engine, run_id, action) -> str:
    (iv,) = [i for i in interventions_of(engine, run_id) if i.action == action]
    return iv.outcome


RUNAWAY = dict(kill_mode="process", budgets={"max_steps": 3}, steps=4)


# -- the cooperative path ---------------------------------------------------------------------------


def test_the_agent_sees_the_stop_on_its_next_write_and_the_run_ends_killed(db_url, engine, procs, attestor):
    agent = procs.start("runaway", db_url, **RUNAWAY, then="loop")
    tk = ticker(engine, attestor)
    t = utcnow()
    assert tk.tick(t).stops == [(agent.run_id, lc.MAX_STEPS)]

    assert agent.wait() == 0, agent.log()  # it left through RunKilled, not through a signal
    result = agent.result()
    assert result["killed"] == lc.MAX_STEPS and result["detail"].endswith("/3")
    row = run_row(engine, agent.run_id)
    assert (row.status, row.stop_reason, row.signal_stage) == (lc.KILLED, lc.MAX_STEPS, None)
    assert row.ended_at is not None

    # Well past both graces: the run is over, the daemon has nothing left to do.
    rep = tk.tick(later(t, 10))
    assert rep.active == 0
    assert actions(engine, agent.run_id) == ["stop_requested"]
    assert [a.dedupe_key for a in alerts_of(engine, agent.run_id)] == [f"stop:{agent.run_id}"]


# -- SIGTERM, then SIGKILL ------------------------------------------------------------------------------


def test_a_sigterm_ignoring_agent_gets_sigterm_then_sigkill(db_url, engine, procs, attestor):
    agent = procs.start("runaway", db_url, **RUNAWAY, ignore_sigterm=True, then="hang")
    tk = ticker(engine, attestor)
    t = utcnow()
    assert tk.tick(t).stops == [(agent.run_id, lc.MAX_STEPS)]

    tk.tick(later(t, 0.4))  # inside the cancel grace: wait
    assert actions(engine, agent.run_id) == ["stop_requested"]

    tk.tick(later(t, 0.6))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]
    assert run_row(engine, agent.run_id).signal_stage == "term"
    assert outcome_of(engine, agent.run_id, "sigterm") == f"SIGTERM sent to pid {agent.pid}"
    assert agent.alive()  # it ignores SIGTERM

    tk.tick(later(t, 0.9))  # inside the term grace: wait
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]

    tk.tick(later(t, 1.2))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigkill"]
    # Dead, not reaped yet (we are its parent and have not waited): a zombie counts as gone.
    assert wait_until(lambda: psutil.Process(agent.pid).status() == psutil.STATUS_ZOMBIE)

    tk.tick(later(t, 1.3))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigkill", "ended"]
    assert agent.wait() == -signal.SIGKILL
    row = run_row(engine, agent.run_id)
    assert (row.status, row.stop_reason, row.signal_stage, row.ended_at) == (
        lc.KILLED, lc.MAX_STEPS, "done", later(t, 1.3))
    assert outcome_of(engine, agent.run_id, "sigkill") == f"SIGKILL sent to pid {agent.pid}"
    assert outcome_of(engine, agent.run_id, "ended") == "ignored SIGTERM for 0.5 s; SIGKILL; gone within 0.1 s"

    stop, escalation = alerts_of(engine, agent.run_id)
    assert stop.title == f"agent-watchdog: stopped run {agent.run_id[:8]} — max_steps"
    assert escalation.title == f"agent-watchdog: signalled run {agent.run_id[:8]} — max_steps"
    assert "ladder ignored SIGTERM for 0.5 s; SIGKILL" in escalation.body
    assert tk.tick(later(t, 5)).active == 0  # and nothing more, ever
    assert len(alerts_of(engine, agent.run_id)) == 2


def test_kill_mode_tree_kills_the_agent_its_child_and_its_grandchild(sqlite_url, procs, attestor):
    from watchdog.store.engine import make_engine

    engine = make_engine(sqlite_url)
    # The children ignore SIGTERM: they outlive the agent (reparented away from it) and get SIGKILL.
    agent = procs.start("runaway", sqlite_url, kill_mode="tree", budgets={"max_steps": 3}, steps=4, children=2,
                        children_ignore_sigterm=True, then="hang")
    assert len(agent.children) == 2
    idents = {pid: psutil.Process(pid).create_time() for pid in agent.children}
    assert os.getpgid(agent.children[0]) == os.getpgid(agent.children[1]) == agent.pid  # its process group
    tk = ticker(engine, attestor)
    t = utcnow()
    tk.tick(t)
    tk.tick(later(t, 0.6))
    assert outcome_of(engine, agent.run_id, "sigterm") == f"SIGTERM sent to pid {agent.pid} and 2 children"
    assert agent.wait() == -signal.SIGTERM
    assert not any(process_gone(pid, ct) for pid, ct in idents.items())

    tk.tick(later(t, 1.2))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigkill"]
    assert outcome_of(engine, agent.run_id, "sigkill") == (
        f"SIGKILL not sent to pid {agent.pid} (process gone); sent to 2 other processes")
    assert wait_until(lambda: all(process_gone(pid, ct) for pid, ct in idents.items())), idents

    tk.tick(later(t, 1.3))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigkill", "ended"]
    assert run_row(engine, agent.run_id).status == lc.KILLED
    engine.dispose()


def test_a_run_started_before_its_daemon_is_attested_on_a_later_write(db_url, engine, procs, monkeypatch):
    from attest_support import Attestor, short_dir

    folder = short_dir()
    monkeypatch.setenv("AGENT_WATCHDOG_SOCKET", str(folder / "attest.sock"))  # nobody listens there yet
    agent = procs.start("runaway", db_url, **RUNAWAY, ignore_sigterm=True, then="attest_then_hang",
                        attest_retry_s=0.2)
    assert agent.info["attested"] is False
    late = Attestor(db_url, socket=str(folder / "attest.sock")).start()  # the daemon comes up
    try:
        assert wait_until(lambda: attestation_of(engine, agent.run_id) is not None), agent.log()
        assert attestation_of(engine, agent.run_id).pid == agent.pid
        tk = ticker(engine, late)
        t = utcnow()
        assert tk.tick(t).stops == [(agent.run_id, lc.MAX_STEPS)]
        tk.tick(later(t, 0.6))
        tk.tick(later(t, 1.2))
        assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigkill"]
        assert agent.wait() == -signal.SIGKILL
    finally:
        late.close()


def attestation_of(engine, run_id):
    from sqlalchemy import select

    from watchdog.store.schema import attestations

    with engine.connect() as conn:
        return conn.execute(select(attestations).where(attestations.c.run_id == run_id)).first()


# -- identity before every signal ----------------------------------------------------------------------


def test_a_process_whose_create_time_does_not_match_is_not_signalled(db_url, engine, procs, attestor):
    agent = procs.start("runaway", db_url, **RUNAWAY, block_sigterm=True, then="hang")
    tk = ticker(engine, attestor)
    t = utcnow()
    tk.tick(t)
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == agent.run_id)
                     .values(pid_create_time=runs.c.pid_create_time - 3600))

    # The row no longer names the process that attested (nor any running one): nothing is
    # signalled on either's word, and that is said in the audit and the alert.
    for dt_s in (0.6, 1.2, 5):
        tk.tick(later(t, dt_s))
        assert not sigterm_pending(agent.pid) and agent.alive()
    assert actions(engine, agent.run_id) == ["stop_requested", "signal_refused"]
    assert outcome_of(engine, agent.run_id, "signal_refused") == (
        "not signalled: identity not attested (the run row no longer matches what was attested)")
    # Once the daemon re-reads /proc (the row's identity names no live process), the run is over.
    tk.tick(later(t, 11))
    assert not sigterm_pending(agent.pid) and agent.alive()
    assert actions(engine, agent.run_id) == ["stop_requested", "signal_refused", "ended"]
    row = run_row(engine, agent.run_id)
    assert (row.status, row.stop_reason, row.signal_stage) == (lc.KILLED, lc.MAX_STEPS, "done")
    assert [a.dedupe_key for a in alerts_of(engine, agent.run_id)] == [f"stop:{agent.run_id}",
                                                                      f"escalate:{agent.run_id}"]


def test_a_refused_signal_is_recorded_and_alerted_and_the_run_ends_with_its_process(db_url, engine, procs, attestor):
    me = pwd.getpwuid(os.geteuid()).pw_name
    agent = procs.start("runaway", db_url, **RUNAWAY, block_sigterm=True, then="hang")
    tk = ticker(engine, attestor, killer=Killer(allowed_users=["nobody"]))  # the agent's user is not allowed
    t = utcnow()
    tk.tick(t)
    tk.tick(later(t, 0.6))
    assert not sigterm_pending(agent.pid) and agent.alive()
    assert actions(engine, agent.run_id) == ["stop_requested", "signal_refused"]
    refusal = f"not signalled: user {me!r} not in allowed_users ['nobody']"
    assert outcome_of(engine, agent.run_id, "signal_refused") == refusal
    row = run_row(engine, agent.run_id)
    assert (row.status, row.signal_stage) == (lc.STOPPING, "refused")
    stop, refused = alerts_of(engine, agent.run_id)
    # issue 36: the signal was refused, the run goes on: the title says what happened
    assert refused.title == f"agent-watchdog: run {agent.run_id[:8]} asked to stop; not signalled — max_steps"
    assert f"ladder {refusal}" in refused.body.splitlines()
    tk.tick(later(t, 5))
    assert actions(engine, agent.run_id) == ["stop_requested", "signal_refused"]
    assert not sigterm_pending(agent.pid)

    # Its process goes away by other means: the run is ended, not left `stopping` forever.
    agent.proc.kill()
    assert agent.wait() == -signal.SIGKILL
    tk.tick(later(t, 10))
    row = run_row(engine, agent.run_id)
    assert (row.status, row.stop_reason, row.ended_at) == (lc.KILLED, lc.MAX_STEPS, later(t, 10))
    assert actions(engine, agent.run_id) == ["stop_requested", "signal_refused", "ended"]
    assert tk.tick(later(t, 11)).active == 0
    assert len(alerts_of(engine, agent.run_id)) == 2


def _block_sigterm():  # preexec_fn: the blocked mask survives exec
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _spawn_with_pid(pid: int, attempts: int = 200) -> subprocess.Popen | None:
    for _ in range(attempts):
        NS_LAST_PID.write_text(str(pid - 1))
        p = subprocess.Popen(["sleep", "600"], preexec_fn=_block_sigterm)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


def test_a_recycled_pid_is_never_signalled(sqlite_url, procs, attestor):
    try:
        NS_LAST_PID.write_text(NS_LAST_PID.read_text().strip())
    except OSError as exc:
        pytest.skip(f"{NS_LAST_PID} is not writable ({exc.strerror}): cannot force a recycled pid")
    from watchdog.store.engine import make_engine

    engine = make_engine(sqlite_url)
    agent = procs.start("runaway", sqlite_url, **RUNAWAY, then="hang")
    tk = ticker(engine, attestor)
    t = utcnow()
    tk.tick(t)
    agent.proc.kill()  # the agent dies (not by the daemon)...
    assert agent.wait() == -signal.SIGKILL
    stranger = _spawn_with_pid(agent.pid)  # ...and a stranger gets its pid
    if stranger is None:
        pytest.skip("could not get the recycled pid (a busy machine took it first)")
    try:
        for dt_s in (0.6, 1.2, 5, 10):
            tk.tick(later(t, dt_s))
            assert not sigterm_pending(stranger.pid) and stranger.poll() is None
        row = run_row(engine, agent.run_id)
        assert row.status == lc.KILLED
        assert "sigterm" not in actions(engine, agent.run_id) and "sigkill" not in actions(engine, agent.run_id)
    finally:
        stranger.kill()
        stranger.wait()
        engine.dispose()


# -- restarts ----------------------------------------------------------------------------------------------


def test_a_daemon_restarted_between_sigterm_and_sigkill_finishes_the_ladder_once(db_url, engine, procs, http,
                                                                                   monkeypatch):
    cfg = config()
    first = Daemon(engine, cfg, notifier=Notifier([http.url()]))
    first.acquire()
    first.start_attesting()  # the daemon's own socket: the agent attests to it, as in production
    monkeypatch.setenv("AGENT_WATCHDOG_SOCKET", cfg.daemon.socket)
    agent = procs.start("runaway", db_url, **RUNAWAY, ignore_sigterm=True, then="hang")
    t = utcnow()

    assert first.once(t).stops == [(agent.run_id, lc.MAX_STEPS)]
    first.once(later(t, 0.6))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]
    first.release()
    del first  # restarted: nothing survives but the store

    second = Daemon(engine, cfg, notifier=Notifier([http.url()]))
    second.acquire()
    second.once(later(t, 0.6))  # the same moment again: nothing twice
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]
    second.once(later(t, 1.2))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigkill"]
    assert agent.wait() == -signal.SIGKILL
    second.once(later(t, 1.3))
    second.release()

    third = Daemon(engine, cfg, notifier=Notifier([http.url()]))
    for dt_s in (1.3, 1.4, 5, 60):
        third.once(later(t, dt_s))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigkill", "ended"]
    assert run_row(engine, agent.run_id).status == lc.KILLED
    titles = [p["title"] for p in http.received]  # deliveries are synchronous: all are in
    assert titles == [f"agent-watchdog: stopped run {agent.run_id[:8]} — max_steps",
                      f"agent-watchdog: signalled run {agent.run_id[:8]} — max_steps"]
    assert all(a.delivered_at is not None for a in alerts_of(engine))


# -- cooperative: several runs in one process ----------------------------------------------------------


def test_in_a_shared_process_only_the_looping_run_stops(tmp_path, db_url, engine, procs, attestor):
    finish = tmp_path / "finish"
    agent = procs.start("shared", db_url, finish=str(finish))
    ids = agent.info["run_ids"]
    tk = ticker(engine, attestor)
    t = utcnow()
    assert tk.tick(t).stops == [(ids["looper"], lc.LOOP_DETECTED)]
    assert wait_until(lambda: run_row(engine, ids["looper"]).status == lc.KILLED), agent.log()

    tk.tick(later(t, 5))  # past every grace: a shared process is never signalled
    for name in ("healthy1", "healthy2"):
        assert run_row(engine, ids[name]).status == lc.RUNNING
        assert actions(engine, ids[name]) == []
    assert actions(engine, ids["looper"]) == ["stop_requested"]
    assert agent.alive()

    finish.touch()
    assert agent.wait() == 0, agent.log()
    assert agent.result() == {"looper": "killed (RunKilled)", "healthy1": "completed", "healthy2": "completed"}
    assert run_row(engine, ids["looper"]).stop_reason == lc.LOOP_DETECTED
    for name in ("healthy1", "healthy2"):
        assert run_row(engine, ids[name]).status == lc.COMPLETED
    assert len(alerts_of(engine)) == 1


def test_in_a_shared_process_a_run_that_ignores_the_stop_is_alerted_not_signalled(tmp_path, db_url, engine, procs, attestor):
    finish = tmp_path / "finish"
    agent = procs.start("shared", db_url, finish=str(finish), ignore_stop=True)
    ids = agent.info["run_ids"]
    tk = ticker(engine, attestor)
    t = utcnow()
    assert tk.tick(t).stops == [(ids["looper"], lc.LOOP_DETECTED)]
    caught = Path(str(agent.ready_path) + ".caught")
    assert wait_until(caught.exists), agent.log()  # it swallowed RunKilled and stopped writing
    assert json.loads(caught.read_text()) == {"caught": "RunKilled"}

    tk.tick(later(t, 0.6))
    for dt_s in (1, 5, 60):
        tk.tick(later(t, dt_s))
    assert actions(engine, ids["looper"]) == ["stop_requested", "not_signalled"]
    assert run_row(engine, ids["looper"]).status == lc.STOPPING
    stop, escalation = alerts_of(engine, ids["looper"])
    assert escalation.title == f"agent-watchdog: run {ids['looper'][:8]} did not stop; not signalled — loop_detected"
    assert ("action none more: did not stop 0.5 s after the cooperative stop and shares its process with "
            "2 other runs; not signalled") in escalation.body.splitlines()
    assert agent.alive()
    for name in ("healthy1", "healthy2"):
        assert run_row(engine, ids[name]).status == lc.RUNNING
        assert actions(engine, ids[name]) == []

    finish.touch()
    assert agent.wait() == 0, agent.log()
    assert agent.result()["looper"] == "killed"
    assert run_row(engine, ids["looper"]).status == lc.KILLED
    for name in ("healthy1", "healthy2"):
        assert run_row(engine, ids[name]).status == lc.COMPLETED


def test_a_shared_process_that_dies_after_an_ignored_stop_ends_all_its_runs(tmp_path, db_url, engine, procs, attestor):
    agent = procs.start("shared", db_url, finish=str(tmp_path / "finish"), ignore_stop=True)
    ids = agent.info["run_ids"]
    tk = ticker(engine, attestor)
    t = utcnow()
    tk.tick(t)
    assert wait_until(Path(str(agent.ready_path) + ".caught").exists), agent.log()
    tk.tick(later(t, 0.6))
    assert actions(engine, ids["looper"]) == ["stop_requested", "not_signalled"]

    agent.proc.kill()  # e.g. the OOM killer: the daemon itself never signals a shared process
    assert agent.wait() == -signal.SIGKILL
    tk.tick(later(t, 5))
    looper = run_row(engine, ids["looper"])
    assert (looper.status, looper.stop_reason) == (lc.KILLED, lc.LOOP_DETECTED)
    assert actions(engine, ids["looper"]) == ["stop_requested", "not_signalled", "ended"]
    for name in ("healthy1", "healthy2"):
        row = run_row(engine, ids[name])
        assert (row.status, row.stop_reason) == (lc.LOST, lc.PROCESS_GONE)
    assert tk.tick(later(t, 6)).active == 0


# -- agent-watchdog kill -----------------------------------------------------------------------------------


def test_agent_watchdog_kill_stops_one_run_through_the_ladder(tmp_path, db_url, engine, procs, attestor):
    # The operator runs kill as the daemon's user (here: the key's owner): the stop is sealed
    # with the daemon's key, so the daemon may signal for it.
    cfg_path = tmp_path / "wd.toml"
    cfg_path.write_text(f"[daemon]\ncancel_grace_s = 0.5\nterm_grace_s = 0.5\nkey_file = {attestor.key_file!r}\n")
    agent = procs.start("runaway", db_url, kill_mode="process", steps=1, then="hang")
    bystander = procs.start("runaway", db_url, kill_mode="process", steps=1, then="hang")
    argv = [AGENT_WATCHDOG, "kill", agent.run_id[:8], "--reason", "x", "--db", db_url, "--config", str(cfg_path)]

    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"stop requested for bot run {agent.run_id[:8]}: it stops at its next write; "
                                   "if it has not ended 0.5 s later the daemon sends SIGTERM, then SIGKILL 0.5 s "
                                   "after that")
    row = run_row(engine, agent.run_id)
    assert (row.status, row.stop_reason, row.stop_detail) == (lc.STOPPING, lc.MANUAL, "x")
    (iv,) = interventions_of(engine, agent.run_id)
    assert (iv.action, iv.reason, iv.detail) == ("stop_requested", lc.MANUAL, "x")
    assert iv.actor.startswith("cli@")
    (alert,) = alerts_of(engine, agent.run_id)  # sealed by the key's holder
    assert alert.title == f"agent-watchdog: stopped run {agent.run_id[:8]} — manual"
    assert attestor.sealer.alert_ok(alert.mac, alert.dedupe_key, alert.title, alert.body, alert.created_at)

    tk = ticker(engine, attestor)
    t = row.stop_requested_at
    tk.tick(later(t, 0.1))
    assert len(alerts_of(engine, agent.run_id)) == 1
    assert actions(engine, agent.run_id) == ["stop_requested"]  # the CLI's own record, not a second one
    tk.tick(later(t, 0.6))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]
    assert agent.wait() == -signal.SIGTERM
    tk.tick(later(t, 0.7))
    row = run_row(engine, agent.run_id)
    assert (row.status, row.stop_reason) == (lc.KILLED, lc.MANUAL)
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "ended"]
    assert outcome_of(engine, agent.run_id, "ended").startswith("SIGTERM after 0.5 s; exited within ")

    assert bystander.alive() and run_row(engine, bystander.run_id).status == lc.RUNNING
    assert actions(engine, bystander.run_id) == []

    again = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1
    assert again.stderr.strip() == f"agent-watchdog: error: run {agent.run_id[:8]} already ended: killed"


def test_a_stop_only_written_into_the_store_never_signals_another_run(tmp_path, db_url, engine, procs, attestor):
    """Any store writer can set any run to stopping: without the daemon's decision (its own
    budgets) or a stop sealed with its key, the run is stopped cooperatively and never signalled."""
    victim = procs.start("runaway", db_url, kill_mode="process", steps=1, then="hang")
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET status = 'stopping', stop_reason = 'manual', stop_requested_at = "
                          "last_seen_at WHERE id = :id"), {"id": victim.run_id})
    tk = ticker(engine, attestor)
    t = run_row(engine, victim.run_id).stop_requested_at
    for dt_s in (0.1, 11.0, 12.0, 20.0):  # within its heartbeat timeout: it is not silent for the daemon
        tk.tick(later(t, dt_s))
    assert victim.proc.poll() is None  # alive: never signalled
    assert "sigterm" not in actions(engine, victim.run_id)
    assert actions(engine, victim.run_id).count("signal_held") == 1  # said once, however many ticks
    assert run_row(engine, victim.run_id).signal_stage is None
    bodies = " ".join(a.body for a in alerts_of(engine, victim.run_id))
    assert "do not confirm it" in bodies
