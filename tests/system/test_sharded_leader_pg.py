"""Issue 35: a sharded leader folds only its shards' and its own host's events
(watchdog.daemon.tick.tickread._folded), yet its store-wide duties still see every run: the
circuits count tool errors of runs in another judge's shards (watchdog.daemon.tick.toolwatch),
and a period budget counts the live spend of another judge's runs from their rows.

Two judges in this process (real Tickers, real leases and advisory locks on PostgreSQL), the
runs on a host with no daemon (the leader adopts it): the leader judges none of them."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy import insert, select, update

from pg_support import empty_pg
from watchdog.core.config import Budgets, CircuitConfig, CircuitPolicy, Config, DaemonConfig, StoreConfig
from watchdog.daemon.leases.cluster import Membership
from watchdog.daemon.leases.lease import lease_for
from watchdog.daemon.leases.shards import ShardSet
from watchdog.daemon.stops.circuits import CircuitBreakers
from watchdog.daemon.stops.killer import Killer
from watchdog.daemon.tick.ticker import Ticker
from watchdog.store import shards as store_shards
from watchdog.store.engine import make_engine
from watchdog.store.schema import events, runs, tool_circuits, utcnow

pytestmark = pytest.mark.postgres

N_SHARDS = 4
HOST = "fleet-host"  # no daemon: adopted by the leader


@pytest.fixture
def judges(pg_migrated, tmp_path):
    empty_pg(pg_migrated)
    engine = make_engine(pg_migrated)
    budgets = Budgets(max_steps=1000, max_tool_calls=1000, max_cost_eur=1000.0, max_cost_eur_per_day=10.0)
    made = []
    for name in ("judge-a", "judge-b"):
        config = Config(daemon=DaemonConfig(tick_s=1.0, state_dir=str(tmp_path / name)), store=StoreConfig(keep_days=0),
                        defaults=budgets, agents={"bot": budgets},
                        circuit=CircuitConfig(default=CircuitPolicy(errors=5, window_s=60.0, open_s=120.0)))
        lease = lease_for(engine, name, tick_s=1.0)
        lease.acquire()
        ticker = Ticker(engine, config, Killer(), membership=Membership(engine, name, lease),
                        circuits=CircuitBreakers(config))
        made.append((ticker, ShardSet(engine, N_SHARDS), lease))
    for _, shards, _ in made:
        shards.rebalance()
    for _, shards, _ in made:
        shards.rebalance()
    yield engine, made
    for _, shards, lease in made:
        shards.close()
        lease.release()
    engine.dispose()


def _tick_all(made, now: dt.datetime):
    for ticker, shards, _ in made:
        shards.before_tick(ticker)
        ticker.tick(now)


def _leader(made):
    leaders = [(t, s) for t, s, _ in made if t.this is not None and t.this.rep.leader]
    assert len(leaders) == 1
    return leaders[0]


def _runs_not_of(shards: ShardSet, n: int) -> list[str]:
    """n run ids whose shard the leader does not hold (another judge's)."""
    out: list[str] = []
    while len(out) < n:
        rid = uuid.uuid4().hex
        if store_shards.shard_of(rid, N_SHARDS) not in shards.held:
            out.append(rid)
    return out


def _start(engine, ids: list[str]) -> None:
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(insert(runs), [dict(id=rid, agent="bot", status="running", kill_mode="cooperative", host=HOST,
                                         started_at=now, last_seen_at=now) for rid in ids])


def test_the_leader_opens_a_circuit_on_errors_of_other_judges_runs(judges):
    engine, made = judges
    _tick_all(made, utcnow())
    leader, held = _leader(made)
    assert held.held and len(held.held) < N_SHARDS  # the shards are shared
    ids = _runs_not_of(held, 5)
    _start(engine, ids)
    _tick_all(made, utcnow())
    now = utcnow()
    with engine.begin() as conn:
        for i, rid in enumerate(ids):
            conn.execute(insert(events).values(run_id=rid, seq=1, kind="tool", tool="flaky", ok=False, at=now,
                                               args_hash=f"h{i}", error_class="TimeoutError", error_msg="timed out"))
            conn.execute(update(runs).where(runs.c.id == rid).values(tool_calls=1, last_seq=1))
    _tick_all(made, now + dt.timedelta(seconds=1))
    assert not any(leader.scanner.stats.get(rid) for rid in ids)  # the leader folded none of their events
    with engine.connect() as conn:
        state = conn.execute(select(tool_circuits.c.state).where(tool_circuits.c.tool == "flaky")).scalar()
    assert state == "open"


def test_a_period_budget_counts_other_judges_runs_by_their_rows(judges):
    engine, made = judges
    _tick_all(made, utcnow())
    leader, held = _leader(made)
    ids = _runs_not_of(held, 3)
    _start(engine, ids)
    _tick_all(made, utcnow())
    now = utcnow()
    with engine.begin() as conn:  # each run 4 EUR: 12 EUR live, over the agent's 10 EUR a day
        for rid in ids:
            conn.execute(insert(events).values(run_id=rid, seq=1, kind="step", at=now, tokens_in=10, tokens_out=10,
                                               cost_eur=4.0, model="gpt-x"))
            conn.execute(update(runs).where(runs.c.id == rid).values(steps=1, cost_eur=4.0, last_seq=1))
    for k in range(1, 4):
        _tick_all(made, now + dt.timedelta(seconds=k))
    with engine.connect() as conn:
        got = dict(conn.execute(select(runs.c.id, runs.c.status).where(runs.c.id.in_(ids))).all())
    assert not any(leader.scanner.evidence.get(rid) for rid in ids)  # counted from the rows, not folded here
    assert set(got.values()) <= {"stopping", "stopped"} and got, got
