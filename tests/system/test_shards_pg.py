"""Issue 35: judges sharded by run id on PostgreSQL (watchdog.daemon.leases.shards), as real processes.

Two judge processes share one store's 16 shards by advisory locks. Forty running runs breach
their budget at once; one judge dies (SIGKILL) in the middle of its tick, with a stop decided in
its open transaction. The survivor takes the dead judge's shards within a tick, and every run
ends up stopped by exactly one decision: one `stop_requested` row and one alert per run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select, update

from agent_procs import wait_until
from daemon_support import alerts_of
from pg_support import empty_pg
from watchdog.daemon.stops.killer import Killer
from watchdog.store import shards as store_shards
from watchdog.store.engine import make_engine
from watchdog.store.schema import interventions, runs, utcnow

JUDGE = Path(__file__).resolve().parents[1] / "shard_judge.py"
N_SHARDS = 16
N_RUNS = 40
WAIT_S = 60.0


@pytest.fixture
def store(pg_migrated):
    empty_pg(pg_migrated)
    engine = make_engine(pg_migrated)
    yield pg_migrated, engine
    engine.dispose()


def _state(folder: Path, name: str) -> dict:
    try:
        return json.loads((folder / f"{name}.json").read_text())
    except (OSError, ValueError):
        return {"ticks": 0, "held": []}


def _stopping(engine, ids) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).where(runs.c.id.in_(ids), runs.c.status == "stopping")).scalar()


def _deciders(engine, judges, ids) -> dict[str, str]:
    """Run id -> the judge whose stop_requested row it has (by the pid in the row's actor)."""
    pids = {str(p.pid): name for name, p in judges.items()}
    with engine.connect() as conn:
        rows = conn.execute(select(interventions.c.run_id, interventions.c.actor)
                            .where(interventions.c.action == "stop_requested", interventions.c.run_id.in_(ids))).all()
    return {rid: pids.get(actor.rsplit(":", 1)[-1], actor) for rid, actor in rows}


def test_a_judge_killed_mid_tick_leaves_each_stop_decided_and_carried_out_once(store, tmp_path):
    url, engine = store
    now = utcnow()
    ids = [uuid.uuid4().hex for _ in range(N_RUNS)]
    with engine.begin() as conn:
        conn.execute(insert(runs), [dict(id=rid, agent="bot", status="running", kill_mode="cooperative",
                                         host=Killer().host, started_at=now, last_seen_at=now) for rid in ids])
    judges = {name: subprocess.Popen([sys.executable, str(JUDGE), url, str(tmp_path), name, str(N_SHARDS),
                                      "3" if name == "victim" else "0"])
              for name in ("victim", "survivor")}
    try:
        # Both present, the shards split between them (each its fair half), both ticking.
        assert wait_until(lambda: all(len(_state(tmp_path, n)["held"]) == N_SHARDS // 2 for n in judges)
                          and all(_state(tmp_path, n)["ticks"] >= 2 for n in judges), timeout_s=WAIT_S)
        held = {n: set(_state(tmp_path, n)["held"]) for n in judges}
        assert not held["victim"] & held["survivor"]
        victims = [rid for rid in ids if store_shards.shard_of(rid, N_SHARDS) in held["victim"]]
        others = [rid for rid in ids if rid not in victims]
        assert len(victims) >= 8 and len(others) >= 5  # 40 runs over 16 shards: ~20 each
        # Wave 1, both alive: each run over budget is decided by the judge that holds its shard.
        first = victims[:5] + others[:5]
        rest = [rid for rid in ids if rid not in first]
        with engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id.in_(first)).values(steps=5))
        assert wait_until(lambda: _stopping(engine, first) == len(first), timeout_s=WAIT_S)
        owner = {rid: "victim" if rid in victims else "survivor" for rid in ids}
        assert _deciders(engine, judges, first) == {rid: owner[rid] for rid in first}
        # Wave 2: the rest at once, and the victim dies in the middle of its tick.
        (tmp_path / "arm").write_text("")
        with engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id.in_(rest)).values(steps=5))  # its 3rd stop: where it dies
        assert wait_until(lambda: (tmp_path / "victim.hung").exists(), timeout_s=WAIT_S)
        judges["victim"].send_signal(signal.SIGKILL)
        judges["victim"].wait(10)
        assert wait_until(lambda: _state(tmp_path, "survivor")["held"] == list(range(N_SHARDS)), timeout_s=WAIT_S)

        assert wait_until(lambda: _stopping(engine, ids) == N_RUNS, timeout_s=WAIT_S)
        ticks = _state(tmp_path, "survivor")["ticks"]
        assert wait_until(lambda: _state(tmp_path, "survivor")["ticks"] >= ticks + 2, timeout_s=WAIT_S)
        with engine.connect() as conn:
            decided = conn.execute(select(interventions.c.run_id, interventions.c.actor)
                                   .where(interventions.c.action == "stop_requested")).all()
        per_run = {rid: [a for r, a in decided if r == rid] for rid in ids}
        assert all(len(actors) == 1 for actors in per_run.values()), per_run
        deciders = _deciders(engine, judges, ids)
        # The survivor decided its own runs and the dead judge's undecided ones (the hung decision
        # rolled back with the victim's transaction); no decision of the victim was made again.
        assert all(deciders[rid] == "survivor" for rid in ids if owner[rid] == "survivor")
        assert deciders[(tmp_path / "victim.hung").read_text()] == "survivor"
        # Carried out once: one stop alert per run, and the ladder's next step (the cooperative
        # stop not acknowledged within the tests' tiny grace) at most once per run, by one judge.
        kinds: dict[str, list[str]] = {}
        for a in alerts_of(engine, None):
            if a.run_id in per_run:
                kinds.setdefault(a.dedupe_key.split(":")[0], []).append(a.run_id)
        assert sorted(kinds.pop("stop")) == sorted(ids)
        for kind, rids in kinds.items():
            assert len(rids) == len(set(rids)), kind
    finally:
        for p in judges.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(10)


def test_an_agents_login_squatting_the_shard_keys_leaves_no_run_unjudged(pg_server_url, caplog):
    """Review R3: the keys are public hashes and advisory locks PUBLIC: an agents' login held every
    shard key (the judge held none: no run judged) or every member key (RuntimeError)."""
    import psycopg

    from test_partitions_pg import _drop, _make
    from watchdog.daemon.leases.shards import ShardSet

    s, admin = _make(pg_server_url)
    eng = make_engine(s.url("daemon"))
    ids = [uuid.uuid4().hex for _ in range(200)]
    n = 64
    try:
        with psycopg.connect(s.url("a").replace("+psycopg", ""), autocommit=True) as a:
            for i in range(n):  # (1) every shard key, (2) all member slots but the first
                assert a.execute("SELECT pg_try_advisory_lock(%s)", (store_shards.shard_key(i, n),)).fetchone()[0]
            for slot in range(1, store_shards.MAX_JUDGES):
                a.execute("SELECT pg_try_advisory_lock(%s)", (store_shards.member_key(slot),))
            one, two = ShardSet(eng, n), ShardSet(eng, n)
            try:
                one.rebalance()
                two.rebalance()
                assert one.slot == 0 and two.slot is None  # the second judges without a slot
                assert all(one.owns(rid) and two.owns(rid) for rid in ids)
                assert "sessions of other logins" in caplog.text and s.logins["a"] in caplog.text
                a.execute("SELECT pg_advisory_unlock_all()")  # the squat ends: the judges share the shards again
                one.rebalance()
                two.rebalance()
                assert not one.squatted and not two.squatted
                assert all(one.owns(rid) or two.owns(rid) for rid in ids)
                assert len(one.held) + len(two.held) == n
            finally:
                one.close()
                two.close()
            # (3) every member slot squatted: a judge still starts and judges every run.
            for slot in range(store_shards.MAX_JUDGES):
                a.execute("SELECT pg_try_advisory_lock(%s)", (store_shards.member_key(slot),))
            three = ShardSet(eng, n)
            try:
                three.rebalance()
                assert three.slot is None and len(three.held) == n
            finally:
                three.close()
    finally:
        eng.dispose()
        _drop(s, admin)
