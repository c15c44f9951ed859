"""The store is not a key to CAP_KILL: hostile rows written by a real local user.

Real users (useradd; CI runs as root): `agent` (in allowed_users: its processes may be
signalled) and `mallory` (can write the store, as the README's setup lets any store
writer). The victim is a process of the *allowed* user that is not an attested run, so
the only thing between it and a signal is attestation. Each forgery leaves it alive
(SIGTERM blocked in it: a SIGTERM sent would stay pending in /proc, exact proof) and
is alerted; a real agent of the allowed user is attested and its tree killed as before.
Both stores: SQLite (any writer can write any table) and PostgreSQL.
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
from sqlalchemy import select

from agent_procs import AgentProcs, process_gone, wait_until, sigterm_pending
from alertsinks import HttpSink
from attest_support import Attestor, LocalUsers, foreign_python, shared_sqlite, short_dir
from pg_support import empty_pg as _empty_pg
from daemon_support import actions, alerts_of, config, interventions_of, later, run_row
from watchdog.core import lifecycle as lc
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.alerts.notify import Notifier
from watchdog.daemon.alerts.outbox import deliver_due
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.engine import make_engine
from watchdog.store.schema import attestations, events, utcnow

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creating local users needs root (CI runs as root)")

AGENT_WATCHDOG = str(Path(sys.executable).parent / "agent-watchdog")

# What mallory runs, as herself: plain SQL on the store, with the victim's identity read
# from the world-readable /proc. One forgery per call: argv = URL KIND JSON_ARGS.
FORGE = r"""
import datetime as dt, json, sys, uuid
from watchdog.core.procid import create_time, hostname
url, kind, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if url.startswith("sqlite"):
    import sqlite3
    conn, ph = sqlite3.connect(url.split("///", 1)[1], timeout=30), "?"
    ts = lambda t: t.strftime("%Y-%m-%d %H:%M:%S.%f")
else:
    import psycopg
    conn, ph = psycopg.connect(url.replace("+psycopg", "")), "%s"
    ts = lambda t: t
now = dt.datetime.now(dt.timezone.utc)
cur = conn.cursor()
def q(sql, params=()):
    cur.execute(sql.replace("?", ph), params)
out = {}
if kind in ("stopping_row", "attested_row"):
    rid = uuid.uuid4().hex
    pid = args["victim"]
    ct = create_time(pid)
    q("INSERT INTO runs (id, agent, status, kill_mode, host, pid, pid_create_time, started_at, last_seen_at, "
      "stop_reason, stop_detail, stop_requested_at) VALUES (?, ?, 'stopping', ?, ?, ?, ?, ?, ?, 'max_steps', ?, ?)",
      (rid, "mallory-bot", args.get("kill_mode", "process"), hostname(), pid, ct, ts(now), ts(now),
       "URGENT: wire 10k EUR to IBAN DE00 now", ts(now)))
    if kind == "attested_row":
        q("INSERT INTO attestations (run_id, host, pid, pid_create_time, uid, kill_mode, attested_at, mac) "
          "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
          (rid, hostname(), pid, ct, args["uid"], args.get("kill_mode", "process"), ts(now), args["mac"]))
    out["run_id"] = rid
elif kind == "sigterm_row":
    ct = create_time(args["victim"])
    detail = {"targets": [{"host": hostname(), "pid": args["victim"], "create_time": ct}], "skipped": []}
    if args.get("mac"):
        detail["mac"] = args["mac"]
    q("INSERT INTO interventions (at, run_id, action, reason, detail, outcome, actor) "
      "VALUES (?, ?, 'sigterm', 'max_steps', ?, 'SIGTERM sent', 'daemon@x:1')",
      (ts(now), args["run_id"], json.dumps(detail)))
elif kind == "alert_row":
    q("INSERT INTO alerts (dedupe_key, created_at, title, body, attempts, next_attempt_at, delivered_targets, "
      "sealed_by, mac) VALUES (?, ?, ?, ?, 0, ?, '[]', ?, ?)",
      (args["key"], ts(now), args["title"], args["body"], ts(now), hostname(), args.get("mac")))
elif kind == "settings":
    q("UPDATE settings SET value = ? WHERE key = 'config'", (json.dumps(args["value"]),))
conn.commit()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def users():
    made = LocalUsers()
    try:
        yield {"agent": made.add("agent"), "mallory": made.add("mallory")}
    finally:
        made.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request):
    """A migrated store both users can write: SQLite in a shared folder, or the PostgreSQL database."""
    if request.param == "sqlite":
        url, folder = shared_sqlite()
        yield url
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    else:
        url = request.getfixturevalue("pg_migrated")
        _empty_pg(url)
        yield url


@pytest.fixture
def engine(store):
    e = make_engine(store)
    yield e
    e.dispose()


@pytest.fixture
def attestor(store, monkeypatch):
    a = Attestor(store)
    a.dir.chmod(0o711)  # other users reach the socket; the key file itself stays 0600
    a.start()
    monkeypatch.setenv("AGENT_WATCHDOG_SOCKET", a.socket)
    yield a
    a.close()


@pytest.fixture
def uprocs():
    folder = short_dir("awp")
    folder.chmod(0o777)
    p = AgentProcs(folder)
    yield p
    p.close()


@pytest.fixture
def victims():
    started = []

    def start(user):
        p = subprocess.Popen(["sleep", "600"], user=user, preexec_fn=_block_sigterm)
        started.append(p)
        assert wait_until(lambda: psutil.Process(p.pid).name() == "sleep")
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def _block_sigterm():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})




def forge(user: str, url: str, kind: str, **args) -> dict:
    exe, env = foreign_python()
    done = subprocess.run([exe, "-c", FORGE, url, kind, json.dumps(args)], user=user, env=env, cwd="/tmp",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def daemon_for(engine, attestor, users) -> Ticker:
    cfg = config(daemon={"allowed_users": [users["agent"]]})
    return Ticker(engine, cfg, Killer(allowed_users=[users["agent"]]), sealer=attestor.sealer)


def deliver(engine, attestor):
    """Through real apprise to a local HTTP sink: what reached a human."""
    with HttpSink() as sink:
        deliver_due(engine, Notifier([sink.url()]), later(utcnow(), 3600), sealer=attestor.sealer)
        return sink.received


def uid_of(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


# -- a forged `stopping` row --------------------------------------------------------------------------


@pytest.mark.parametrize("kill_mode", ["process", "tree"])
def test_a_forged_stopping_row_never_gets_its_victim_signalled(store, engine, attestor, users, victims, kill_mode):
    victim = victims(users["agent"])
    rid = forge(users["mallory"], store, "stopping_row", victim=victim.pid, kill_mode=kill_mode)["run_id"]
    tk = daemon_for(engine, attestor, users)
    t = utcnow()
    for dt_s in (0, 0.6, 1.2, 5):
        tk.tick(later(t, dt_s))
        assert victim.poll() is None and not sigterm_pending(victim.pid)
    assert actions(engine, rid) == ["stop_requested", "signal_refused"]
    refused = [i for i in interventions_of(engine, rid) if i.action == "signal_refused"][0]
    assert refused.outcome == ("not signalled: identity not attested "
                               "(the run never attested itself to this host's daemon)")
    assert run_row(engine, rid).signal_stage == "refused"
    received = deliver(engine, attestor)
    titles = [r["title"] for r in received]
    assert titles == [f"agent-watchdog: stopped run {rid[:8]} — max_steps",
                      f"agent-watchdog: run {rid[:8]} asked to stop; not signalled — max_steps"]
    assert "not signalled: identity not attested" in received[1]["message"]
    # The daemon words its alerts itself: the forger's text never reaches a human.
    assert not any("wire 10k" in r["message"] for r in received)


# -- a forged `sigterm` intervention ----------------------------------------------------------------


def test_a_forged_sigterm_row_does_not_add_a_victim_to_the_sigkill(store, engine, attestor, users, victims, uprocs):
    agent = uprocs.start("runaway", store, user=users["agent"], kill_mode="process", budgets={"max_steps": 3},
                         steps=4, ignore_sigterm=True, then="hang")
    assert agent.info["attested"] is True, agent.log()
    victim = victims(users["agent"])
    tk = daemon_for(engine, attestor, users)
    t = utcnow()
    assert tk.tick(t).stops == [(agent.run_id, lc.MAX_STEPS)]
    tk.tick(later(t, 0.6))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]
    genuine = json.loads([i for i in interventions_of(engine, agent.run_id) if i.action == "sigterm"][0].detail)
    # Two forged rows, newer than the daemon's: one with no seal, one with the genuine row's seal copied.
    forge(users["mallory"], store, "sigterm_row", run_id=agent.run_id, victim=victim.pid)
    forge(users["mallory"], store, "sigterm_row", run_id=agent.run_id, victim=victim.pid, mac=genuine["mac"])

    tk.tick(later(t, 1.2))  # the SIGKILL: to what the daemon itself signalled, nothing else
    assert agent.wait() == -signal.SIGKILL
    tk.tick(later(t, 1.3))
    assert victim.poll() is None and not sigterm_pending(victim.pid)
    # The daemon's record, mallory's two rows, then the daemon again: the forgery noted, the SIGKILL, the end.
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigterm", "sigterm", "forged_row",
                                             "sigkill", "ended"]
    forged = [i for i in interventions_of(engine, agent.run_id) if i.action == "forged_row"][0]
    assert forged.outcome.startswith("2 sigterm intervention rows whose seal does not verify")
    sigkill = [i for i in interventions_of(engine, agent.run_id) if i.action == "sigkill"][0]
    assert [t["pid"] for t in json.loads(sigkill.detail)["targets"]] == [agent.pid]
    titles = [r["title"] for r in deliver(engine, attestor)]
    assert f"agent-watchdog: forged rows ignored for run {agent.run_id[:8]}" in titles


# -- a forged attestation ------------------------------------------------------------------------------


def test_a_forged_attestation_names_nobody(store, engine, attestor, users, victims, uprocs):
    victim = victims(users["agent"])
    uid = uid_of(users["agent"])
    # A genuine attestation of another run, whose MAC mallory copies.
    real = uprocs.start("runaway", store, user=users["agent"], kill_mode="process", steps=1, then="hang")
    with engine.connect() as conn:
        genuine = conn.execute(select(attestations).where(attestations.c.run_id == real.run_id)).one()
    assert (genuine.pid, genuine.uid) == (real.pid, uid)
    wrong = forge(users["mallory"], store, "attested_row", victim=victim.pid, uid=uid, mac="ab" * 32)["run_id"]
    copied = forge(users["mallory"], store, "attested_row", victim=victim.pid, uid=uid, mac=genuine.mac)["run_id"]
    tk = daemon_for(engine, attestor, users)
    t = utcnow()
    for dt_s in (0, 0.6, 1.2, 5):
        tk.tick(later(t, dt_s))
        assert victim.poll() is None and not sigterm_pending(victim.pid)
    for rid in (wrong, copied):
        assert actions(engine, rid) == ["stop_requested", "signal_refused"]
        refused = [i for i in interventions_of(engine, rid) if i.action == "signal_refused"][0]
        assert refused.outcome == ("not signalled: identity not attested (its attestation's seal does not verify "
                                   "(forged or from another daemon))")
        assert [a.dedupe_key for a in alerts_of(engine, rid)] == [f"stop:{rid}", f"escalate:{rid}"]
    assert real.alive() and actions(engine, real.run_id) == []


# -- the real thing still works -----------------------------------------------------------------------------


def test_a_real_agent_of_an_allowed_user_is_attested_and_its_tree_killed(store, engine, attestor, users, uprocs):
    agent = uprocs.start("runaway", store, user=users["agent"], kill_mode="tree", budgets={"max_steps": 3}, steps=4,
                         ignore_sigterm=True, children=2, children_ignore_sigterm=True, then="hang")
    assert agent.info["attested"] is True, agent.log()
    with engine.connect() as conn:
        a = conn.execute(select(attestations).where(attestations.c.run_id == agent.run_id)).one()
    assert (a.pid, a.uid, a.kill_mode) == (agent.pid, uid_of(users["agent"]), "tree")
    tree = {pid: psutil.Process(pid).create_time() for pid in [agent.pid, *agent.children]}
    assert all(psutil.Process(pid).username() == users["agent"] for pid in tree)
    tk = daemon_for(engine, attestor, users)
    t = utcnow()
    tk.tick(t)
    tk.tick(later(t, 0.6))
    assert [i.outcome for i in interventions_of(engine, agent.run_id) if i.action == "sigterm"] == [
        f"SIGTERM sent to pid {agent.pid} and 2 children"]
    tk.tick(later(t, 1.2))
    assert agent.wait() == -signal.SIGKILL
    assert wait_until(lambda: all(process_gone(pid, ct) for pid, ct in tree.items())), tree
    tk.tick(later(t, 1.3))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigkill", "ended"]
    assert run_row(engine, agent.run_id).status == lc.KILLED


# -- the store cannot change what agents record ---------------------------------------------------------------


def test_a_settings_flip_by_a_store_writer_does_not_make_agents_record_arguments(store, engine, attestor, users,
                                                                                uprocs):
    from watchdog.daemon.process.service import Daemon
    from watchdog.store.schema import settings

    cfg = config(daemon={"allowed_users": [users["agent"]]})
    daemon = Daemon(engine, cfg, notifier=Notifier([]))
    daemon.publish(force=True)
    published = json.loads(json.dumps(cfg.published()))
    forge(users["mallory"], store, "settings",
          value={**published, "record_args": True, "store": {"record_args": True, "record_errors": "full"}})
    secret_args = {"api_key": "sk-live-VICTIM", "card": "4111111111111111"}
    agent = uprocs.start("runaway", store, user=users["agent"], kill_mode="process",
                         tools=[["charge", secret_args, True]], then="hang")
    # And the daemon puts its own settings back on its next tick.
    daemon.tick_job(utcnow())
    with engine.connect() as conn:
        assert conn.execute(select(settings.c.value)).scalar() == published
    with engine.connect() as conn:
        (ev,) = conn.execute(select(events).where(events.c.run_id == agent.run_id, events.c.kind == "tool")).all()
    assert ev.args is None and ev.args_hash is not None
    with engine.connect() as conn:
        dump = json.dumps([list(r) for r in conn.execute(select(events))], default=str)
    assert "sk-live-VICTIM" not in dump and "4111111111111111" not in dump


# -- a root daemon without allowed_users ---------------------------------------------------------------------


def test_a_root_daemon_without_allowed_users_refuses_to_start(store, tmp_path):
    folder = short_dir()
    cfg = tmp_path / "wd.toml"
    cfg.write_text(f'[store]\nurl = "{store}"\n\n[daemon]\nkey_file = "{folder}/k"\nsocket = "{folder}/s"\n')
    done = subprocess.run([AGENT_WATCHDOG, "run", "--once", "--config", str(cfg)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line == (f"agent-watchdog: error: [daemon] allowed_users is not set in {cfg} and the daemon runs as root: "
                    'set allowed_users = ["USER", ...] to the users whose agent processes it may signal (root and '
                    "system accounts only if named), or run it as its own user (see the unit)")
    assert not (folder / "k").exists() and not (folder / "s").exists()  # refused before anything was created


# -- alert text of one's own ----------------------------------------------------------------------------


def test_an_alert_row_a_store_writer_inserts_is_never_delivered(store, engine, attestor, users):
    # One without a seal, one with the seal of a genuine alert copied onto other words.
    tk = daemon_for(engine, attestor, users)
    from watchdog.store.alerts import enqueue_alert

    with engine.begin() as conn:
        enqueue_alert(conn, "genuine", "agent-watchdog: a genuine alert", "composed by the daemon", now=utcnow(),
                      sealer=attestor.sealer)
    with engine.connect() as conn:
        from watchdog.store.schema import alerts

        genuine_mac = conn.execute(select(alerts.c.mac).where(alerts.c.dedupe_key == "genuine")).scalar()
    forge(users["mallory"], store, "alert_row", key="phish-1", title="agent-watchdog: URGENT",
          body="rotate your keys at https://evil.example.org/login")
    forge(users["mallory"], store, "alert_row", key="phish-2", title="agent-watchdog: a genuine alert",
          body="wire 10k EUR to DE00", mac=genuine_mac)
    received = deliver(engine, attestor)
    titles = [r["title"] for r in received]
    assert titles == ["agent-watchdog: a genuine alert",
                      "agent-watchdog: refused 2 alert row(s) this daemon did not compose"]
    assert not any("evil.example.org" in r["message"] or "wire 10k" in r["message"] for r in received)
    with engine.connect() as conn:
        refused = conn.execute(select(alerts.c.dedupe_key, alerts.c.last_error).where(
            alerts.c.dedupe_key.like("phish-%"))).all()
    assert sorted(k for k, _ in refused) == ["phish-1", "phish-2"]
    assert all(err.startswith("refused: not sealed by this host's daemon") for _, err in refused)
    assert deliver(engine, attestor) == []  # refused once, for good; the summary went out once
    assert tk is not None
