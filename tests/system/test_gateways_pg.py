"""The gateways on PostgreSQL for real (issue 32, item 10): the shipped roles script, a database
owned by the daemon's login, two agent logins (A, B) in the agents' role and one gateway login
in the gateway's role, which is the store login of a real `litellm --config` proxy (one for the
module) and of the real MCP proxy (stdio, in front of tests/mcp_server.py).

Each gateway records the calls it lets through for a run another login owns (events marked with
its source, numbered in the witnesses' range; the writer's row untouched, its own numbering
intact) and refuses a stopped run's next call: another login's run stopped by `agent-watchdog
kill` or by a budget, and its own run.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import openai
import psycopg
import pytest
from sqlalchemy import create_engine, select, text as sql
from sqlalchemy.engine import make_url

from daemon_support import daemon_toml
from litellm_support import call, proxy
from mcp_support import calls_seen, stdio_session, text
from watchdog import RunKilled, Watchdog
from watchdog.store import access
from watchdog.store.engine import make_engine
from watchdog.store.joined import WITNESS_SEQ_BASE
from watchdog.store.schema import events, runs

SCRIPT = Path(__file__).resolve().parents[2] / "sql" / "postgres-roles.sql"
CLI = [sys.executable, "-m", "watchdog.cli"]
DEADLINE_S = 30.0
TOML = """
[defaults]
max_steps = 5
max_tool_calls = 40
max_identical_calls = 10
"""


class Store:
    """The test database, its roles (this module's own: roles are global to the server) and the
    URL of each login."""

    def __init__(self, server: str, folder: Path):
        tag = uuid.uuid4().hex[:8]
        self.db = f"aw_gwpg_{tag}"
        self.roles = {"daemon": f"aw_gd_{tag}", "agents": f"aw_gag_{tag}", "gateway": f"aw_ggw_{tag}",
                      "viewer": f"aw_gvw_{tag}"}
        # "none": a login granted nothing (a gateway set up without the roles script's grant).
        self.logins = {"a": f"aw_ga_{tag}", "b": f"aw_gb_{tag}", "gw": f"aw_ggl_{tag}", "none": f"aw_gn_{tag}"}
        self.base = make_url(server)
        self.config = folder / "watchdog.toml"
        self.config.write_text(daemon_toml() + TOML)
        self.folder = folder

    def url(self, who: str) -> str:
        user = self.roles["daemon"] if who == "daemon" else self.logins[who]
        return self.base.set(username=user, database=self.db).render_as_string(hide_password=False)

    def env(self, who: str, **extra: str) -> dict[str, str]:
        e = {k: v for k, v in os.environ.items() if k != "AGENT_WATCHDOG_RUN"}
        e.update(AGENT_WATCHDOG_DB=self.url(who), AGENT_WATCHDOG_CONFIG=str(self.config),
                 MCP_TEST_LOG=str(self.folder / f"calls-{uuid.uuid4().hex[:6]}.jsonl"),
                 PYTHONPATH=str(Path(__file__).parents[2]), **extra)
        return e


@pytest.fixture(scope="module")
def store(pg_server_url, tmp_path_factory):
    s = Store(pg_server_url, tmp_path_factory.mktemp("gwpg"))
    admin = create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sql(f'CREATE ROLE "{s.roles["daemon"]}" LOGIN'))
        conn.execute(sql(f'CREATE DATABASE "{s.db}" OWNER "{s.roles["daemon"]}"'))
    try:
        daemon = make_engine(s.url("daemon"))
        access.upgrade(daemon)  # as the daemon's role: it owns the tables
        daemon.dispose()
        done = subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-v", f"agents_role={s.roles['agents']}",
                               "-v", f"gateway_role={s.roles['gateway']}", "-v", f"viewer_role={s.roles['viewer']}",
                               "-h", s.base.host, "-p", str(s.base.port or 5432), "-U", s.base.username,
                               "-d", s.db, "-f", str(SCRIPT)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        with admin.connect() as conn:
            for login, group in (("a", "agents"), ("b", "agents"), ("gw", "gateway")):
                conn.execute(sql(f'CREATE ROLE "{s.logins[login]}" LOGIN IN ROLE "{s.roles[group]}"'))
            conn.execute(sql(f'CREATE ROLE "{s.logins["none"]}" LOGIN'))
        yield s
    finally:
        with admin.connect() as conn:
            conn.execute(sql(f'DROP DATABASE IF EXISTS "{s.db}" WITH (FORCE)'))
            for role in (*s.logins.values(), *s.roles.values()):
                conn.execute(sql(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()


def kill(store: Store, run_id: str) -> None:
    """`agent-watchdog kill` as the operator (the daemon's login)."""
    done = subprocess.run([*CLI, "--db", store.url("daemon"), "--config", str(store.config), "kill", run_id],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def row(store: Store, run_id: str):
    with psycopg.connect(store.url("daemon").replace("+psycopg", "")) as conn:
        conn.row_factory = psycopg.rows.namedtuple_row
        return conn.execute("SELECT * FROM runs WHERE id = %s", (run_id,)).fetchone()


def witnessed(store: Store, run_id: str, count: int) -> list:
    """(source, kind, seq) of the run's events once `count` of them are a witness's (a LiteLLM
    success is logged after the client has its answer)."""
    engine = make_engine(store.url("daemon"))
    try:
        end = time.monotonic() + DEADLINE_S
        while True:
            with engine.connect() as conn:
                seen = conn.execute(select(events.c.source, events.c.kind, events.c.seq)
                                    .where(events.c.run_id == run_id).order_by(events.c.seq)).all()
            if sum(1 for e in seen if e.seq >= WITNESS_SEQ_BASE) >= count:
                return seen
            assert time.monotonic() < end, f"run {run_id}: {seen}"
            time.sleep(0.05)
    finally:
        engine.dispose()


def stopped_by_budget(store: Store, who: str) -> str:
    """A run of login `who` that its own budget stopped (max_steps 1, two steps)."""
    wd = Watchdog(store.url(who), attest_socket="")
    try:
        with pytest.raises(RunKilled):
            with wd.run(agent="support-bot", max_steps=1) as run:
                run.step(model="gpt-x", cost_eur=0.0)
                run.step(model="gpt-x", cost_eur=0.0)
    finally:
        wd.close()
    r = row(store, run.id)
    assert (r.status, r.stop_reason, r.owner) == ("killed", "max_steps", store.logins[who])
    return run.id


# -- the MCP proxy ---------------------------------------------------------------------------------

def test_mcp_proxy_records_another_logins_run_and_refuses_it_once_stopped(store):
    wd = Watchdog(store.url("a"), attest_socket="")
    try:
        with pytest.raises(RunKilled):
            with wd.run(agent="support-bot") as run:
                run.step(model="gpt-x", cost_eur=0.0)
                env = store.env("gw", AGENT_WATCHDOG_RUN=run.id)

                async def main():
                    async with stdio_session(env) as s:
                        first = await s.call_tool("search", {"q": "refund"})
                        second = await s.call_tool("flaky", {"n": 1})
                        await anyio.to_thread.run_sync(kill, store, run.id)
                        return first, second, await s.call_tool("search", {"q": "again"})

                first, second, refused = anyio.run(main)
                run.step(model="gpt-x", cost_eur=0.0)  # its writer learns of the stop at its next record
    finally:
        wd.close()
    assert not first.is_error and second.is_error  # the server's own failure, relayed
    assert refused.is_error and text(refused).startswith("agent-watchdog: run stopped: manual")
    assert calls_seen(env) == 2  # the refused call never reached the server
    seen = witnessed(store, run.id, 2)
    assert [(e.source, e.kind) for e in seen if e.seq >= WITNESS_SEQ_BASE] == [("mcp", "tool"), ("mcp", "tool")]
    assert [e.seq for e in witnessed(store, run.id, 2) if e.seq < WITNESS_SEQ_BASE] == [1, 2]  # the writer's, kept
    r = row(store, run.id)
    assert r.owner == store.logins["a"] and r.source == "sdk" and r.tool_calls == 0  # never rewritten


def test_mcp_proxy_refuses_a_run_another_logins_budget_stopped(store):
    run_id = stopped_by_budget(store, "b")
    env = store.env("gw", AGENT_WATCHDOG_RUN=run_id)

    async def main():
        async with stdio_session(env) as s:
            return await s.call_tool("search", {"q": "x"})

    refused = anyio.run(main)
    assert refused.is_error and text(refused).startswith("agent-watchdog: run stopped: max_steps")
    assert calls_seen(env) == 0


def test_mcp_proxy_refuses_its_own_run_once_killed(store):
    env = store.env("gw")

    async def main():
        async with stdio_session(env, "--agent", "pg-tools") as s:
            assert not (await s.call_tool("search", {"q": "a"})).is_error
            engine = make_engine(store.url("daemon"))
            try:
                with engine.connect() as conn:
                    (own,) = conn.execute(select(runs.c.id).where(runs.c.agent == "pg-tools")).scalars().all()
            finally:
                engine.dispose()
            await anyio.to_thread.run_sync(kill, store, own)
            return own, await s.call_tool("search", {"q": "b"})

    own, refused = anyio.run(main)
    assert refused.is_error and text(refused).startswith("agent-watchdog: run stopped: manual")
    assert calls_seen(env) == 1
    r = row(store, own)
    assert (r.owner, r.source, r.tool_calls, r.stop_reason) == (store.logins["gw"], "mcp", 1, "manual")


def test_mcp_proxy_with_an_agents_login_is_said_at_start(store):
    """An agents' login can witness no run of another login: said at start, not found out later."""
    a_run = stopped_by_budget(store, "a")
    env = store.env("b", AGENT_WATCHDOG_RUN=a_run)
    done = subprocess.run([*CLI, "mcp-proxy", "--", sys.executable, "-c", "pass"], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert "lacks the gateway's policy reading every run" in done.stderr and "gateway's role" in done.stderr


def test_mcp_proxy_whose_login_the_store_refuses_fails_open_and_says_the_fix_once(store):
    env = store.env("none")
    errlog = store.folder / "refused.err"

    async def main():
        with open(errlog, "w") as err:
            async with stdio_session(env, errlog=err) as s:
                return [await s.call_tool("echo", {"text": str(i)}) for i in range(3)]

    results = anyio.run(main)
    assert [r.is_error for r in results] == [False] * 3  # the tools keep working, unwatched
    assert calls_seen(env) == 3
    said = [line for line in errlog.read_text().splitlines() if "agent-watchdog" in line]
    assert len(said) == 1 and "grant it the gateway's role" in said[0], said
    assert "pass unrecorded" in said[0]


def test_the_gateway_login_claims_and_passes_a_circuit_probe_for_another_logins_run(store):
    """The circuit state the gateway reads (tool_circuits) and the half-open probe it claims, for a
    run of login A (the MCP proxy's witness, in process: the daemon's circuit is written by hand)."""
    from watchdog.gateways.mcp.witness import ToolWitness
    from watchdog.store.schema import circuit_probes, tool_circuits, utcnow

    owner = make_engine(store.url("daemon"))
    now = utcnow()
    with owner.begin() as conn:
        conn.execute(tool_circuits.insert().values(
            tool="verify_iban", state="open", opened_at=now - dt.timedelta(seconds=120),
            open_until=now - dt.timedelta(seconds=1), errors_in_window=5, window_s=60.0,
            last_error_class="ConnectionError", updated_at=now))
    a, gw = Watchdog(store.url("a"), attest_socket=""), Watchdog(store.url("gw"), attest_socket="", circuit_cache_s=0)
    try:
        run = a.run(agent="support-bot")
        run.start()
        witness = ToolWitness(gw, agent=None, run_id=run.id)
        probe = witness.admit("verify_iban", {"iban": "x"}, 7)
        assert not isinstance(probe, str) and probe.probe
        second = witness.admit("verify_iban", {"iban": "y"}, 8)  # one probe at a time
        assert isinstance(second, str) and second.startswith("agent-watchdog: tool unavailable"), second
        witness.finish(probe, ok=True)
        assert not witness._warned and not witness._misconfigured
        run.end("completed", None, None)
    finally:
        a.close()
        gw.close()
    with owner.connect() as conn:
        claim = conn.execute(select(circuit_probes)).one()
    owner.dispose()
    assert (claim.run_id, claim.ok) == (run.id, True)


# -- the LiteLLM proxy -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def litellm(store):
    """One real proxy for the module, its callback on the store as the gateway's login."""
    with proxy(store.folder, store.url("gw"), daemon_toml() + TOML) as base:
        yield base


def refusal(base: str, trace: str) -> str:
    with pytest.raises(openai.BadRequestError) as refused:
        call(base, trace)
    assert refused.value.status_code == 400
    return str(refused.value)


def test_litellm_records_another_logins_run_and_refuses_it_once_stopped(store, litellm):
    wd = Watchdog(store.url("a"), attest_socket="")
    try:
        with pytest.raises(RunKilled):
            with wd.run(agent="support-bot") as run:
                run.step(model="gpt-x", cost_eur=0.0)
                assert call(litellm, run.id).choices[0].message.content == "Hello from the mock"
                assert call(litellm, run.id).choices[0].message.content
                seen = witnessed(store, run.id, 2)
                kill(store, run.id)
                assert "agent-watchdog: run stopped: manual" in refusal(litellm, run.id)
                run.step(model="gpt-x", cost_eur=0.0)
    finally:
        wd.close()
    assert [(e.source, e.kind) for e in seen if e.seq >= WITNESS_SEQ_BASE] == [("litellm", "step")] * 2
    assert [e.seq for e in seen if e.seq < WITNESS_SEQ_BASE] == [1]
    r = row(store, run.id)
    assert r.owner == store.logins["a"] and r.source == "sdk" and r.steps == 2  # its own two: never rewritten
    assert "agent-watchdog: run stopped: max_steps" in refusal(litellm, stopped_by_budget(store, "b"))


def test_litellm_refuses_its_own_run_once_stopped(store, litellm):
    killed, spent = f"pg-own-{uuid.uuid4().hex[:8]}", f"pg-own-{uuid.uuid4().hex[:8]}"
    assert call(litellm, killed).choices[0].message.content
    kill(store, killed)
    assert "agent-watchdog: run stopped: manual" in refusal(litellm, killed)
    for _ in range(5):  # its budget: [defaults] max_steps = 5
        assert call(litellm, spent).choices[0].message.content
    end = time.monotonic() + DEADLINE_S
    while (r := row(store, spent)).steps < 5:
        assert time.monotonic() < end
        time.sleep(0.05)
    assert "agent-watchdog: run stopped: max_steps" in refusal(litellm, spent)
    for rid in (killed, spent):
        r = row(store, rid)
        assert (r.owner, r.source) == (store.logins["gw"], "litellm")
    assert row(store, spent).steps == 5  # the refused call never reached the model
