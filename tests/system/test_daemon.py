"""The daemon's tick against real stores, with an explicit clock.

Runs are written through the SDK (in this process where no process needs
signalling, in real child processes where one does); `Ticker.tick(now)` and
`Daemon.tick_job(now)` are driven with explicit `now` values; alerts go
through real apprise to a local SMTP server and a local HTTP server; the
daemon command runs as a real subprocess. Nothing is mocked.
"""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, select, text

from agent_procs import wait_until
from pg_support import PG_ADMIN_URL
from attest_support import short_dir
from daemon_support import ME, SEALER, actions, alerts_of, config, later, run_row, ticker
from watchdog import RunKilled, Watchdog
from watchdog.store import access
from watchdog.core import lifecycle as lc
from watchdog.daemon.process.service import Daemon
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.alerts.notify import Notifier
from watchdog.daemon.alerts.outbox import deliver_due
from watchdog.store.engine import make_engine
from watchdog.store.schema import daemons, runs, utcnow

AGENT_WATCHDOG = str(Path(sys.executable).parent / "agent-watchdog")
CLI_TIMEOUT_S = 60




# -- each policy stops its run, and only its run ---------------------------------------------------


def _steps(n, cost=None):
    def act(run):
        for _ in range(n):
            run.step(model="gpt-x", tokens_in=100, tokens_out=20, cost_eur=cost)
    return act


def _distinct_calls(n):
    def act(run):
        for i in range(n):
            run.record_tool("search", {"q": f"refund {i}"})
    return act


def _same_calls(n):
    def act(run):
        for _ in range(n):
            run.record_tool("verify_iban", {"iban": "DE00 0000"}, ok=False, error="timeout")
        run.record_tool("search", {"q": "other"})
    return act


def _heartbeat(run):
    run.heartbeat("working")


# reason: (runaway budgets, runaway's records, neighbour budgets, neighbour's records, tick at +s).
# The neighbour sits exactly at its budget: not over it, so untouched.
POLICY_CASES = {
    lc.WALL_CLOCK: ({"max_wall_s": 5.0}, _steps(1), {}, _steps(1), 6),
    lc.MAX_STEPS: ({}, _steps(13), {}, _steps(12), 0),
    lc.MAX_TOOL_CALLS: ({"max_tool_calls": 5}, _distinct_calls(6), {"max_tool_calls": 5}, _distinct_calls(5), 0),
    lc.MAX_COST: ({}, _steps(1, cost=2.01), {}, _steps(1, cost=2.0), 0),
    lc.LOOP_DETECTED: ({}, _same_calls(3), {}, _same_calls(2), 0),
    lc.HEARTBEAT_TIMEOUT: ({"heartbeat_timeout_s": 5.0}, _heartbeat, {}, _heartbeat, 6),
}


@pytest.mark.parametrize("reason", list(POLICY_CASES))
def test_each_policy_stops_only_its_run(reason, engine, wd):
    r_budgets, r_act, h_budgets, h_act, offset_s = POLICY_CASES[reason]
    tk = ticker(engine)
    with wd.run("bot", guards=False, **h_budgets) as healthy:
        with pytest.raises(RunKilled) as stopped:
            with wd.run("bot", guards=False, **r_budgets) as runaway:
                r_act(runaway)
                h_act(healthy)
                now = later(utcnow(), offset_s)
                rep = tk.tick(now)
                assert rep.stops == [(runaway.id, reason)]
                assert rep.active == 2 and rep.lost == [] and rep.alarms == []

                row = run_row(engine, runaway.id)
                assert (row.status, row.stop_reason, row.stop_requested_at) == (lc.STOPPING, reason, now)
                assert actions(engine, runaway.id) == ["stop_requested"]
                (alert,) = alerts_of(engine, runaway.id)
                assert alert.title == f"agent-watchdog: stopped run {runaway.id[:8]} — {reason}"

                # The neighbour: still running, no intervention, no alert.
                h = run_row(engine, healthy.id)
                assert (h.status, h.stop_reason, h.stop_requested_at) == (lc.RUNNING, None, None)
                assert actions(engine, healthy.id) == [] and alerts_of(engine, healthy.id) == []

                # A second tick at the same moment changes nothing: once per stop.
                assert tk.tick(now).stops == []
                assert actions(engine, runaway.id) == ["stop_requested"]

                runaway.heartbeat()  # the SDK sees the stop on the run's next write
        assert stopped.value.reason == reason
        healthy.heartbeat("still fine")
    assert run_row(engine, runaway.id).status == lc.KILLED
    assert run_row(engine, runaway.id).stop_reason == reason
    assert run_row(engine, healthy.id).status == lc.COMPLETED
    assert actions(engine, healthy.id) == []


def test_process_gone_marks_only_that_run_lost(engine, db_url, wd, procs):
    agent = procs.start("runaway", db_url, steps=1, then="exit")
    assert agent.wait() == 0
    with wd.run("bot", guards=False) as healthy:
        healthy.step()
        # 30 s on: the daemon reads the identity even if the pid was reused meanwhile (then it names
        # another process: still gone). The healthy run is well within its 120 s heartbeat budget.
        rep = ticker(engine).tick(later(utcnow(), 30))
        assert rep.lost == [agent.run_id] and rep.stops == []
        row = run_row(engine, agent.run_id)
        assert (row.status, row.stop_reason) == (lc.LOST, lc.PROCESS_GONE)
        assert row.ended_at is not None
        assert actions(engine, agent.run_id) == ["lost"]
        (alert,) = alerts_of(engine, agent.run_id)
        assert alert.title == f"agent-watchdog: lost run {agent.run_id[:8]} — process_gone"
        assert f"process {agent.pid}" in alert.body
        assert run_row(engine, healthy.id).status == lc.RUNNING
        assert actions(engine, healthy.id) == []
    assert run_row(engine, healthy.id).status == lc.COMPLETED


def test_tool_rate_alarms_once_with_on_rate_alert_and_stops_with_on_rate_stop(engine, wd):
    cfg = config(agents={"stop-bot": {"on_rate": "stop"}})
    tk = ticker(engine, cfg)
    with wd.run("alarm-bot", guards=False) as alarmed, wd.run("stop-bot", guards=False) as stopped:
        for run in (alarmed, stopped):
            _distinct_calls(16)(run)
        now = utcnow()
        rep = tk.tick(now)
        assert rep.alarms == [alarmed.id]
        assert rep.stops == [(stopped.id, lc.TOOL_RATE)]

        assert run_row(engine, alarmed.id).status == lc.RUNNING
        assert actions(engine, alarmed.id) == ["rate_alarm"]
        (alert,) = alerts_of(engine, alarmed.id)
        assert alert.title == f"agent-watchdog: LOOP? run {alarmed.id[:8]}: 16 tool calls/min"
        assert 'alert only (on_rate = "alert")' in alert.body

        assert run_row(engine, stopped.id).status == lc.STOPPING
        assert run_row(engine, stopped.id).stop_reason == lc.TOOL_RATE

        # One alarm per run per minute, however many ticks see the rate.
        assert tk.tick(later(now, 1)).alarms == []
        assert actions(engine, alarmed.id) == ["rate_alarm"]
        alarmed.heartbeat()  # not stopped: its writes go on


def test_a_restarted_daemon_does_not_repeat_a_rate_alarm_in_the_same_minute(engine, wd):
    with wd.run("bot", guards=False) as run:
        _distinct_calls(16)(run)
        now = utcnow()
        if now.timestamp() % 60 > 55:  # keep both ticks inside one alarm minute
            now = later(now, 60 - now.timestamp() % 60 + 0.5)
        assert ticker(engine).tick(now).alarms == [run.id]
        assert ticker(engine).tick(later(now, 2)).alarms == []  # a new daemon, same minute
        assert actions(engine, run.id) == ["rate_alarm"]
        assert len(alerts_of(engine, run.id)) == 1


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # SQLite's tick reads hold the write lock
def test_a_run_that_starts_while_a_tick_reads_is_not_missed(engine, wd):
    # PostgreSQL reads committed rows statement by statement: a run (and its first tool calls)
    # committed between the tick's "active runs" query and its "new events" query must still
    # have those calls counted on the next tick.
    # The tick's first read is the active runs (a full tick) or the change feed (an incremental
    # one, issue 25): the run commits right after whichever it is.
    tk = ticker(engine)
    tk.tick(utcnow())  # warm: later ticks read only new events
    load_active, read_feed = tk.scanner.load_active, tk.active.feed.read_rows
    late = []

    def a_run_starts():
        if not late:
            run = wd.run("bot", guards=False).start()
            for _ in range(3):
                run.record_tool("verify_iban", {"iban": "DE00 0000"})
            late.append(run)

    def load_then_a_run_starts(conn, hosts=None):
        rows = load_active(conn, hosts)
        a_run_starts()
        return rows

    def feed_then_a_run_starts(*args, **kwargs):
        got = read_feed(*args, **kwargs)
        a_run_starts()
        return got

    tk.scanner.load_active = load_then_a_run_starts
    tk.active.feed.read_rows = feed_then_a_run_starts
    assert tk.tick(utcnow()).stops == []  # the run was not active yet when this tick looked
    (run,) = late
    assert tk.tick(utcnow()).stops == [(run.id, lc.LOOP_DETECTED)]


# -- alerts ---------------------------------------------------------------------------------------------


def test_alert_names_the_top_tool_and_the_budgets_and_arrives_by_mail_and_json(engine, wd, smtp, http):
    with pytest.raises(RunKilled):
        with wd.run("support-bot", kill_mode="process", guards=False) as run:
            _steps(13)(run)
            for i in range(7):
                run.record_tool("verify_iban", {"iban": f"DE{i:02}"}, ok=False, error="upstream timeout")
            run.record_tool("search", {"q": "refund"})
            now = utcnow()
            assert ticker(engine).tick(now).stops == [(run.id, lc.MAX_STEPS)]

            notifier = Notifier([smtp.url(), http.url()])
            rep = deliver_due(engine, notifier, now, sealer=SEALER)
            assert (rep.delivered, rep.failed) == (1, 0)
            run.heartbeat()
    id8 = run.id[:8]
    title = f"agent-watchdog: stopped run {id8} — max_steps"

    assert smtp.wait_for(1) and http.wait_for(1)
    (mail,) = smtp.messages
    (post,) = http.received
    assert mail["Subject"] == title
    assert post["title"] == title
    body = mail.get_content()
    assert post["message"].splitlines() == body.splitlines()
    lines = body.splitlines()
    assert f"agent «support-bot»   run {run.id}" in lines
    assert f"host «{run_row(engine, run.id).host}»   pid {os.getpid()}   kill_mode process" in lines
    assert "reason max_steps: steps 13/12" in lines
    assert "action cooperative stop requested; SIGTERM after the cancel grace if it has not ended" in lines
    assert "steps 13/12  ← OVER" in lines
    assert "tool calls 8/40 (7 errors)" in lines
    assert "cost 0.00/2.00 EUR" in lines
    assert any(line.startswith("duration ") and line.endswith("/300 s") for line in lines)
    assert "top tool: «verify_iban» ×7 (87%), 7 errors — last error: «upstream timeout»" in lines
    assert lines[-1] == f"agent-watchdog show {run.id}"  # whole: 8 characters may name two runs

    (row,) = alerts_of(engine, run.id)
    assert row.delivered_at == now and row.attempts == 1 and len(_ids(row.delivered_targets)) == 2
    # Delivered is delivered: a later pass (or a restarted daemon's notifier) sends nothing.
    assert deliver_due(engine, Notifier([smtp.url(), http.url()]), later(now, 3600), sealer=SEALER).delivered == 0
    assert len(smtp.messages) == 1 and len(http.received) == 1


def test_an_alert_target_that_fails_then_recovers_gets_the_alert_once(engine, wd, smtp, http):
    with wd.run("bot", guards=False, max_steps=1) as run:
        _steps(2)(run)
        now = utcnow()
        assert ticker(engine).tick(now).stops == [(run.id, lc.MAX_STEPS)]
        notifier = Notifier([smtp.url(), http.url()])
        http_id = next(t.id for t in notifier.targets if t.privacy_url.startswith("json"))
        smtp_id = next(t.id for t in notifier.targets if t.privacy_url.startswith("mailto"))

        http.fail_next(1)
        rep = deliver_due(engine, notifier, now, retry_s=30, sealer=SEALER)
        assert (rep.delivered, rep.failed) == (0, 1)
        assert http.rejected == 1 and smtp.wait_for(1)
        (alert,) = alerts_of(engine, run.id)
        assert alert.delivered_at is None and alert.attempts == 1
        assert _ids(alert.delivered_targets) == [smtp_id]
        assert alert.next_attempt_at == later(now, 30)
        assert "json://" in alert.last_error

        # Not due before its backoff: nothing is sent.
        assert deliver_due(engine, notifier, later(now, 29), retry_s=30, sealer=SEALER).delivered == 0
        assert http.rejected == 1 and http.received == []

        # A restarted daemon (new notifier, same URLs) retries at the backoff: the webhook gets it,
        # the mail server, which already has it, does not get it again.
        rep = deliver_due(engine, Notifier([smtp.url(), http.url()]), later(now, 30), retry_s=30, sealer=SEALER)
        assert (rep.delivered, rep.failed) == (1, 0)
        assert http.wait_for(1)
        (alert,) = alerts_of(engine, run.id)
        assert alert.delivered_at == later(now, 30) and alert.attempts == 2
        assert sorted(_ids(alert.delivered_targets)) == sorted([smtp_id, http_id]) and alert.last_error is None

        assert deliver_due(engine, notifier, later(now, 3600), retry_s=30, sealer=SEALER).delivered == 0
        assert len(smtp.messages) == 1 and len(http.received) == 1
        assert smtp.messages[0]["Subject"] == http.received[0]["title"] == alert.title


# -- the store goes away during a tick -----------------------------------------------------------------


@pytest.fixture
def own_pg_database(pg_server_url):
    """A PostgreSQL database of this test's own: the session database is shared, this one goes offline."""
    name = f"aw_outage_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    engine = make_engine(url)
    access.upgrade(engine)
    try:
        yield admin, name, engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _outage_scenario(engine, url, go_down, come_back, caplog):
    """A warm daemon; three runs go over budget; the store goes away between two ticks, then in the
    middle of a tick; it comes back and the next tick does the work."""
    daemon = Daemon(engine, config(), notifier=Notifier([]))
    sdk = Watchdog(url)
    started = [sdk.run("bot", guards=False, max_steps=3).start() for _ in range(3)]
    for run in started:
        _steps(2)(run)
    now = utcnow()
    rep = daemon.tick_job(now)
    assert rep is not None and rep.active == 3 and rep.stops == []
    for run in started:
        _steps(2)(run)
    sdk.close()

    def failed_tick(at):
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert daemon.tick_job(at) is None
            assert daemon.deliver_job(at) is None
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        messages = [r.getMessage() for r in errors]
        # One line per job, no traceback, and no per-run retries against a store that is gone.
        assert [m.split(":")[0] for m in messages] == ["tick failed, retrying next tick",
                                                      "alert delivery failed, retrying next tick"], messages
        assert "OperationalError" in messages[0]
        assert all(len(m.splitlines()) == 1 and r.exc_info is None for m, r in zip(messages, errors))

    # 1. Down between two ticks.
    go_down()
    try:
        failed_tick(later(now, 1))
    finally:
        come_back()

    # 2. Down in the middle of a tick: after its reads, before its first write.
    live_pids = daemon.ticker._live_pids

    def reads_done_then_the_store_goes_down():
        go_down()
        return live_pids()

    daemon.ticker._live_pids = reads_done_then_the_store_goes_down
    try:
        failed_tick(later(now, 2))
    finally:
        come_back()
        daemon.ticker._live_pids = live_pids
    with engine.connect() as conn:
        assert conn.execute(select(runs.c.status)).scalars().all() == [lc.RUNNING] * 3

    # 3. Back: the next tick does what the failed ones could not, once.
    rep = daemon.tick_job(later(now, 3))
    assert rep is not None and sorted(rep.stops) == sorted((run.id, lc.MAX_STEPS) for run in started)
    for run in started:
        assert run_row(engine, run.id).status == lc.STOPPING
        assert actions(engine, run.id) == ["stop_requested"]
    assert daemon.deliver_job(later(now, 3)).delivered == 3


def test_postgresql_outage_during_a_tick_is_survived(own_pg_database, caplog):
    admin, name, engine = own_pg_database

    def go_down():
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false'))
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                         {"n": name})

    def come_back():
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true'))

    url = engine.url.render_as_string(hide_password=False)
    _outage_scenario(engine, url, go_down, come_back, caplog)


def test_sqlite_locked_during_a_tick_is_survived(sqlite_url, caplog):
    # The store's 30 s busy timeout would make this test wait 30 s per locked call:
    # the daemon's engine here gets a 0.3 s one, set the same way (a PRAGMA on connect).
    engine = make_engine(sqlite_url)
    event.listen(engine, "connect", lambda dbapi_conn, _rec: dbapi_conn.execute("PRAGMA busy_timeout=300"))
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None, timeout=30)

    def go_down():
        holder.execute("BEGIN EXCLUSIVE")

    def come_back():
        holder.execute("COMMIT")

    try:
        _outage_scenario(engine, sqlite_url, go_down, come_back, caplog)
    finally:
        holder.close()
        engine.dispose()


# -- the daemon as a real process -------------------------------------------------------------------


def _toml(path: Path, db_url: str, alert_urls=(), tick_s=0.2) -> Path:
    """The daemon's config; its attestation socket is at SOCKET_OF[path]."""
    urls = ", ".join(f'"{u}"' for u in alert_urls)
    folder = short_dir()
    SOCKET_OF[path] = str(folder / "attest.sock")
    path.write_text(
        f'[store]\nurl = "{db_url}"\n\n'
        f"[daemon]\ntick_s = {tick_s}\ncancel_grace_s = 0.5\nterm_grace_s = 0.5\nalert_retry_s = 1\n"
        f'allowed_users = ["{ME}"]\nkey_file = "{folder / "attest.key"}"\nsocket = "{SOCKET_OF[path]}"\n'
        f'state_dir = "{folder}"\n\n'
        f"[alerts]\nurls = [{urls}]\n")
    return path


SOCKET_OF: dict[Path, str] = {}


class DaemonProc:
    def __init__(self, tmp_path: Path, cfg: Path, name="daemon"):
        self.log_path = tmp_path / f"{name}.log"
        env = dict(os.environ)
        env.pop("AGENT_WATCHDOG_DB", None)
        env.pop("AGENT_WATCHDOG_CONFIG", None)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([AGENT_WATCHDOG, "run", "--config", str(cfg)], env=env,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the daemon ignored SIGTERM\n{self.log()}") from None


@pytest.fixture
def daemon_procs(tmp_path):
    started: list[DaemonProc] = []

    def start(cfg, name="daemon"):
        d = DaemonProc(tmp_path, cfg, name)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def _holds_lease(engine, pid) -> bool:
    """The lease row names `pid` and is live (a released lease stays, expired, naming its last holder)."""
    with engine.connect() as conn:
        row = conn.execute(select(daemons.c.pid, daemons.c.expires_at)).first()
    return row is not None and row.pid == pid and row.expires_at is not None and row.expires_at > utcnow()


def test_agent_watchdog_run_stops_a_runaway_process_and_exits_0_on_sigterm(tmp_path, db_url, engine, procs, http,
                                                                       daemon_procs, monkeypatch):
    # A runaway that ignores SIGTERM and has stopped writing: the whole ladder, in real time.
    # The daemon runs first, as under systemd: the agent attests its process over its socket.
    cfg = _toml(tmp_path / "wd.toml", db_url, [http.url()])
    daemon = daemon_procs(cfg)
    assert wait_until(lambda: os.path.exists(SOCKET_OF[cfg]), 60), daemon.log()
    monkeypatch.setenv("AGENT_WATCHDOG_SOCKET", SOCKET_OF[cfg])
    agent = procs.start("runaway", db_url, kill_mode="process", budgets={"max_steps": 3}, steps=4,
                        ignore_sigterm=True, then="hang")

    assert agent.wait(timeout_s=60) == -signal.SIGKILL, daemon.log()
    assert wait_until(lambda: run_row(engine, agent.run_id).status == lc.KILLED, 60), daemon.log()
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigkill", "ended"]
    assert http.wait_for(2, timeout_s=60), daemon.log()
    titles = [p["title"] for p in http.received]
    assert titles[0] == f"agent-watchdog: stopped run {agent.run_id[:8]} — max_steps"
    assert titles[1].startswith(f"agent-watchdog: signalled run {agent.run_id[:8]}")
    assert _holds_lease(engine, daemon.proc.pid)

    assert daemon.stop() == 0, daemon.log()
    log = daemon.log()
    assert "stop requested: bot run" in log and "SIGTERM: finishing the current tick and exiting" in log
    assert "Traceback" not in log
    assert not _holds_lease(engine, daemon.proc.pid)  # the lease is released on the way out
    assert len(http.received) == 2


def test_a_second_daemon_on_the_same_store_and_host_refuses_to_start(tmp_path, db_url, engine, daemon_procs):
    cfg = _toml(tmp_path / "wd.toml", db_url)
    first = daemon_procs(cfg, "first")
    assert wait_until(lambda: _holds_lease(engine, first.proc.pid), 60), first.log()

    second = subprocess.run([AGENT_WATCHDOG, "run", "--config", str(cfg)], capture_output=True, text=True,
                            timeout=CLI_TIMEOUT_S)
    assert second.returncode == 0  # not a failure: the host is watched (systemd leaves it at that)
    assert second.stdout == ""
    (line,) = second.stderr.strip().splitlines()
    assert line.startswith(f"agent-watchdog: another agent-watchdog daemon (pid {first.proc.pid}, started ")
    assert line.endswith(f"is already watching this store on {Killer().host}; this one exits")
    assert _holds_lease(engine, first.proc.pid)  # the refused one took nothing away
    assert first.proc.poll() is None

    assert first.stop() == 0, first.log()
    # Once the first is gone, a daemon starts (here: one tick) and releases the lease.
    once = subprocess.run([AGENT_WATCHDOG, "run", "--once", "--config", str(cfg)], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)
    assert once.returncode == 0, once.stderr
    assert once.stdout.startswith("tick: 0 active, 0 stopping, 0 stop(s) requested")


def test_an_in_process_guard_stop_is_recorded_and_alerted_by_the_daemon(db_url, engine, wd):
    """The SDK only asks for the stop on its own row; the daemon records it and words the alert."""
    run = wd.run(agent="bot", max_steps=2).start()
    run.step(cost_eur=0.0)
    run.step(cost_eur=0.0)
    with pytest.raises(RunKilled):
        run.step(cost_eur=0.0)
    assert actions(engine, run.id) == [] and alerts_of(engine, run.id) == []  # nothing from the SDK but the row
    row = run_row(engine, run.id)
    assert (row.status, row.stop_reason) == (lc.STOPPING, lc.MAX_STEPS)
    tk = ticker(engine)
    tk.tick(utcnow())
    tk.tick(later(utcnow(), 0.1))  # once, however many ticks see it
    # The stop is recorded once, however many ticks see it (the cooperative ladder may take its
    # own next step meanwhile on a slow machine: that is another action).
    ivs = [i for i in _interventions(engine, run.id) if i.action == "stop_requested"]
    assert len(ivs) == 1, [(i.actor, i.outcome) for i in ivs]
    (iv,) = ivs
    assert (iv.action, iv.reason) == ("stop_requested", lc.MAX_STEPS) and iv.actor.startswith("daemon@")
    # (On a slow machine the ladder's next step may have its own alert: the stop has one.)
    (alert,) = [a for a in alerts_of(engine, run.id) if a.dedupe_key == f"stop:{run.id}"]
    assert alert.title == f"agent-watchdog: stopped run {run.id[:8]} — max_steps"
    assert "requested in the store" in alert.body and "in-process guard" not in alert.body
    assert alert.mac is not None


def _ids(delivered_targets) -> list:
    """The target ids of delivered_targets (its `at:<id>:<time>` entries say when, for `alerts --all`)."""
    return [t for t in delivered_targets if ":" not in t]


def _interventions(engine, run_id):
    from daemon_support import interventions_of

    return interventions_of(engine, run_id)


def test_the_published_settings_are_put_back_when_someone_else_changes_them(engine, caplog):
    from watchdog.store.schema import settings

    daemon = Daemon(engine, config(agents={"support-bot": {"max_steps": 8}}), notifier=Notifier([]))
    daemon.publish(force=True)
    with engine.connect() as conn:
        mine = conn.execute(select(settings.c.value)).scalar()
    caplog.set_level(logging.WARNING)
    daemon.tick_job(utcnow())
    assert "changed by someone else" not in caplog.text  # an untouched row costs one read, nothing more
    with engine.begin() as conn:
        conn.execute(settings.update().values(value={**mine, "prices": {"gpt-x": {"input_eur_per_mtok": 0,
                                                                                  "output_eur_per_mtok": 0}}}))
    daemon.tick_job(utcnow())
    with engine.connect() as conn:
        assert conn.execute(select(settings.c.value)).scalar() == mine  # put back within the tick
