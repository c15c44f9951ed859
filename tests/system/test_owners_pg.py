"""Rows belong to their writer on PostgreSQL (migration 0010, sql/postgres-roles.sql), for real.

A database owned by a daemon login (it runs the migrations and the Ticker), the shipped roles
script run as the README says, and five logins: two agents (A, B) in the agents' role, a
gateway, a viewer. Each attack of issue 20 that a row can carry is tried as a real login:
it changes nothing of another owner's and nothing its own row may not say; the SDK and the
daemon keep working.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import threading
import uuid
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, inspect, select, text
from sqlalchemy.engine import make_url

from agent_procs import wait_until
from daemon_support import actions, config, run_row, ticker
from watchdog import RunKilled, Watchdog
from watchdog.cli import main
from watchdog.core import lifecycle as lc
from watchdog.daemon.process.service import Daemon
from watchdog.store import access
from watchdog.store.access import roles_choosing_event_ids
from watchdog.store.engine import make_engine
from watchdog.store.joined import WITNESS_SEQ_BASE
from watchdog.store.schema import runs, utcnow

SCRIPT = Path(__file__).resolve().parents[2] / "sql" / "postgres-roles.sql"
MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0010_owners.py"
INSERT = ("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at{cols}) "
          "VALUES (%s, 'bot', 'running', 'cooperative', 'h', now(), now(){vals})")


class Store:
    """The test database and the URL of each login."""

    def __init__(self, server: str, tag: str):
        self.tag = tag
        self.admin_url = server
        self.db = f"aw_own_{tag}"
        self.daemon, self.agents, self.gateway, self.viewer = (f"aw_d_{tag}", f"aw_ag_{tag}", f"aw_gw_{tag}",
                                                               f"aw_vw_{tag}")
        self.logins = {"a": f"aw_a_{tag}", "b": f"aw_b_{tag}", "gw": f"aw_gwl_{tag}", "view": f"aw_vwl_{tag}",
                       "daemon_member": f"aw_dm_{tag}"}
        base = make_url(server)
        self.base = base

    def url(self, who: str) -> str:
        user = self.daemon if who == "daemon" else self.logins[who]
        return self.base.set(username=user, database=self.db).render_as_string(hide_password=False)

    def roles_script(self, user: str | None = None, gateway: str | None = None, *extra: str):
        u = self.base
        return subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-v", f"agents_role={self.agents}",
                               "-v", f"gateway_role={gateway or self.gateway}", "-v", f"viewer_role={self.viewer}",
                               *extra,
                               "-h", u.host, "-p", str(u.port or 5432), "-U", user or u.username, "-d", self.db,
                               "-f", str(SCRIPT)], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def store(pg_server_url):
    tag = uuid.uuid4().hex[:8]
    s = Store(pg_server_url, tag)
    admin = create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{s.daemon}" LOGIN'))
        conn.execute(text(f'CREATE DATABASE "{s.db}" OWNER "{s.daemon}"'))
    try:
        daemon_engine = make_engine(s.url("daemon"))
        access.upgrade(daemon_engine)  # as the daemon's role: it owns the tables
        daemon_engine.dispose()
        done = s.roles_script()
        assert done.returncode == 0, done.stderr
        with admin.connect() as conn:
            for key, group in (("a", s.agents), ("b", s.agents), ("gw", s.gateway), ("view", s.viewer),
                               ("daemon_member", s.daemon)):
                conn.execute(text(f'CREATE ROLE "{s.logins[key]}" LOGIN'))
                conn.execute(text(f'GRANT "{group}" TO "{s.logins[key]}"'))
        yield s
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{s.db}" WITH (FORCE)'))
            for role in (*s.logins.values(), s.agents, s.gateway, s.viewer, s.daemon, f"aw_mcp_{tag}",
                         f"aw_mcpl_{tag}"):
                conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()


def _raw(url: str):
    return psycopg.connect(url.replace("+psycopg", ""), autocommit=True)


def _rid() -> str:
    return uuid.uuid4().hex


def _insert(url: str, cols: str = "", vals: str = "", params: tuple = ()) -> str:
    rid = _rid()
    with _raw(url) as conn:
        conn.execute(INSERT.format(cols=cols, vals=vals), (rid, *params))
    return rid


def _row(store, rid: str):
    with _raw(store.url("daemon")) as conn:
        conn.row_factory = psycopg.rows.namedtuple_row
        return conn.execute("SELECT * FROM runs WHERE id = %s", (rid,)).fetchone()


REFUSED = (psycopg.errors.InsufficientPrivilege, psycopg.errors.CheckViolation)


def test_the_lists_of_the_migration_are_the_lifecycles():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_aw_owners_0010", MIGRATION)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    assert set(m.ACTIVE) == set(lc.ACTIVE_STATUSES)
    assert set(m.MOVES) | set(m.ENDED_BY_WRITER) | {lc.LOST} == set(lc.STATUSES)
    from watchdog.core.budgets import RUN_BUDGET_KEYS

    assert set(m.BUDGETS) == set(RUN_BUDGET_KEYS)


def test_each_run_belongs_to_its_login_whatever_it_says_or_sets_role(store):
    rid = _insert(store.url("a"), ", owner", ", %s", (store.logins["b"],))  # a supplied owner is overwritten
    assert _row(store, rid).owner == store.logins["a"]
    with _raw(store.url("a")) as conn:
        conn.execute(f'SET ROLE "{store.agents}"')  # current_user changes, session_user does not
        other = _rid()
        conn.execute(INSERT.format(cols="", vals=""), (other,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f'SET ROLE "{store.logins["b"]}"')
    assert _row(store, other).owner == store.logins["a"]
    with _raw(store.url("a")) as conn, pytest.raises(REFUSED):
        conn.execute("UPDATE runs SET owner = %s WHERE id = %s", (store.logins["b"], rid))
    assert _row(store, rid).owner == store.logins["a"]


def test_an_agent_cannot_touch_another_agents_run(store):
    b_run = _insert(store.url("b"))
    a_run = _insert(store.url("a"))
    with _raw(store.url("a")) as conn:
        assert conn.execute("UPDATE runs SET steps = 999 WHERE id = %s", (b_run,)).rowcount == 0
        assert conn.execute("UPDATE runs SET status = 'killed', stop_reason = 'manual' WHERE id = %s",
                            (b_run,)).rowcount == 0
        assert conn.execute("UPDATE runs SET parent_id = %s WHERE id = %s", (a_run, b_run)).rowcount == 0
        assert conn.execute("SELECT count(*) FROM runs WHERE id = %s", (b_run,)).fetchone()[0] == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO events (run_id, seq, at, kind) VALUES (%s, 1, now(), 'step')", (b_run,))
        with pytest.raises(REFUSED):  # adopting B's run as the parent of a new run of A's
            conn.execute(INSERT.format(cols=", parent_id", vals=", %s"), (_rid(), b_run))
        with pytest.raises(REFUSED):  # nor as its own run's parent afterwards
            conn.execute("UPDATE runs SET parent_id = %s WHERE id = %s", (b_run, a_run))
    with _raw(store.url("a")) as conn:  # a TEMP table `runs` that says A owns B's run changes nothing
        conn.execute("CREATE TEMP TABLE runs (id text, owner text)")
        conn.execute("INSERT INTO pg_temp.runs VALUES (%s, %s)", (b_run, store.logins["a"]))
        conn.execute("SET search_path = pg_temp, public")
        with pytest.raises(REFUSED):
            conn.execute(INSERT.format(cols=", parent_id", vals=", %s").replace("INTO runs", "INTO public.runs"),
                         (_rid(), b_run))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO public.events (run_id, seq, at, kind) VALUES (%s, 1, now(), 'step')", (b_run,))
    b = _row(store, b_run)
    assert (b.steps, b.status, b.parent_id, b.stop_reason) == (0, lc.RUNNING, None, None)
    assert _row(store, a_run).parent_id is None


def test_an_agent_cannot_rewrite_its_own_evidence(store):
    url = store.url("a")
    rid = _insert(url)
    with _raw(url) as conn:
        conn.execute("UPDATE runs SET steps = 5, cost_eur = 2.5 WHERE id = %s", (rid,))
        for sql in ("UPDATE runs SET steps = 0 WHERE id = %s", "UPDATE runs SET cost_eur = 0 WHERE id = %s",
                    "UPDATE runs SET resumes = 1 WHERE id = %s", "UPDATE runs SET signal_stage = 'done' WHERE id = %s",
                    "UPDATE runs SET max_steps = 1000000 WHERE id = %s",
                    "UPDATE runs SET started_at = now() + interval '30 days' WHERE id = %s",
                    "UPDATE runs SET booked_at = now() WHERE id = %s"):
            with pytest.raises(REFUSED):
                conn.execute(sql, (rid,))
        with pytest.raises(REFUSED):  # an active run has not ended
            conn.execute("UPDATE runs SET ended_at = now() WHERE id = %s", (rid,))
        conn.execute("UPDATE runs SET status = 'paused', stop_reason = 'max_steps', "
                     "paused_at = '9999-01-01 00:00:00+00' WHERE id = %s", (rid,))
        db_now = conn.execute("SELECT now()").fetchone()[0]
    row = _row(store, rid)
    assert (row.steps, row.cost_eur, row.resumes, row.signal_stage, row.max_steps) == (5, 2.5, 0, None, None)
    assert row.status == lc.PAUSED and abs((row.paused_at - db_now).total_seconds()) < 60  # the server's now()
    assert row.started_at.year == db_now.year and row.started_at <= db_now


def test_no_writer_chooses_an_events_id_and_the_daemon_keeps_folding(store):
    """The daemon folds the events above the newest id it read: an id a writer chose (the largest
    bigint) would hide every later event. Agents and gateways insert every column but the id."""
    url = store.url("a")
    rid = _insert(url)
    with _raw(url) as conn:
        for sql in ("INSERT INTO events (id, run_id, seq, at, kind, tool) "
                    "VALUES (9223372036854775807, %s, 1, now(), 'tool', 'x')",
                    "INSERT INTO events (id, run_id, seq, at, kind, tool) VALUES (1, %s, 1, now(), 'tool', 'x')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql, (rid,))
        conn.execute("INSERT INTO events (run_id, seq, at, kind, tool) VALUES (%s, 1, now(), 'tool', 'x')", (rid,))
    with _raw(store.url("gw")) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO events (id, run_id, seq, at, kind, tool, source) "
                         "VALUES (9223372036854775806, %s, 2, now(), 'tool', 'x', 'mcp')", (rid,))
    with _raw(store.url("daemon")) as conn:
        assert conn.execute("SELECT max(id) < 1000000 FROM events").fetchone() == (True,)
    # A store whose roles got the table's INSERT (a roles script older than revision 0013): the
    # daemon names them at start, and the script, run again, takes the id back.
    engine = make_engine(store.url("daemon"))
    try:
        assert roles_choosing_event_ids(engine) == []
        with _raw(store.url("daemon")) as conn:
            conn.execute(f'GRANT INSERT ON events TO "{store.agents}"')
        found = roles_choosing_event_ids(engine)
        assert store.agents in found and store.logins["a"] in found and store.daemon not in found
        done = store.roles_script()
        assert done.returncode == 0, done.stderr
        assert roles_choosing_event_ids(engine) == []
    finally:
        engine.dispose()


def test_an_agent_inserts_with_the_servers_times_and_no_resumes(store):
    url = store.url("a")
    future = "'2999-01-01 00:00:00+00'"
    rid = _rid()
    with _raw(url) as conn:
        conn.execute(f"INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, max_steps, "
                     f"max_cost_eur) VALUES (%s, 'bot', 'running', 'process', 'h', {future}, {future}, 1000000000, 1e9)",
                     (rid,))
        db_now = conn.execute("SELECT now()").fetchone()[0]
        for extra, value in (("resumes", "1"), ("signal_stage", "'done'"), ("booked_at", "now()"),
                             ("top_tool", "'x'")):
            with pytest.raises(REFUSED):
                conn.execute(INSERT.format(cols=f", {extra}", vals=f", {value}"), (_rid(),))
        with pytest.raises(REFUSED):
            conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at) "
                         "VALUES (%s, 'bot', 'lost', 'cooperative', 'h', now(), now())", (_rid(),))
    row = _row(store, rid)
    assert row.started_at < dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc)
    assert abs((row.started_at - db_now).total_seconds()) < 60 and row.last_seen_at == row.started_at
    assert (row.max_steps, row.resumes) == (1000000000, 0)


def test_the_status_moves_only_forward_for_a_writer(store):
    url = store.url("a")
    with _raw(url) as conn:
        done = _insert(url)
        conn.execute("UPDATE runs SET status = 'completed', ended_at = now() WHERE id = %s", (done,))
        for status in ("running", "paused", "stopping", "lost", "failed"):
            with pytest.raises(REFUSED):
                conn.execute("UPDATE runs SET status = %s WHERE id = %s", (status, done))
        stopped = _insert(url)
        with _raw(store.url("daemon")) as daemon:  # the daemon asks it to stop: it may still end
            daemon.execute("UPDATE runs SET status = 'stopping', stop_reason = 'max_steps', "
                           "stop_requested_at = now() WHERE id = %s", (stopped,))
        with pytest.raises(REFUSED):
            conn.execute("UPDATE runs SET status = 'running' WHERE id = %s", (stopped,))
        with pytest.raises(REFUSED):  # the daemon's reason stays
            conn.execute("UPDATE runs SET stop_reason = 'manual' WHERE id = %s", (stopped,))
        conn.execute("UPDATE runs SET status = 'killed', ended_at = '2000-01-01 00:00:00+00', "
                     "stop_reason = COALESCE(stop_reason, 'x'), stop_detail = COALESCE(stop_detail, 'seen it') "
                     "WHERE id = %s", (stopped,))  # as the SDK's end writes it
        gave_up = _insert(url)  # the SDK's own pause, then its give-up when nobody answered, then its end
        for status in ("paused", "stopping", "killed"):
            assert conn.execute("UPDATE runs SET status = %s WHERE id = %s", (status, gave_up)).rowcount == 1
    assert _row(store, gave_up).status == lc.KILLED
    assert _row(store, done).status == lc.COMPLETED
    row = _row(store, stopped)
    assert (row.status, row.stop_reason, row.stop_detail) == (lc.KILLED, lc.MAX_STEPS, "seen it")
    assert row.ended_at.year > 2000


def test_the_gateway_appends_witnessed_events_but_never_rewrites_a_run(store):
    a_run = _insert(store.url("a"))
    with _raw(store.url("a")) as conn:  # the run's own record, and an attempt at the witnesses' range
        conn.execute("INSERT INTO events (run_id, seq, at, kind, error_msg) VALUES (%s, 1, now(), 'step', 'secret')",
                     (a_run,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO events (run_id, seq, at, kind) VALUES (%s, %s, now(), 'step')",
                         (a_run, 2**31 - 1))  # it would leave the gateways no number
    with _raw(store.url("gw")) as conn:
        assert conn.execute("SELECT agent FROM runs WHERE id = %s", (a_run,)).fetchone() == ("bot",)
        conn.execute("INSERT INTO events (run_id, seq, at, kind, tool, source) "
                     "VALUES (%s, %s, '2999-01-01 00:00:00+00', 'tool', 'search', 'mcp')", (a_run, WITNESS_SEQ_BASE))
        for source in ("NULL", "'sdk'", "'exec'"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                conn.execute(f"INSERT INTO events (run_id, seq, at, kind, source) "
                             f"VALUES (%s, %s, now(), 'step', {source})", (a_run, WITNESS_SEQ_BASE + 1))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            conn.execute("INSERT INTO events (run_id, seq, at, kind, source) VALUES (%s, 2, now(), 'step', 'mcp')",
                         (a_run,))  # the writer's own numbers: its record 2 would be refused as a duplicate
        # The witnesses' numbers of any run (to take the next), nothing of what the writer recorded.
        assert conn.execute("SELECT run_id, seq FROM events WHERE run_id = %s", (a_run,)).fetchall() == [
            (a_run, WITNESS_SEQ_BASE)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table events"):
            conn.execute("SELECT error_msg FROM events WHERE run_id = %s", (a_run,))
        assert conn.execute("UPDATE runs SET steps = 999, status = 'killed' WHERE id = %s", (a_run,)).rowcount == 0
        own = _rid()
        conn.execute(INSERT.format(cols=", source", vals=", 'litellm'"), (own,))
        assert conn.execute("UPDATE runs SET steps = steps + 1 WHERE id = %s", (own,)).rowcount == 1
        with pytest.raises(REFUSED):
            conn.execute("UPDATE runs SET steps = 0 WHERE id = %s", (own,))
    assert _row(store, a_run).steps == 0 and _row(store, a_run).status == lc.RUNNING
    assert _row(store, own).owner == store.logins["gw"]
    with _raw(store.url("daemon")) as conn:
        at, = conn.execute("SELECT at FROM events WHERE run_id = %s AND seq = %s", (a_run, WITNESS_SEQ_BASE)).fetchone()
        assert at.year < 2999  # the server's clock
        assert conn.execute("SELECT seq FROM events WHERE run_id = %s ORDER BY seq", (a_run,)).fetchall() == [
            (1,), (WITNESS_SEQ_BASE,)]


def test_a_gateway_role_of_one_source_marks_only_that_one(store):
    mcp, login = f"aw_mcp_{store.tag}", f"aw_mcpl_{store.tag}"
    done = store.roles_script(None, mcp, "-v", "gateway_sources=mcp")
    assert done.returncode == 0, done.stderr
    bad = store.roles_script(None, mcp, "-v", "gateway_sources=mcp,sdk")
    assert bad.returncode != 0 and "gateway_sources must be" in bad.stderr
    admin_url = make_url(store.admin_url).set(database=store.db).render_as_string(hide_password=False)
    try:
        with _raw(admin_url) as conn:
            conn.execute(f'CREATE ROLE "{login}" LOGIN IN ROLE "{mcp}"')
        a_run = _insert(store.url("a"))
        url = make_url(store.url("a")).set(username=login).render_as_string(hide_password=False)
        with _raw(url) as conn:
            conn.execute("INSERT INTO events (run_id, seq, at, kind, tool, source) "
                         "VALUES (%s, %s, now(), 'tool', 't', 'mcp')", (a_run, WITNESS_SEQ_BASE))
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                conn.execute("INSERT INTO events (run_id, seq, at, kind, source) "
                             "VALUES (%s, %s, now(), 'step', 'litellm')", (a_run, WITNESS_SEQ_BASE + 1))
    finally:  # its policies and grants go with it
        with _raw(admin_url) as conn:
            conn.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{login}'")
            for role in (login, mcp):
                conn.execute(f'DROP OWNED BY "{role}"')
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_the_viewer_sees_every_run_and_writes_nothing(store):
    a_run, b_run = _insert(store.url("a")), _insert(store.url("b"))
    with _raw(store.url("a")) as conn:
        conn.execute("INSERT INTO events (run_id, seq, at, kind) VALUES (%s, 1, now(), 'step')", (a_run,))
    with _raw(store.url("view")) as conn:
        seen = {r[0] for r in conn.execute("SELECT id FROM runs WHERE id IN (%s, %s)", (a_run, b_run))}
        assert seen == {a_run, b_run}
        assert conn.execute("SELECT count(*) FROM events WHERE run_id = %s", (a_run,)).fetchone() == (1,)
        for table in ("interventions", "alerts", "settings", "daemons", "tool_circuits", "spend_ledger"):
            conn.execute(f"SELECT * FROM {table} LIMIT 1")
        conn.execute("SELECT run_id, pid, uid FROM attestations LIMIT 1")
        for sql in ("UPDATE runs SET steps = 999", INSERT.format(cols="", vals="").replace("%s", "'v1'"),
                    "DELETE FROM runs", "INSERT INTO events (run_id, seq, at, kind) VALUES ('x', 1, now(), 'step')",
                    "UPDATE alerts SET delivered_at = now()", "DELETE FROM events", "SELECT mac FROM attestations",
                    "UPDATE settings SET value = '{}'", "INSERT INTO circuit_probes (tool, opened_at, run_id, "
                    "claimed_at) VALUES ('t', now(), 'x', now())"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
    # The CLI's views, as the viewer.
    out = CliRunner().invoke(main, ["--db", store.url("view"), "runs", "--json"])
    assert out.exit_code == 0, out.output
    assert {a_run, b_run} <= {r["id"] for r in __import__("json").loads(out.stdout)}
    for args in (["show", a_run, "--json"], ["budgets"], ["alerts"], ["top", "--once"], ["postmortem", a_run]):
        res = CliRunner().invoke(main, ["--db", store.url("view"), *args])
        assert res.exit_code == 0, (args, res.output)


def test_the_sdk_runs_end_to_end_as_an_agents_login(store):
    daemon_engine = make_engine(store.url("daemon"))
    cfg = config(agents={"bot": {"on_breach": "pause"}})
    Daemon(daemon_engine, cfg).publish(force=True)
    wd = Watchdog(store.url("a"), attest_socket="", circuit_cache_s=0)
    run = wd.run("bot", max_steps=2)
    out = {}

    def agent():
        with run:
            assert run.tool_call("search", {"q": "refund"}, lambda q: "hit") == "hit"
            with run.child("sub") as child:
                out["child"] = child.id
                child.step(model="gpt-x", tokens_in=3, tokens_out=1)
            for _ in range(3):
                run.check_budget()  # the second one would exceed max_steps: held (paused) here
                run.step(model="gpt-x", tokens_in=1, tokens_out=1)
        out["status"] = run.status

    t = threading.Thread(target=agent)
    t.start()
    try:
        assert wait_until(lambda: getattr(_row(store, run.id), "status", None) == lc.PAUSED)
        tk = ticker(daemon_engine, cfg)
        tk.tick(utcnow())
        assert actions(daemon_engine, run.id) == ["paused"]  # the daemon confirmed the SDK's pause
        res = CliRunner().invoke(main, ["--db", store.url("daemon"), "resume", run.id, "--add-steps", "2"])
        assert res.exit_code == 0, res.output
        t.join(30)
        assert out["status"] == lc.COMPLETED
    finally:
        t.join(30)
        wd.close()
    assert wd.rejected_events == 0 and wd.buffered == 0
    row, child = run_row(daemon_engine, run.id), run_row(daemon_engine, out["child"])
    assert (row.status, row.steps, row.tool_calls, row.owner) == (lc.COMPLETED, 4, 1, store.logins["a"])
    assert (child.parent_id, child.owner, child.status) == (run.id, store.logins["a"], lc.COMPLETED)
    assert row.ended_at >= row.started_at
    daemon_engine.dispose()


def test_the_daemons_role_still_stops_ends_and_books_an_agents_run(store):
    daemon_engine = make_engine(store.url("daemon"))
    cfg = config()
    wd = Watchdog(store.url("b"), attest_socket="", circuit_cache_s=0)
    try:
        with pytest.raises(RunKilled):
            with wd.run("bot", guards=False, max_steps=2) as run:
                for _ in range(3):
                    run.step(model="gpt-x", tokens_in=1, tokens_out=1)
                report = ticker(daemon_engine, cfg).tick(utcnow())
                assert (run.id, lc.MAX_STEPS) in report.stops
                run.step(model="gpt-x")  # the agent sees the daemon's stop
        # A run whose process is gone: the daemon ends it itself.
        gone = _rid()
        with _raw(store.url("b")) as conn:
            conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host, pid, pid_create_time, started_at, "
                         "last_seen_at) VALUES (%s, 'bot', 'running', 'process', %s, 2147483646, 1.0, now(), now())",
                         (gone, __import__("socket").gethostname()))
        tk = ticker(daemon_engine, cfg)
        report = tk.tick(utcnow())
        assert gone in report.lost
        tk.tick(utcnow())
    finally:
        wd.close()
    row = run_row(daemon_engine, run.id)
    assert (row.status, row.stop_reason, row.owner) == (lc.KILLED, lc.MAX_STEPS, store.logins["b"])
    assert run_row(daemon_engine, gone).status == lc.LOST
    assert row.booked_at is not None  # the daemon's own columns on an agent's row
    # A login in the daemon's role (not the owner itself) is the daemon's too: it sees and
    # rebases every run, and is not held to a writer's rules.
    with _raw(store.url("daemon_member")) as conn:
        assert conn.execute("SELECT owner FROM runs WHERE id = %s", (run.id,)).fetchone() == (store.logins["b"],)
        assert conn.execute("UPDATE runs SET steps = 0, resumes = 1 WHERE id = %s", (run.id,)).rowcount == 1
    daemon_engine.dispose()


def test_the_roles_script_is_idempotent_and_wants_the_owners_revision(store, pg_server_url):
    again = store.roles_script()
    assert again.returncode == 0, again.stderr
    # `db upgrade` at head, as the daemon's role, keeps every grant and policy.
    up = CliRunner().invoke(main, ["--db", store.url("daemon"), "db", "upgrade"])
    assert up.exit_code == 0, up.output
    engine = make_engine(store.url("daemon"))
    assert _pg_state(engine) == {"policies": 9, "triggers": 2, "rls": True}
    engine.dispose()
    b_run = _insert(store.url("b"))
    with _raw(store.url("a")) as conn:
        assert conn.execute("UPDATE runs SET steps = 999 WHERE id = %s", (b_run,)).rowcount == 0
    with _raw(store.url("view")) as conn:  # its policies are there once, still working
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] >= 1
    name = f"aw_old_{uuid.uuid4().hex[:8]}"
    admin = create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        old = make_engine(pg_server_url.rsplit("/", 1)[0] + f"/{name}")
        access.upgrade(old, "0009")
        old.dispose()
        u = make_url(pg_server_url)
        done = subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-v", f"agents_role={store.agents}",
                               "-v", f"gateway_role={store.gateway}", "-v", f"viewer_role={store.viewer}",
                               "-h", u.host, "-U", u.username, "-d", name, "-f", str(SCRIPT)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and "agent-watchdog db upgrade" in done.stderr
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _pg_state(engine) -> dict:
    with engine.connect() as conn:
        return {
            "policies": conn.execute(text("SELECT count(*) FROM pg_policies WHERE tablename IN ('runs', 'events')"))
            .scalar(),
            # (tgparentid = 0: not the clones PostgreSQL makes on each day partition of events, 0015)
            "triggers": conn.execute(text("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'aw\\_%' "
                                          "AND tgparentid = 0")).scalar(),
            "rls": conn.execute(text("SELECT bool_or(relrowsecurity) FROM pg_class WHERE relname IN "
                                     "('runs', 'events')")).scalar(),
        }


def test_the_owners_revision_round_trips_on_postgresql(store):
    """0010 down to 0009 removes the column, the triggers, every policy and row-level security;
    up again restores the migration's part (the roles script then adds its own again)."""
    engine = make_engine(store.url("daemon"))
    try:
        assert _pg_state(engine) == {"policies": 9, "triggers": 2, "rls": True}
        access.downgrade(engine, "0009")
        assert "owner" not in {c["name"] for c in inspect(engine).get_columns("runs")}
        assert _pg_state(engine) == {"policies": 0, "triggers": 0, "rls": False}
        access.upgrade(engine)
        assert _pg_state(engine) == {"policies": 2, "triggers": 2, "rls": True}
        done = store.roles_script()
        assert done.returncode == 0, done.stderr
        assert _pg_state(engine)["policies"] == 9
        assert access.current(engine) == access.head()
    finally:
        engine.dispose()
    with _raw(store.url("a")) as conn:  # and the rules hold again
        rid = _rid()
        conn.execute(INSERT.format(cols="", vals=""), (rid,))
        with pytest.raises(REFUSED):
            conn.execute("UPDATE runs SET resumes = 1 WHERE id = %s", (rid,))


def test_the_owners_revision_round_trips_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    engine = make_engine(url)
    try:
        access.upgrade(engine)
        wd = Watchdog(url)
        with wd.run("bot") as run:
            run.step()
        wd.close()
        assert run_row(engine, run.id).owner is None  # one trust domain per file: no owner
        access.downgrade(engine, "0009")
        assert "owner" not in {c["name"] for c in inspect(engine).get_columns("runs")}
        access.upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(select(runs.c.steps, runs.c.owner).where(runs.c.id == run.id)).one() == (1, None)
    finally:
        engine.dispose()


@pytest.mark.parametrize("forced", [False, True], ids=["per-login", "databases-user"])
def test_through_pgbouncer_owners_are_the_logins_pgbouncer_uses(store, forced):
    """Transaction pooling keeps each client's own login (one pool per login), so owners hold;
    a `[databases] user=` entry logs every client in as that one login: they all own the same."""
    from pgbouncer_proc import PgBouncer

    a, b = store.logins["a"], store.logins["b"]
    with PgBouncer(users=[a, b], pool_size=2, server_user=a if forced else None) as bouncer:
        a_url, b_url = bouncer.url(a, store.db), bouncer.url(b, store.db)
        a_run, b_run = _insert(a_url), _insert(b_url)
        with _raw(b_url) as conn:
            touched = conn.execute("UPDATE runs SET steps = 999 WHERE id = %s", (a_run,)).rowcount
    owners = (_row(store, a_run).owner, _row(store, b_run).owner)
    if forced:
        assert owners == (a, a) and touched == 1 and _row(store, a_run).steps == 999
    else:
        assert owners == (a, b) and touched == 0 and _row(store, a_run).steps == 0
