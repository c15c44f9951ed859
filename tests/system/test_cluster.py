"""Three hosts on one PostgreSQL store, for real: each host is a UTS namespace of its own
(`unshare --uts`, root only) with its own hostname, running a real `agent-watchdog run`
and real agent processes; alerts go through apprise to a local HTTP receiver.

Every wait polls the store, the receiver or a process with a generous deadline: nothing
sleeps for a guessed duration, nothing asserts on timing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from agent_procs import as_host, wait_until
from daemon_support import daemon_toml
from watchdog.core import lifecycle as lc
from watchdog.store.leases import db_now
from watchdog.store.schema import alerts, daemons, interventions, runs, tool_circuits

pytestmark = [pytest.mark.slow, pytest.mark.postgres,
              pytest.mark.parametrize("db_url", ["postgresql"], indirect=True),
              pytest.mark.skipif(os.geteuid() != 0, reason="simulated hosts need root (unshare --uts)")]

AGENT_WATCHDOG = str(Path(sys.executable).parent / "agent-watchdog")
TICK_S = 0.5
DEADLINE_S = 60.0
NO_DAEMON = "agent-watchdog: a host has no live daemon: its runs cannot be signalled"  # .format(host): unchanged
RUNAWAY = dict(kill_mode="process", budgets={"max_steps": 3}, steps=4, ignore_sigterm=True)


def _config(path: Path, url: str, alert_url: str) -> tuple[Path, str]:
    """A host's config: its own key and attestation socket (hosts share this machine's /tmp)."""
    daemon = daemon_toml(tick_s=TICK_S, cancel_grace_s=1, term_grace_s=1, alert_retry_s=1)
    socket = re.search(r'^socket = "(.*)"$', daemon, re.M).group(1)
    path.write_text(
        f'[store]\nurl = "{url}"\n\n{daemon}\n'
        "[circuit]\nerrors = 3\nwindow_s = 60\nopen_s = 600\n\n"
        '[prices."gpt-x"]\ninput_eur_per_mtok = 0.0\noutput_eur_per_mtok = 0.0\n\n'
        f'[alerts]\nurls = ["{alert_url}"]\n')
    return path, socket


class HostDaemon:
    """`agent-watchdog run` as the daemon of host `host` (a UTS namespace of its own)."""

    def __init__(self, tmp: Path, host: str, cfg: Path, socket: str, name: str | None = None):
        self.host = host
        self.socket = socket  # where this host's agents attest their processes
        self.log_path = tmp / f"daemon-{name or host}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(as_host(host, [AGENT_WATCHDOG, "run", "--config", str(cfg)]), env=env,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def actor(self) -> str:
        return f"daemon@{self.host}:{self.proc.pid}"

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=DEADLINE_S)


@pytest.fixture
def hosts(tmp_path, db_url, http):
    started: list[HostDaemon] = []
    configs: dict[str, tuple[Path, str]] = {}

    def start(host, name=None):
        if host not in configs:  # one config (key, socket) per host, as each machine has its own
            configs[host] = _config(tmp_path / f"{host}.toml", db_url, http.url())
        cfg, socket = configs[host]
        d = HostDaemon(tmp_path, host, cfg, socket, name)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def _lease(engine, host):
    with engine.connect() as conn:
        row = conn.execute(select(daemons).where(daemons.c.host == host)).first()
        live = row is not None and row.expires_at is not None and row.expires_at > db_now(conn)
    return row if live else None


def _ticking(engine, d: HostDaemon) -> bool:
    row = _lease(engine, d.host)
    return row is not None and row.pid == d.proc.pid and row.last_tick_at is not None


def _leader(engine, ds) -> HostDaemon | None:
    alive = [d for d in ds if d.proc.poll() is None]
    for d in alive:
        row = _lease(engine, d.host)
        if row is not None and row.pid == d.proc.pid and row.leader_since is not None:
            return d
    return None


def _ivs(engine, **where):
    q = select(interventions).order_by(interventions.c.id)
    for k, v in where.items():
        q = q.where(interventions.c[k] == v)
    with engine.connect() as conn:
        return conn.execute(q).all()


def _titles(http) -> Counter:
    """Each title received, and each title with its body's first line (a circuit's names its tool:
    a title carries no writer text, issue 32)."""
    seen: Counter = Counter(p["title"] for p in http.received)
    seen.update(f'{p["title"]} | {p["message"].splitlines()[0]}' for p in http.received if p.get("message"))
    return seen


def _circuit_open(engine, tool) -> bool:
    with engine.connect() as conn:
        return conn.execute(select(tool_circuits.c.state).where(tool_circuits.c.tool == tool)).scalar() == "open"


def _agent(procs, url, d: HostDaemon, **spec):
    """An agent process on d's host, attesting to d (as that machine's agents would)."""
    return procs.start("runaway", url, host=d.host, env={"AGENT_WATCHDOG_SOCKET": d.socket}, **spec)


def _fail_tool(procs, url, d: HostDaemon, tool):
    """An agent on d's host whose three calls of `tool` fail (then it leaves without ending its run)."""
    return _agent(procs, url, d, kill_mode="cooperative", tools=[[tool, {"i": i}, False] for i in range(3)],
                  then="exit")


def test_three_hosts_each_daemon_kills_its_own_leader_failover_and_a_host_without_daemon(
        db_url, engine, hosts, procs, http):
    h1, h2, h3 = (hosts(h) for h in ("h1", "h2", "h3"))
    ds = [h1, h2, h3]
    assert wait_until(lambda: all(_ticking(engine, d) for d in ds), DEADLINE_S), [d.log() for d in ds]
    assert wait_until(lambda: _leader(engine, ds) is not None, DEADLINE_S)

    # -- each host's SIGTERM-ignoring runaway is killed by its own daemon only -------------------
    runaways = {d.host: _agent(procs, db_url, d, then="hang", **RUNAWAY) for d in ds}
    for d in ds:
        agent = runaways[d.host]
        assert agent.wait(timeout_s=DEADLINE_S) == -signal.SIGKILL, d.log()
        assert wait_until(lambda: _run_status(engine, agent.run_id) == lc.KILLED, DEADLINE_S), d.log()
        acts = _ivs(engine, run_id=agent.run_id)
        assert [a.action for a in acts] == ["stop_requested", "sigterm", "sigkill", "ended"]
        assert {a.actor for a in acts} == {d.actor}, f"{d.host}'s run was handled by {[a.actor for a in acts]}"
    with engine.connect() as conn:
        assert {r.host for r in conn.execute(select(runs.c.host))} == {"h1", "h2", "h3"}

    # -- the leader's circuits and alerts; kill it; they go on under the next one -----------------
    leader = _leader(engine, ds)
    others = [d for d in ds if d is not leader]
    _fail_tool(procs, db_url, others[0], "flaky_a")
    assert wait_until(lambda: _circuit_open(engine, "flaky_a"), DEADLINE_S), leader.log()
    (opened,) = _ivs(engine, action="circuit_open", tool="flaky_a")
    assert opened.actor == leader.actor  # a cluster duty: the leader's, whoever's run failed
    assert wait_until(lambda: _titles(http)["agent-watchdog: a tool's circuit is OPEN — 3 errors in 60 s"] == 1,
                      DEADLINE_S)

    def marked_delivered(title_):  # received AND recorded: the kill below must not fall in between
        with engine.connect() as conn:
            return conn.execute(select(alerts.c.delivered_at).where(alerts.c.title == title_)).scalar() is not None

    assert wait_until(lambda: marked_delivered("agent-watchdog: a tool's circuit is OPEN — 3 errors in 60 s"),
                      DEADLINE_S)
    leader.proc.kill()  # dies without releasing anything
    leader.proc.wait()
    assert wait_until(lambda: _leader(engine, others) is not None, DEADLINE_S), [d.log() for d in others]
    successor = _leader(engine, others)
    _fail_tool(procs, db_url, successor, "flaky_b")
    assert wait_until(lambda: _circuit_open(engine, "flaky_b"), DEADLINE_S), successor.log()
    (opened,) = _ivs(engine, action="circuit_open", tool="flaky_b")
    assert opened.actor == successor.actor
    assert wait_until(lambda: _titles(http)["agent-watchdog: a tool's circuit is OPEN — 3 errors in 60 s"] == 1,
                      DEADLINE_S)  # delivered by the new leader

    # -- stop one host's daemon: its runaway is stopped cooperatively by another, alerted once --------
    (follower,) = [d for d in others if d is not successor]
    assert follower.stop() == 0, follower.log()
    orphan = _agent(procs, db_url, follower, then="loop", interval=0.1, **RUNAWAY)
    assert orphan.wait(timeout_s=DEADLINE_S) == 0, orphan.log()  # it saw the stop and left: no signal
    assert orphan.result()["killed"] == lc.MAX_STEPS
    acts = _ivs(engine, run_id=orphan.run_id)
    assert [a.action for a in acts][:1] == ["stop_requested"] and "sigterm" not in [a.action for a in acts]
    assert acts[0].actor == successor.actor
    title = NO_DAEMON.format(follower.host)
    assert wait_until(lambda: _titles(http)[title] == 1, DEADLINE_S), successor.log()
    (adopted,) = _ivs(engine, action="no_daemon")
    assert adopted.detail == f"host {follower.host}" and adopted.actor == successor.actor

    # -- every alert the store queued reached the receiver exactly once ----------------------------
    # (each daemon delivers the alerts it sealed: the killed leader's undelivered ones, if any,
    # wait for its host's next daemon; the stopped follower delivered its own on the way out)
    def delivered_by(host):
        with engine.connect() as conn:
            return conn.execute(select(alerts).where(alerts.c.sealed_by == host,
                                                     alerts.c.delivered_at.is_(None))).first() is None

    assert wait_until(lambda: delivered_by(successor.host) and delivered_by(follower.host), DEADLINE_S)
    for _ in range(6):  # a few more ticks of the leader: nothing is sent again
        assert wait_until(lambda: _ticked_since(engine, successor), DEADLINE_S)
    with engine.connect() as conn:
        delivered = Counter(r.title for r in conn.execute(
            select(alerts.c.title).where(alerts.c.delivered_at.is_not(None))))
    received = Counter(p["title"] for p in http.received)
    assert received == delivered  # every delivered alert received once, nothing else received
    assert delivered[title] == 1
    assert successor.stop() == 0, successor.log()
    for d in (follower, successor):
        assert "Traceback" not in d.log(), d.log()


_last_tick: dict = {}


def _ticked_since(engine, d) -> bool:
    row = _lease(engine, d.host)
    if row is None or row.last_tick_at is None:
        return False
    before = _last_tick.get(d.host)
    _last_tick[d.host] = row.last_tick_at
    return before is not None and row.last_tick_at > before


def _run_status(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(runs.c.status).where(runs.c.id == run_id)).scalar()


def test_two_daemons_started_at_once_on_one_host_one_runs_and_the_other_exits_0_naming_it(
        db_url, engine, hosts):
    for attempt in range(3):
        a, b = hosts("h4", f"h4a{attempt}"), hosts("h4", f"h4b{attempt}")
        assert wait_until(lambda: a.proc.poll() is not None or b.proc.poll() is not None, DEADLINE_S)
        exited, running = (a, b) if a.proc.poll() is not None else (b, a)
        assert exited.proc.returncode == 0, exited.log()
        (line,) = exited.log().strip().splitlines()
        assert line.startswith(f"agent-watchdog: another agent-watchdog daemon (pid {running.proc.pid}, started ")
        assert line.endswith("is already watching this store on h4; this one exits")
        assert wait_until(lambda: _ticking(engine, running), DEADLINE_S), running.log()
        assert running.proc.poll() is None
        assert running.stop() == 0, running.log()
