"""Issue 32, the judge's side, on PostgreSQL with the shipped roles script: budgets count by whose
a run is, and no spend or event by another identity gets a run signalled (watchdog.core.whose).

One database for the file: a daemon login owning the tables, two agent logins (A, B) and a
gateway login. Victims are real SDK processes of login A, attested by the daemon's socket
(kill_mode process); each runs to exit 0 by itself while another login attacks it, and the
honest control of each attack (the run's own evidence) is still SIGTERMed.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from agent_procs import sigterm_pending, wait_until
from daemon_support import ME, actions, alerts_of, config, later, run_row
from pg_support import RolesStore, attested_daemon, raw
from watchdog.core import lifecycle as lc
from watchdog.core import whose
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store.schema import spend_ledger, utcnow

@pytest.fixture(scope="module")
def store(pg_server_url):
    with RolesStore(pg_server_url, "aw_whose").create() as s:
        yield s


@pytest.fixture
def daemon(store, attest):
    with attested_daemon(store, attest) as d:
        yield d


def _ticker(eng, cfg, sealer) -> Ticker:
    return Ticker(eng, cfg, Killer(allowed_users=[ME]), sealer=sealer)


def _raw(url: str):
    return raw(url, autocommit=True)


def _plain_run(url: str, agent: str, cost_eur: float, status: str = "running", source: str = "sql") -> str:
    """One run INSERTed with plain SQL by the login of `url` (its owner: that login)."""
    rid = uuid.uuid4().hex
    ended = ", now()" if status in lc.END_STATUSES else ", NULL"
    with _raw(url) as conn:
        conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, cost_eur, "
                     f"source, ended_at) VALUES (%s, %s, %s, 'cooperative', 'h', now(), now(), %s, %s{ended})",
                     (rid, agent, status, cost_eur, source))
    return rid


def _victim(procs, store, tmp_path, agent: str, **budgets):
    go = tmp_path / f"go-{agent}"
    v = procs.start("healthy", store.url("a"), agent=agent, go=str(go), budgets=budgets)
    return v, go


def _cfg(store, **agents):
    return config(agents={name: {"owners": [store.logins["a"]], **b} for name, b in agents.items()})


def _spent(tk, scope_name: str) -> float:
    return sum(s.spent_eur for s in tk.money.states if s.scope.name == scope_name and s.period == "day")


def _not_own_alerts(eng, rid):
    return [a for a in alerts_of(eng, rid) if a.dedupe_key.startswith("notown:")]


# -- attack 2: another agents' login INSERTs a run under the victim's agent name -----------------------


def test_another_logins_run_named_after_the_agent_books_under_its_owner_and_stops_no_one(
        store, daemon, procs, tmp_path):
    eng, sealer = daemon
    cfg = _cfg(store, victim2={"max_cost_eur_per_day": 50.0})
    victim, go = _victim(procs, store, tmp_path, "victim2")
    tk = _ticker(eng, cfg, sealer)
    now = utcnow()
    tk.tick(now)
    poison = _plain_run(store.url("b"), "victim2", 100.0)  # B's login: not in the profile's owners
    ended = _plain_run(store.url("b"), "victim2", 100.0, status=lc.COMPLETED)  # and one already ended
    for i in range(1, 5):
        tk.tick(later(now, i))
    assert _spent(tk, "victim2") < 1.0  # nothing of B's counts toward the agent's day
    assert _spent(tk, whose.owner_key(store.logins["b"])) == pytest.approx(200.0)  # booked under B
    row = run_row(eng, victim.run_id)
    assert (row.status, row.stop_reason) == (lc.RUNNING, None)
    from watchdog.store.ledger import period_report

    with eng.connect() as conn:  # `agent-watchdog budgets`, from the store alone, agrees
        shown = {s.scope.name: s.spent_eur for s in period_report(conn, cfg, later(now, 4)) if s.period == "day"}
    assert shown["victim2"] < 1.0 and shown[whose.owner_key(store.logins["b"])] == pytest.approx(200.0)
    owner_alerts = [a for a in alerts_of(eng, poison) if a.dedupe_key == f"owner:{poison}"]
    assert len(owner_alerts) == 1 and "[defaults]" in owner_alerts[0].title
    tk.money._booked_at = None  # book now: the ended run lands under its owner's name, not the agent's
    tk.tick(later(now, 40))
    with eng.connect() as conn:
        scopes = {r.scope for r in conn.execute(select(spend_ledger.c.scope))}
    assert f"agent:{whose.owner_key(store.logins['b'])}" in scopes and "agent:victim2" not in scopes
    assert run_row(eng, ended).booked_at is not None
    go.touch()
    assert victim.wait(30) == 0 and victim.result() == {}
    assert "sigterm" not in actions(eng, victim.run_id)


def test_the_owners_own_spend_over_the_day_still_gets_its_run_sigtermed(store, daemon, procs, tmp_path):
    eng, sealer = daemon
    cfg = _cfg(store, spender2={"max_cost_eur_per_day": 50.0})
    runaway = procs.start("runaway", store.url("a"), agent="spender2", kill_mode="process", steps=1,
                          then="attest_then_hang", block_sigterm=True)
    assert wait_until(lambda: run_row(eng, runaway.run_id).pid == runaway.pid)
    _plain_run(store.url("a"), "spender2", 100.0)  # A's own other run: A's day is spent
    tk = _ticker(eng, cfg, sealer)
    now = utcnow()
    tk.tick(now)
    for i in range(1, 4):
        tk.tick(later(now, i))
    assert run_row(eng, runaway.run_id).stop_reason == lc.DAILY_BUDGET
    assert wait_until(lambda: sigterm_pending(runaway.pid), 10)
    assert "sigterm" in actions(eng, runaway.run_id) and not _not_own_alerts(eng, runaway.run_id)


def test_an_open_profiles_day_spent_by_another_login_stops_the_run_cooperatively_only(
        store, daemon, procs, tmp_path):
    """No `owners` (check-config warns): anyone's runs count toward its day, so a spent day is not
    the run's own evidence: stopped cooperatively, never signalled, alerted with what was refused."""
    eng, sealer = daemon
    cfg = config(agents={"openbot": {"max_cost_eur_per_day": 50.0}})
    victim, go = _victim(procs, store, tmp_path, "openbot")
    tk = _ticker(eng, cfg, sealer)
    now = utcnow()
    tk.tick(now)
    _plain_run(store.url("b"), "openbot", 100.0)
    for i in range(1, 5):
        tk.tick(later(now, i))
    row = run_row(eng, victim.run_id)
    assert (row.status, row.stop_reason) == (lc.STOPPING, lc.DAILY_BUDGET)
    (held,) = _not_own_alerts(eng, victim.run_id)
    assert whose.OTHERS_SPEND in held.body
    go.touch()
    assert victim.wait(30) == 0
    assert "sigterm" not in actions(eng, victim.run_id)


def test_a_host_without_the_money_work_signals_on_the_owners_spent_day_the_leader_published(
        store, daemon, procs):
    eng, sealer = daemon
    cfg = _cfg(store, spender3={"max_cost_eur_per_day": 50.0})
    runaway = procs.start("runaway", store.url("a"), agent="spender3", kill_mode="process", steps=1,
                          then="attest_then_hang", block_sigterm=True)
    assert wait_until(lambda: run_row(eng, runaway.run_id).pid == runaway.pid)
    _plain_run(store.url("a"), "spender3", 100.0)
    now = utcnow()
    _ticker(eng, cfg, sealer).tick(now)  # the leader: spends, publishes the spent day, stops the run
    assert run_row(eng, runaway.run_id).stop_reason == lc.DAILY_BUDGET
    other = Ticker(eng, cfg, Killer(allowed_users=[ME]), sealer=sealer, money=False)  # a cluster's other host
    for i in range(1, 4):
        other.tick(later(now, i))
    assert wait_until(lambda: sigterm_pending(runaway.pid), 10)
    assert "sigterm" in actions(eng, runaway.run_id) and not _not_own_alerts(eng, runaway.run_id)


# -- attack 1, the budget side: a receiver-created run from a sender the profile does not name ----------


def test_a_span_run_the_daemon_created_for_another_sender_adds_nothing_to_the_agents_day(store, daemon):
    eng, sealer = daemon
    cfg = _cfg(store, spanbot={"max_cost_eur_per_day": 50.0})
    tk = _ticker(eng, cfg, sealer)
    # As the OTLP receiver writes it: the daemon's own login, source otlp, 4,300 EUR of claimed tokens.
    rid = _plain_run(store.url("daemon"), "spanbot", 4300.0, source="otlp")
    now = utcnow()
    for i in range(3):
        tk.tick(later(now, i))
    assert _spent(tk, "spanbot") == 0.0
    assert _spent(tk, whose.owner_key(store.daemon)) == pytest.approx(4300.0)  # its writer's own, proven
    assert run_row(eng, rid).stop_reason != lc.DAILY_BUDGET  # judged by [defaults]: its own max_cost
    assert not [s for s in tk.money.states if s.scope.name == "spanbot" and s.closed]


# -- attack 5: the gateway login appends events to another owner's healthy run --------------------------


def _gateway_tools(store, rid: str, n: int) -> None:
    with _raw(store.url("gw")) as conn:
        for i in range(n):
            conn.execute("INSERT INTO events (run_id, seq, at, kind, tool, args_hash, ok, source) "
                         "VALUES (%s, %s, now(), 'tool', 'search', %s, true, 'litellm')", (rid, 2**30 + 1000 + i, f"h{i}"))  # a gateway numbers from 2^30 (roles script)


def test_gateway_events_stop_a_run_cooperatively_and_never_get_it_signalled(store, daemon, procs, tmp_path):
    eng, sealer = daemon
    cfg = _cfg(store, gwvictim={"max_tool_calls": 10})
    victim, go = _victim(procs, store, tmp_path, "gwvictim", max_tool_calls=10)
    tk = _ticker(eng, cfg, sealer)
    now = utcnow()
    tk.tick(now)
    _gateway_tools(store, victim.run_id, 20)
    for i in range(1, 6):
        tk.tick(later(now, i))
    row = run_row(eng, victim.run_id)
    assert (row.status, row.stop_reason) == (lc.STOPPING, lc.MAX_TOOL_CALLS)  # cooperatively
    (held,) = _not_own_alerts(eng, victim.run_id)
    assert whose.GATEWAY_EVIDENCE in held.body
    assert "sigterm" not in actions(eng, victim.run_id)
    go.touch()
    assert victim.wait(30) == 0  # not signalled: it ended by itself
    assert victim.result() in ({}, {"stopped": lc.MAX_TOOL_CALLS})


def test_a_runs_own_tool_calls_over_its_budget_still_get_it_sigtermed_on_postgresql(store, daemon, procs):
    eng, sealer = daemon
    cfg = _cfg(store, ownbot={"max_tool_calls": 10})
    runaway = procs.start("runaway", store.url("a"), agent="ownbot", kill_mode="process", then="attest_then_hang",
                          block_sigterm=True, budgets={"max_tool_calls": 10},
                          tools=[("search", {"q": i}, True) for i in range(12)])
    assert wait_until(lambda: run_row(eng, runaway.run_id).pid == runaway.pid)
    tk = _ticker(eng, cfg, sealer)
    now = utcnow()
    for i in range(3):
        tk.tick(later(now, i))
    assert run_row(eng, runaway.run_id).stop_reason == lc.MAX_TOOL_CALLS
    assert wait_until(lambda: sigterm_pending(runaway.pid), 10)
    assert "sigterm" in actions(eng, runaway.run_id) and not _not_own_alerts(eng, runaway.run_id)


def test_check_config_warns_of_an_open_profile_on_postgresql_only(store, tmp_path):
    from click.testing import CliRunner

    from watchdog.cli import main

    path = tmp_path / "c.toml"
    path.write_text(f'[agents.openbot]\nmax_steps = 5\n[agents.mine]\nowners = ["{store.logins["a"]}"]\n')
    out = CliRunner().invoke(main, ["--db", store.url("daemon"), "check-config", str(path)])
    assert out.exit_code == 0, out.output
    (line,) = [w for w in out.output.splitlines() if "owners is not set" in w]
    assert "agents.openbot.owners" in line
    out = CliRunner().invoke(main, ["--db", f"sqlite:///{tmp_path / 'x.db'}", "check-config", str(path)])
    assert out.exit_code == 0 and "owners is not set" not in out.output

