"""Issue 35: `[daemon] shards` in real `agent-watchdog run` daemons, one PostgreSQL store.

Three hosts (UTS namespaces of their own, as tests/system/test_cluster.py), each with its own
daemon, state directory, key and socket, all three judges of one store's 16 shards. The agents
run on two of them; the third host's daemon only judges (its shards hold runs of the other two).

* Runaways ignoring SIGTERM (kill_mode "process"), decided by whichever judge holds their shard,
  are signalled by their own host's daemon only (SIGTERM, SIGKILL: the ladder stays the host's).
* Sixty cooperative runs breach at once, and the judge-only daemon is SIGKILLed at that moment
  (it holds shards, their breaches pending). The survivors take its shards within one lease
  period; every run ends `killed` with exactly one stop decision and one stop alert (rows counted).

Every wait polls the store or a process for a positive event, with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select, text

from agent_procs import as_host, wait_until
from daemon_support import daemon_toml
from watchdog.daemon.leases.lease import lease_s_for
from watchdog.store import shards as store_shards
from watchdog.store.schema import alerts, daemons, interventions, runs

pytestmark = [pytest.mark.slow, pytest.mark.postgres,
              pytest.mark.parametrize("db_url", ["postgresql"], indirect=True),
              pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root (unshare --uts)")]

AGENT_WATCHDOG = str(Path(sys.executable).parent / "agent-watchdog")
TICK_S = 0.5
N_SHARDS = 16
N_RUNS = 30  # cooperative runs per agent host
DEADLINE_S = 90.0
RUNAWAY = dict(kill_mode="process", budgets={"max_steps": 3}, steps=4, ignore_sigterm=True)


class Judge:
    """`agent-watchdog run` as the daemon of host `host`, with `[daemon] shards`."""

    def __init__(self, tmp: Path, host: str, url: str, alert_url: str):
        self.host = host
        daemon = daemon_toml(tick_s=TICK_S, cancel_grace_s=1, term_grace_s=1, alert_retry_s=1, shards=N_SHARDS)
        self.socket = next(line.split(" = ")[1].strip('"') for line in daemon.splitlines()
                           if line.startswith("socket = "))
        cfg = tmp / f"{host}.toml"
        cfg.write_text(f'[store]\nurl = "{url}"\n\n{daemon}\n'
                       '[prices."gpt-x"]\ninput_eur_per_mtok = 0.0\noutput_eur_per_mtok = 0.0\n\n'
                       f'[alerts]\nurls = ["{alert_url}"]\n')
        self.log_path = tmp / f"daemon-{host}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(as_host(host, [AGENT_WATCHDOG, "run", "--config", str(cfg)]), env=env,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def actor(self) -> str:
        return f"daemon@{self.host}:{self.proc.pid}"

    def ports(self) -> set[int]:
        """The local ports of its connections to the server (its sessions, seen from pg_stat_activity)."""
        try:
            return {c.laddr.port for c in psutil.Process(self.proc.pid).net_connections(kind="tcp")}
        except psutil.NoSuchProcess:
            return set()


@pytest.fixture
def judges(tmp_path, db_url, http):
    started: list[Judge] = []

    def start(host: str) -> Judge:
        j = Judge(tmp_path, host, db_url, http.url())
        started.append(j)
        return j

    yield start
    for j in started:
        if j.proc.poll() is None:
            j.proc.kill()
            j.proc.wait()


_LOCKS = text("SELECT l.classid::bigint, l.objid::bigint, a.client_port FROM pg_locks l "
              "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.objsubid = 1 "
              "AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())")


def held(engine, js) -> dict[str, set[int]]:
    """Host -> the shards its judge's sessions hold now (pg_locks, by the sessions' client ports)."""
    shard_of_key = {store_shards.shard_key(i, N_SHARDS): i for i in range(N_SHARDS)}
    ports = {p: j.host for j in js for p in j.ports()}
    out: dict[str, set[int]] = {j.host: set() for j in js}
    with engine.connect() as conn:
        for hi, lo, port in conn.execute(_LOCKS):
            unsigned = (int(hi) << 32) | int(lo)
            key = unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned
            if key in shard_of_key and port in ports:
                out[ports[port]].add(shard_of_key[key])
    return out


def _leader(engine) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(daemons.c.host).where(daemons.c.leader_since.is_not(None))).scalar()


def _statuses(engine, ids) -> Counter:
    with engine.connect() as conn:
        return Counter(s for (s,) in conn.execute(select(runs.c.status).where(runs.c.id.in_(ids))))


def _acts(engine, ids, *actions) -> list:
    with engine.connect() as conn:
        return conn.execute(select(interventions.c.run_id, interventions.c.action, interventions.c.actor)
                            .where(interventions.c.run_id.in_(ids), interventions.c.action.in_(actions))).all()


def test_sharded_daemons_decide_once_carry_out_on_their_host_and_take_a_dead_judges_shards(
        db_url, engine, judges, procs, tmp_path):
    h1 = judges("h1")
    assert wait_until(lambda: _leader(engine) == "h1", timeout_s=DEADLINE_S), h1.log_path.read_text()
    h2, h3 = judges("h2"), judges("h3")
    js = [h1, h2, h3]
    fair = -(-N_SHARDS // 3)
    assert wait_until(lambda: sorted(len(s) for s in held(engine, js).values()) == [fair - 1, fair - 1, fair]
                      or sorted(len(s) for s in held(engine, js).values()) == [fair - 2, fair, fair],
                      timeout_s=DEADLINE_S), held(engine, js)
    shares = held(engine, js)
    assert set().union(*shares.values()) == set(range(N_SHARDS))
    owner = {i: h for h, s in shares.items() for i in s}

    # -- runaways: decided by their shard's judge, signalled by their own host's daemon only -----
    runaways = [procs.start("runaway", db_url, host=j.host, env={"AGENT_WATCHDOG_SOCKET": j.socket}, **RUNAWAY)
                for j in (h1, h2) for _ in range(3)]
    run_host = {a.info["run_id"]: h for a, h in zip(runaways, ["h1"] * 3 + ["h2"] * 3)}
    for a in runaways:
        assert wait_until(lambda: a.proc.poll() is not None, timeout_s=DEADLINE_S), a.log()
    assert wait_until(lambda: _statuses(engine, list(run_host)) == Counter(killed=len(run_host)),
                      timeout_s=DEADLINE_S), _statuses(engine, list(run_host))
    actor = {j.host: j.actor for j in js}
    decided = {rid: a for rid, _, a in _acts(engine, list(run_host), "stop_requested")}
    assert sorted(decided) == sorted(run_host)  # one decision each...
    assert all(decided[rid] == actor[owner[store_shards.shard_of(rid, N_SHARDS)]] for rid in run_host)  # ...its judge's
    signals = _acts(engine, list(run_host), "sigterm", "sigkill")
    assert {(rid, action) for rid, action, _ in signals} == {(rid, a) for rid in run_host for a in ("sigterm", "sigkill")}
    assert all(a == actor[run_host[rid]] for rid, _, a in signals)  # the ladder: the host's own daemon
    assert any(decided[rid] != actor[run_host[rid]] for rid in run_host)  # (6 runs, 3 judges: some decided elsewhere)

    # -- sixty cooperative runs breach at once; the judge that runs no agent dies then -------------
    gate = tmp_path / "gate"
    agents = [procs.start("pauser", db_url, host=j.host, env={"AGENT_WATCHDOG_SOCKET": j.socket},
                          runs=[{"name": f"{j.host}-{i}", "before": 3, "after": 600, "interval": 0.25,
                                 "gate": str(gate), "budgets": {"max_steps": 3}} for i in range(N_RUNS)])
              for j in (h1, h2)]
    ids = [rid for a in agents for rid in a.info["run_ids"].values()]
    victims = [rid for rid in ids if owner[store_shards.shard_of(rid, N_SHARDS)] == "h3"]
    assert len(victims) >= 5, len(victims)  # 60 runs, h3 holds ~a third of the shards
    gate.write_text("")
    h3.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    h3.proc.wait(10)
    lease_s = lease_s_for(TICK_S)
    assert wait_until(lambda: set().union(*held(engine, [h1, h2]).values()) == set(range(N_SHARDS)),
                      timeout_s=lease_s), held(engine, [h1, h2])
    took_s = time.monotonic() - killed_at
    assert took_s <= lease_s

    assert wait_until(lambda: _statuses(engine, ids) == Counter(killed=len(ids)), timeout_s=DEADLINE_S), \
        _statuses(engine, ids)
    for a in agents:
        assert wait_until(lambda: a.proc.poll() is not None, timeout_s=DEADLINE_S), a.log()
        outcome = json.loads(a.result_path.read_text())
        assert {o["reason"] for o in outcome.values()} == {"max_steps"}
    stops = _acts(engine, ids, "stop_requested")
    assert Counter(rid for rid, _, _ in stops) == Counter({rid: 1 for rid in ids})  # decided once each
    by = {rid: a for rid, _, a in stops}
    assert all(by[rid] in (h1.actor, h2.actor) for rid in victims)  # the dead judge's: the survivors'
    with engine.connect() as conn:
        stop_alerts = Counter(conn.execute(select(alerts.c.run_id).where(
            alerts.c.run_id.in_(ids), alerts.c.dedupe_key.like("stop:%"))).scalars())
        every = conn.execute(select(alerts.c.run_id, alerts.c.dedupe_key).where(alerts.c.run_id.in_(ids))).all()
    assert stop_alerts == Counter({rid: 1 for rid in ids})  # alerted once each
    per_kind = Counter((key.split(":")[0], rid) for rid, key in every)
    assert max(per_kind.values()) == 1, per_kind  # nothing else about a run twice either
    # A run whose thread did not acknowledge the cooperative stop within the tests' tiny grace (a
    # loaded machine) is also told about once, as "did not stop; shares its process": timing, not
    # a second decision. Nothing else may be said of these runs.
    assert {kind for kind, _ in per_kind} <= {"stop", "escalate"}, sorted(key for _, key in every)
