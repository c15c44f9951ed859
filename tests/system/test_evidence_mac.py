"""SQLite: a signal rests only on the run's own evidence (records MAC'd with its attested key).

Real SQLite store, real attestation socket (the daemon's own server and key), real agent
processes writing through the SDK, the real Ticker and killer; the other writer is plain SQL
on the same file, as any store writer may. The victims block SIGTERM: a SIGTERM sent would stay
pending in /proc, exact proof either way.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import signal
import sqlite3

import pytest
from sqlalchemy import select, text

from agent_procs import process_gone, sigterm_pending, wait_until
from daemon_support import ME, actions, alerts_of, config, interventions_of, later, run_row
from watchdog.core import lifecycle as lc
from watchdog.core.evidence_mac import RecordMac, message
from watchdog.core.seal import Sealer
from watchdog.daemon.trust import keyfile
from watchdog.daemon.trust.authentic import NOT_OWN, OwnEvidence, own_counts, parse_evidence
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.schema import attestations, events, utcnow

HEALTHY = dict(kill_mode="process", budgets={"max_steps": 3}, steps=2, block_sigterm=True, then="hang")
RUNAWAY = dict(kill_mode="process", budgets={"max_steps": 3}, steps=4, ignore_sigterm=True, then="hang")


# -- the format, as a plain-SQL writer in another language would compute it --------------------


def _by_the_doc(key: bytes, run_id: str, seq: int, fields: list) -> str:
    """docs/evidence-mac.md, written out again independently of the module."""
    out = b"aw-ev/1"
    for v in [run_id, seq, *fields]:
        if v is None:
            out += b",~"
            continue
        t = ("1" if v else "0") if isinstance(v, bool) else str(v)
        b = t.encode("utf-8")
        out += b"," + str(len(b)).encode() + b":" + b
    return hmac.new(key, out, hashlib.sha256).hexdigest()


def test_the_mac_is_the_documented_one_and_binds_run_seq_and_payload():
    key = bytes(range(32))
    mac = RecordMac(key)
    at = "2026-12-01 21:13:05.120000"
    fields = ("tool", "search", "ab" * 32, False, None, None, None, None, None, 0.0123456, 2, at)
    doc = ["tool", "search", "ab" * 32, False, None, None, None, None, None, 12346, 2, at]  # cost in micro-euros
    assert mac.mac("r1", 7, *fields) == _by_the_doc(key, "r1", 7, doc)
    assert message("r1", 7, *fields).startswith(b"aw-ev/1,2:r1,1:7,4:tool,6:search,")
    given = mac.mac("r1", 7, *fields)
    assert mac.ok(given, "r1", 7, *fields)
    assert not mac.ok(given, "r2", 7, *fields)  # copied into another run
    assert not mac.ok(given, "r1", 8, *fields)  # copied under another seq
    assert not mac.ok(given, "r1", 7, *fields[:3], True, *fields[4:])  # an error made a success
    assert not mac.ok(given, "r1", 7, *fields[:-1], "2026-12-01 20:00:00.000000")  # its time moved back
    assert not RecordMac(os.urandom(32)).ok(given, "r1", 7, *fields)  # another run's key
    assert not mac.ok("zz", "r1", 7, *fields) and not mac.ok(None, "r1", 7, *fields)
    assert "0001" not in repr(mac)


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def attestor(attest, sqlite_url):
    return attest(sqlite_url)


@pytest.fixture
def sql(sqlite_url):
    """Another writer of the store: plain SQL on the same file."""
    conn = sqlite3.connect(sqlite_url.split("///", 1)[1], timeout=30, isolation_level=None)
    yield conn
    conn.close()


def ticker(engine, sealer) -> Ticker:
    return Ticker(engine, config(), Killer(allowed_users=[ME]), sealer=sealer)


def _engine(url):
    from watchdog.store.engine import make_engine

    return make_engine(url)


@pytest.fixture
def engine(sqlite_url):
    e = _engine(sqlite_url)
    yield e
    e.dispose()


def ladder_until_held_or_signalled(tk, run_id, engine, t):
    """Ticks past the cancel grace (and past term grace twice): the ladder has had every chance."""
    for dt_s in (0.0, 0.6, 1.2, 1.8):
        tk.tick(later(t, dt_s))
    return actions(engine, run_id)


def assert_not_signalled(agent, engine, tk_actions):
    assert "sigterm" not in tk_actions and "sigkill" not in tk_actions, tk_actions
    assert agent.alive() and not sigterm_pending(agent.pid)
    held = [i for i in interventions_of(engine, agent.run_id) if i.action == "signal_held"]
    assert [i.outcome for i in held] == [NOT_OWN]
    notown = [a for a in alerts_of(engine, agent.run_id) if a.dedupe_key == f"notown:{agent.run_id}"]
    assert len(notown) == 1 and NOT_OWN in notown[0].body
    assert run_row(engine, agent.run_id).status == lc.STOPPING  # stopped cooperatively, nothing more


# -- another writer cannot lend a healthy run's process to the killer ------------------------------


def test_a_writer_inflating_a_healthy_runs_row_gets_it_stopped_cooperatively_never_signalled(
        sqlite_url, engine, procs, attestor, sql):
    victim = procs.start("runaway", sqlite_url, **HEALTHY)
    assert victim.info["attested"]
    sql.execute("UPDATE runs SET steps = 999 WHERE id = ?", (victim.run_id,))
    tk = ticker(engine, attestor.sealer)
    t = utcnow()
    assert tk.tick(t).stops == [(victim.run_id, lc.MAX_STEPS)]
    acts = ladder_until_held_or_signalled(tk, victim.run_id, engine, t)
    assert_not_signalled(victim, engine, acts)
    # Held for good: asked again every tick, alerted once.
    for dt_s in (5, 10):
        tk.tick(later(t, dt_s))
    assert_not_signalled(victim, engine, actions(engine, victim.run_id))


def test_events_appended_without_a_valid_mac_never_get_the_run_signalled(sqlite_url, engine, procs, attestor, sql):
    victim = procs.start("runaway", sqlite_url, **HEALTHY)
    at = utcnow().strftime("%Y-%m-%d %H:%M:%S.%f")
    for seq in range(100, 110):  # no MAC, then a made-up one: as a plain-SQL writer without the key
        sql.execute("INSERT INTO events (run_id, seq, at, kind, model, tokens_in, tokens_out, cost_eur, mac) "
                    "VALUES (?, ?, ?, 'step', 'gpt-x', 10, 5, 0.0, ?)",
                    (victim.run_id, seq, at, None if seq < 105 else os.urandom(32).hex()))
    sql.execute("UPDATE runs SET steps = steps + 10, last_seq = 109 WHERE id = ?", (victim.run_id,))
    tk = ticker(engine, attestor.sealer)
    t = utcnow()
    assert tk.tick(t).stops == [(victim.run_id, lc.MAX_STEPS)]
    assert_not_signalled(victim, engine, ladder_until_held_or_signalled(tk, victim.run_id, engine, t))


def test_copied_authenticated_records_count_nothing(sqlite_url, engine, procs, attestor, sql):
    victim = procs.start("runaway", sqlite_url, **HEALTHY)
    other = procs.start("runaway", sqlite_url, **dict(HEALTHY, steps=3))  # genuine records of another run
    # Replay the victim's own first record under new seqs, and the other run's records into the victim.
    sql.execute("INSERT INTO events (run_id, seq, at, kind, model, tokens_in, tokens_out, cost_eur, mac) "
                "SELECT run_id, seq + 50, at, kind, model, tokens_in, tokens_out, cost_eur, mac FROM events "
                "WHERE run_id = ? AND seq = 1", (victim.run_id,))
    sql.execute("INSERT INTO events (run_id, seq, at, kind, model, tokens_in, tokens_out, cost_eur, mac) "
                "SELECT ?, seq + 60, at, kind, model, tokens_in, tokens_out, cost_eur, mac FROM events "
                "WHERE run_id = ?", (victim.run_id, other.run_id))
    sql.execute("UPDATE runs SET steps = steps + 4 WHERE id = ?", (victim.run_id,))
    with engine.connect() as conn:
        a = conn.execute(select(attestations).where(attestations.c.run_id == victim.run_id)).one()
        sealed = parse_evidence(attestor.sealer, victim.run_id, a.evidence)
        own = own_counts(conn, attestor.sealer, victim.run_id, sealed)
    assert (own.steps, own.records, own.newest_seq) == (2, 2, 2)  # its own two steps, nothing copied
    tk = ticker(engine, attestor.sealer)
    t = utcnow()
    assert tk.tick(t).stops == [(victim.run_id, lc.MAX_STEPS)]
    assert_not_signalled(victim, engine, ladder_until_held_or_signalled(tk, victim.run_id, engine, t))
    assert other.alive() and not sigterm_pending(other.pid)


def test_a_writer_lowering_a_runs_budgets_cannot_make_its_own_records_a_breach(
        sqlite_url, engine, procs, attestor, sql):
    victim = procs.start("runaway", sqlite_url, **HEALTHY)  # 2 own steps, registered with max_steps 3
    sql.execute("UPDATE runs SET max_steps = 1 WHERE id = ?", (victim.run_id,))
    tk = ticker(engine, attestor.sealer)
    t = utcnow()
    assert tk.tick(t).stops == [(victim.run_id, lc.MAX_STEPS)]
    assert_not_signalled(victim, engine, ladder_until_held_or_signalled(tk, victim.run_id, engine, t))


def test_a_forged_evidence_record_gives_no_key(sqlite_url, engine, procs, attestor, sql):
    victim = procs.start("runaway", sqlite_url, **HEALTHY)
    (before,) = sql.execute("SELECT evidence FROM attestations WHERE run_id = ?", (victim.run_id,)).fetchone()
    forged = before.replace('max_steps\\": 3', 'max_steps\\": 1')
    assert forged != before
    sql.execute("UPDATE attestations SET evidence = ? WHERE run_id = ?", (forged, victim.run_id))
    sql.execute("UPDATE runs SET max_steps = 1 WHERE id = ?", (victim.run_id,))
    tk = ticker(engine, attestor.sealer)
    t = utcnow()
    assert tk.tick(t).stops == [(victim.run_id, lc.MAX_STEPS)]
    assert_not_signalled(victim, engine, ladder_until_held_or_signalled(tk, victim.run_id, engine, t))


# -- the run's own records still get a runaway signalled -----------------------------------------------


def test_a_genuine_runaway_is_sigtermed_then_sigkilled_on_its_own_records(sqlite_url, engine, procs, attestor, sql):
    agent = procs.start("runaway", sqlite_url, **RUNAWAY)
    with engine.connect() as conn:
        macs = conn.execute(select(events.c.mac).where(events.c.run_id == agent.run_id)).scalars().all()
    assert len(macs) == 4 and all(isinstance(m, str) and len(m) == 64 for m in macs)
    tk = ticker(engine, attestor.sealer)
    t = utcnow()
    assert tk.tick(t).stops == [(agent.run_id, lc.MAX_STEPS)]
    tk.tick(later(t, 0.6))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]
    tk.tick(later(t, 1.2))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm", "sigkill"]
    assert agent.wait() == -signal.SIGKILL


def test_a_restarted_daemon_derives_the_same_keys_and_still_signals(sqlite_url, engine, procs, attestor):
    agent = procs.start("runaway", sqlite_url, **RUNAWAY)
    t = utcnow()
    assert ticker(engine, attestor.sealer).tick(t).stops == [(agent.run_id, lc.MAX_STEPS)]
    # Restarted: nothing survives but the store and the key file.
    again = Sealer(keyfile.load_or_create(attestor.key_file), attestor.host)
    tk = ticker(engine, again)
    with engine.connect() as conn:
        assert OwnEvidence(config(), again).breach(conn, run_row(engine, agent.run_id), later(t, 0.6)).reason \
            == lc.MAX_STEPS
    tk.tick(later(t, 0.6))
    assert actions(engine, agent.run_id) == ["stop_requested", "sigterm"]
    tk.tick(later(t, 1.2))
    assert agent.wait() == -signal.SIGKILL


def test_a_daemon_with_another_key_does_not_take_the_records_for_the_runs_own(sqlite_url, engine, procs, attestor):
    agent = procs.start("runaway", sqlite_url, **RUNAWAY)
    with engine.connect() as conn:
        stranger = Sealer(os.urandom(32), attestor.host)
        assert OwnEvidence(config(), stranger).breach(conn, run_row(engine, agent.run_id), utcnow()) is None


# -- what a writer that deletes or ends its own row escapes (SDK runs on SQLite: the documented limit) ----


@pytest.mark.parametrize("escape", ["delete", "end"])
def test_an_sdk_run_that_deletes_or_ends_its_own_row_escapes_the_daemon_the_documented_limit(
        sqlite_url, engine, procs, attestor, sql, escape):
    agent = procs.start("runaway", sqlite_url, kill_mode="process", budgets={"max_steps": 3}, steps=1,
                        block_sigterm=True, then="hang")
    bystander = procs.start("runaway", sqlite_url, **HEALTHY)
    if escape == "delete":
        sql.execute("DELETE FROM runs WHERE id = ?", (agent.run_id,))  # its events and attestation go with it
    else:
        sql.execute("UPDATE runs SET status = 'completed', ended_at = last_seen_at WHERE id = ?", (agent.run_id,))
    sql.execute("UPDATE runs SET steps = 50 WHERE id = ?", (agent.run_id,))  # over budget, for nobody to see
    tk = ticker(engine, attestor.sealer)
    t = utcnow()
    for dt_s in (0, 0.6, 1.2, 400):
        rep = tk.tick(later(t, dt_s))
        assert agent.run_id not in [rid for rid, _ in rep.stops]
    # The limit, as docs/security-sqlite.md says it: a run with no active row is not judged, so its
    # process is never signalled for it; it is bounded only by what runs it (exec, a supervisor).
    assert agent.alive() and not sigterm_pending(agent.pid)
    # ...and nobody else pays for it: the bystander was judged as always (stopped at 400 s for its
    # wall clock, from its own row), and the daemon still watches.
    assert run_row(engine, bystander.run_id).stop_reason == lc.WALL_CLOCK


def test_records_written_before_a_late_attestation_get_their_mac_once_the_key_comes(
        sqlite_url, engine, procs, monkeypatch):
    from attest_support import Attestor, short_dir

    folder = short_dir()
    monkeypatch.setenv("AGENT_WATCHDOG_SOCKET", str(folder / "attest.sock"))  # nobody listens there yet
    agent = procs.start("runaway", sqlite_url, **dict(RUNAWAY, then="attest_then_hang"), attest_retry_s=0.2)
    assert agent.info["attested"] is False
    late = Attestor(sqlite_url, socket=str(folder / "attest.sock")).start()
    try:
        def steps_macd():
            with engine.connect() as conn:
                return conn.execute(select(events.c.mac).where(
                    events.c.run_id == agent.run_id, events.c.kind == lc.EV_STEP)).scalars().all()

        assert wait_until(lambda: all(steps_macd()) and len(steps_macd()) == 4), agent.log()
        with engine.connect() as conn:
            a = conn.execute(select(attestations).where(attestations.c.run_id == agent.run_id)).one()
            own = own_counts(conn, late.sealer, agent.run_id, parse_evidence(late.sealer, agent.run_id, a.evidence))
        assert own.steps == 4  # the four steps made before the daemon came up are the run's own
    finally:
        late.close()


def test_own_records_once_folded_still_count_after_a_writer_deletes_them(sqlite_url, engine, procs, attestor, sql):
    agent = procs.start("runaway", sqlite_url, **RUNAWAY)
    own = OwnEvidence(config(), attestor.sealer)
    t = utcnow()
    with engine.connect() as conn:
        assert own.breach(conn, run_row(engine, agent.run_id), t).reason == lc.MAX_STEPS
    sql.execute("DELETE FROM events WHERE run_id = ?", (agent.run_id,))
    row = run_row(engine, agent.run_id)
    with engine.connect() as conn:  # read incrementally: what was verified stays verified
        assert own.breach(conn, row, later(t, 1)).reason == lc.MAX_STEPS
        # A fresh daemon reads what is left: nothing (a deletion can only cost the run its signal).
        assert OwnEvidence(config(), attestor.sealer).breach(conn, row, t) is None


def test_a_hung_run_is_signalled_for_the_silence_its_own_records_show(sqlite_url, engine, procs, attestor, sql):
    hung = procs.start("runaway", sqlite_url, kill_mode="process", budgets={"heartbeat_timeout_s": 5.0}, steps=1,
                       then="hang")
    tk = ticker(engine, attestor.sealer)
    t = utcnow()
    assert tk.tick(later(t, 10)).stops == [(hung.run_id, lc.HEARTBEAT_TIMEOUT)]
    tk.tick(later(t, 10.6))
    assert actions(engine, hung.run_id) == ["stop_requested", "sigterm"]
    assert hung.wait() == -signal.SIGTERM


def test_a_writer_backdating_a_runs_times_does_not_get_it_signalled_for_silence(
        sqlite_url, engine, procs, attestor, sql):
    victim = procs.start("runaway", sqlite_url, kill_mode="process", budgets={"heartbeat_timeout_s": 5.0}, steps=1,
                         block_sigterm=True, then="hang")
    old = "2026-01-01 00:00:00.000000"
    sql.execute("UPDATE events SET at = ? WHERE run_id = ?", (old, victim.run_id))
    sql.execute("UPDATE runs SET last_seen_at = ?, started_at = ? WHERE id = ?", (old, old, victim.run_id))
    tk = ticker(engine, attestor.sealer)
    t = utcnow()  # the real time: the victim wrote its step a moment ago
    assert [r for _, r in tk.tick(t).stops] in ([lc.WALL_CLOCK], [lc.HEARTBEAT_TIMEOUT])
    assert_not_signalled(victim, engine, ladder_until_held_or_signalled(tk, victim.run_id, engine, t))
