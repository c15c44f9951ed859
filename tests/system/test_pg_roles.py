"""The PostgreSQL roles of sql/postgres-roles.sql, created for real on the test database.

The agents' role runs the whole SDK (register, record, stop itself, claim and pass a circuit
probe, end) and is refused on every table and column that is the daemon's: interventions,
alerts, settings, daemons, tool_circuits, attestations, a run's identity and ladder state.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.engine import make_url

from watchdog import RunKilled, Watchdog
from watchdog.store.engine import make_engine
from watchdog.store.schema import circuit_probes, events, runs, tool_circuits, utcnow

SCRIPT = Path(__file__).resolve().parents[2] / "sql" / "postgres-roles.sql"


@pytest.fixture
def roles(pg_migrated):
    """(agents' role, an agent's login role, its store URL), dropped afterwards."""
    from pg_support import empty_pg as _empty_pg

    _empty_pg(pg_migrated)
    tag = uuid.uuid4().hex[:8]
    group, login = f"aw_agents_{tag}", f"aw_agent_{tag}"
    # The gateway's and viewer's roles too are this test's own (roles are global to the server).
    others = (f"aw_gateway_{tag}", f"aw_viewer_{tag}")
    url = make_url(pg_migrated)
    # The shipped script, run the way the README says, with the role named for this test
    # (roles are global to the server and other test sessions share it).
    done = subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-v", f"agents_role={group}", "-v",
                           f"gateway_role={others[0]}", "-v", f"viewer_role={others[1]}", "-h", url.host,
                           "-p", str(url.port or 5432), "-U", url.username, "-d", url.database, "-f", str(SCRIPT)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    admin = make_engine(pg_migrated)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE ROLE "{login}" LOGIN'))
        conn.execute(text(f'GRANT "{group}" TO "{login}"'))
    yield group, login, url.set(username=login).render_as_string(hide_password=False)
    with admin.begin() as conn:
        conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{login}'"))
        for role in (login, group, *others):
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
    admin.dispose()


def _raw(url: str):
    return psycopg.connect(url.replace("+psycopg", ""), autocommit=True)


def test_the_sdk_runs_under_the_agents_role(roles, pg_migrated):
    _group, login, agent_url = roles
    owner = make_engine(pg_migrated)
    wd = Watchdog(agent_url, attest_socket="", circuit_cache_s=0)
    try:
        with wd.run(agent="bot", kill_mode="process", guards=False) as run:
            run.step(model="m", tokens_in=10, tokens_out=2, cost_eur=0.01)
            assert run.tool_call("search", {"q": 1}, lambda q: "hit") == "hit"
            run.heartbeat("half way")
        assert run.status == "completed"
        with pytest.raises(RunKilled):  # an in-process guard's stop request is the agent's to write
            with wd.run(agent="bot", max_steps=1) as stopped:
                stopped.step(cost_eur=0.0)
                stopped.step(cost_eur=0.0)
        # A half-open probe: claimed by INSERT, passed by marking the claim; tool_circuits untouched.
        now = utcnow()
        with owner.begin() as conn:
            conn.execute(insert(tool_circuits).values(
                tool="verify_iban", state="open", opened_at=now - dt.timedelta(seconds=120),
                open_until=now - dt.timedelta(seconds=1), errors_in_window=5, window_s=60.0,
                last_error_class="ConnectionError", updated_at=now))
        with wd.run(agent="bot", guards=False) as prober:
            assert prober.tool_call("verify_iban", {"iban": "x"}, lambda iban: "valid") == "valid"
            assert wd.circuit_for("verify_iban") is None  # closed for the SDK at once
        assert wd.rejected_events == 0 and wd.buffered == 0
    finally:
        wd.close()
    with owner.connect() as conn:
        rows = {r.id: r for r in conn.execute(select(runs))}
        claim = conn.execute(select(circuit_probes)).one()
        circuit = conn.execute(select(tool_circuits)).one()
        n_events = conn.execute(select(events.c.id)).all()
    assert rows[run.id].steps == 1 and rows[run.id].tool_calls == 1
    assert (rows[stopped.id].status, rows[stopped.id].stop_reason) == ("killed", "max_steps")
    assert (claim.run_id, claim.ok) == (prober.id, True)
    assert (circuit.state, circuit.probe_run_id) == ("open", None)
    assert len(n_events) >= 5
    owner.dispose()


REFUSED = [
    ("INSERT INTO interventions (at, action) VALUES (now(), 'sigterm')", "interventions"),
    ("INSERT INTO alerts (dedupe_key, created_at, title, body) VALUES ('x', now(), 't', 'b')", "alerts"),
    ("UPDATE alerts SET delivered_at = now()", "alerts"),
    ("INSERT INTO settings (key, value, updated_at) VALUES ('config2', '{}', now())", "settings"),
    ("UPDATE settings SET value = '{\"record_args\": true}'", "settings"),
    ("INSERT INTO daemons (host, pid, pid_create_time, started_at) VALUES ('h', 1, 1.0, now())", "daemons"),
    ("DELETE FROM daemons", "daemons"),
    ("UPDATE tool_circuits SET state = 'closed'", "tool_circuits"),
    ("INSERT INTO tool_circuits (tool, state, updated_at) VALUES ('t', 'open', now())", "tool_circuits"),
    ("INSERT INTO attestations (run_id, host, pid, pid_create_time, uid, kill_mode, attested_at, mac) "
     "VALUES ('r', 'h', 1, 1.0, 0, 'process', now(), 'm')", "attestations"),
    ("SELECT mac FROM attestations", "attestations"),
    ("UPDATE runs SET signal_stage = 'term'", "runs"),
    ("UPDATE runs SET pid = 1", "runs"),
    ("UPDATE runs SET pid_create_time = 1.0", "runs"),
    ("UPDATE runs SET kill_mode = 'tree'", "runs"),
    ("UPDATE runs SET host = 'elsewhere'", "runs"),
    ("DELETE FROM runs", "runs"),
    ("SELECT error_msg FROM events", "events"),
    ("DELETE FROM events", "events"),
    ("UPDATE circuit_probes SET run_id = 'someone-else'", "circuit_probes"),
    ("DELETE FROM circuit_probes", "circuit_probes"),
]


@pytest.mark.parametrize("sql, table", REFUSED, ids=[f"{t}:{s.split()[0]}" for s, t in REFUSED])
def test_the_agents_role_is_refused_on_the_daemons_tables(roles, sql, table):
    _group, _login, agent_url = roles
    with _raw(agent_url) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"permission denied for table {table}"):
            conn.execute(sql)


def test_the_roles_script_is_idempotent(roles, pg_migrated):
    group, _login, _url = roles
    url = make_url(pg_migrated)
    again = subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-v", f"agents_role={group}", "-v",
                            f"gateway_role=aw_gateway_{group.rsplit('_', 1)[1]}", "-v",
                            f"viewer_role=aw_viewer_{group.rsplit('_', 1)[1]}", "-h", url.host, "-U",
                            url.username, "-d", url.database, "-f", str(SCRIPT)], capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0, again.stderr


def test_runs_with_an_agents_own_login_is_one_line_naming_what_reads(roles):
    """issue 36: `runs --all` as an agent's login said "permission denied for table alembic_version"."""
    import os

    _group, login, url = roles
    exe = Path(sys.executable).parent / "agent-watchdog"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    done = subprocess.run([str(exe), "runs", "--all", "--db", url], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
    assert "alembic_version" not in done.stderr and f"GRANT agent_watchdog_viewer TO {login};" in done.stderr, \
        done.stderr


def test_no_confined_login_creates_in_the_schema_even_where_public_may(pg_server_url):
    """PostgreSQL 14 and older grant CREATE on schema public to every login (15 no longer does): a
    writer could plant a closer-typed overload of a function the daemon's statements call, run
    with the owner's rights. The script takes PUBLIC's grant away, and the owner still upgrades."""
    from pg_support import RolesStore

    with RolesStore(pg_server_url, prefix="awsc").create() as store:
        with _raw(store.url("daemon")) as daemon:  # the database's owner owns schema public on 15
            daemon.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")  # as 14 and older ship it
        with _raw(store.url("a")) as a:
            a.execute("CREATE FUNCTION public.aw_probe() RETURNS int LANGUAGE sql AS 'SELECT 1'")
            a.execute("DROP FUNCTION public.aw_probe()")  # the hole, before the script runs again
        store.roles_script()
        for who in ("a", "b", "gw"):
            with _raw(store.url(who)) as writer, pytest.raises(psycopg.errors.InsufficientPrivilege):
                writer.execute("CREATE FUNCTION public.lower(varchar) RETURNS text LANGUAGE sql AS 'SELECT 1::text'")
            with _raw(store.url(who)) as writer, pytest.raises(psycopg.errors.InsufficientPrivilege):
                writer.execute("CREATE TABLE public.run_changes_planted (x int)")
        with _raw(store.url("daemon")) as daemon:
            daemon.execute("CREATE TABLE aw_a_later_revision (x int)")  # `db upgrade` still can
            assert daemon.execute("SELECT has_schema_privilege('public', 'public', 'CREATE')").fetchone() == (False,)
