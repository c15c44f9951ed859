"""The attestation socket against real processes, a real Unix socket and real stores.

The peer's identity comes from the kernel (SO_PEERCRED), never from what it says;
a forged, copied or outdated attestation row names nobody.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest
from sqlalchemy import insert, select, update

from attest_support import Attestor, short_dir
from watchdog.core.seal import Sealer
from watchdog.daemon.stops.attest import AttestServer, verified_leader
from watchdog.errors import ConfigError
from watchdog.sdk.attest import request
from watchdog.store.engine import make_engine
from watchdog.store.schema import attestations, runs, utcnow

# A real agent process: registers a run through the SDK (its automatic attestation
# off), then names a run over the socket itself ("-" = its own, "none" = it does not ask);
# then, for each line "RUN_ID KILL_MODE" on stdin, asks again and prints the reply.
CHILD = r"""
import json, os, sys
from watchdog import Watchdog
from watchdog.sdk.attest import request
url, path, name_run, kill_mode = sys.argv[1:5]
wd = Watchdog(url)
run = wd.run(agent="att", kill_mode=kill_mode, guards=False).start()
ok, why = (None, "") if name_run == "none" else request(path, run.id if name_run == "-" else name_run, kill_mode)
print(json.dumps({"run_id": run.id, "pid": os.getpid(), "ok": ok, "why": why}), flush=True)
for line in sys.stdin:
    rid, mode = line.split()
    print(json.dumps(request(path, rid, mode)), flush=True)
"""


def ask(p, run_id, kill_mode="process"):
    """Have child `p` ask the daemon to attest `run_id`: (ok, why)."""
    p.stdin.write(f"{run_id} {kill_mode}\n")
    p.stdin.flush()
    return tuple(json.loads(p.stdout.readline()))


@pytest.fixture
def attestor(db_url):
    a = Attestor(db_url).start()
    yield a
    a.close()


@pytest.fixture
def children():
    started = []

    def start(url, path, name_run="-", kill_mode="process"):
        env = dict(os.environ, AGENT_WATCHDOG_SOCKET="")
        p = subprocess.Popen([sys.executable, "-c", CHILD, url, path, name_run, kill_mode], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started.append(p)
        line = p.stdout.readline()
        assert line, "the child died before it reported"
        return p, json.loads(line)

    yield start
    for p in started:
        p.kill()
        p.wait()


def run_row(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).one()


def attestation(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(select(attestations).where(attestations.c.run_id == run_id)).first()


def test_a_process_is_attested_as_the_kernel_reports_it(db_url, engine, attestor, children):
    p, info = children(db_url, attestor.socket)
    assert (info["ok"], info["why"]) == (True, "")
    a = attestation(engine, info["run_id"])
    assert (a.pid, a.uid, a.host, a.kill_mode) == (p.pid, os.geteuid(), attestor.host, "process")
    assert a.pid_create_time == psutil.Process(p.pid).create_time()
    with engine.connect() as conn:
        leader, why = verified_leader(conn, run_row(engine, info["run_id"]), attestor.sealer)
    assert (leader.pid, leader.create_time, leader.uid, why) == (p.pid, a.pid_create_time, os.geteuid(), "")
    # Asking again changes nothing; another process asking for it gets nothing.
    assert ask(p, info["run_id"]) == (True, "")
    assert request(attestor.socket, info["run_id"], "process")[0] is False
    assert attestation(engine, info["run_id"]).attested_at == a.attested_at


def test_a_process_cannot_attest_a_run_that_is_not_its_own(db_url, engine, attestor, children):
    _victim, v = children(db_url, attestor.socket, name_run="none")
    _mallory, m = children(db_url, attestor.socket, name_run=v["run_id"])
    assert m["ok"] is False and f"registered with pid {v['pid']}, you are pid {m['pid']}" in m["why"]
    assert attestation(engine, v["run_id"]) is None
    # Nor a run that does not exist.
    assert ask(_mallory, "f" * 32) == (False, f"no run {'f' * 32!r} in the store")


def test_a_run_row_rewritten_to_name_the_attesting_process_is_still_checked(db_url, engine, attestor, children):
    """A row changed to point at the peer must also carry the peer's create time and kill mode."""
    p, info = children(db_url, attestor.socket, name_run="none", kill_mode="cooperative")
    ok, why = ask(p, info["run_id"], "process")
    assert not ok and "kill_mode 'cooperative'" in why


def test_forged_copied_and_outdated_attestations_name_nobody(db_url, engine, attestor, children):
    _a, a = children(db_url, attestor.socket)
    pb, b = children(db_url, attestor.socket, name_run="none")
    good = attestation(engine, a["run_id"])
    b_row = run_row(engine, b["run_id"])
    forged = dict(run_id=b["run_id"], host=b_row.host, pid=b_row.pid, pid_create_time=b_row.pid_create_time,
                  uid=os.geteuid(), kill_mode="process", attested_at=utcnow())
    with engine.begin() as conn:
        conn.execute(insert(attestations).values(**forged, mac="0" * 64))
    with engine.connect() as conn:
        assert verified_leader(conn, b_row, attestor.sealer) == (
            None, "its attestation's seal does not verify (forged or from another daemon)")
    with engine.begin() as conn:  # the MAC of another run's genuine attestation
        conn.execute(update(attestations).where(attestations.c.run_id == b["run_id"]).values(mac=good.mac))
    with engine.connect() as conn:
        assert verified_leader(conn, b_row, attestor.sealer)[0] is None
    with engine.connect() as conn:  # another daemon's key
        assert verified_leader(conn, run_row(engine, a["run_id"]), Sealer(os.urandom(32)))[0] is None
    with engine.begin() as conn:  # the row moved to another pid after the attestation
        conn.execute(update(runs).where(runs.c.id == a["run_id"]).values(pid=1))
    with engine.connect() as conn:
        assert verified_leader(conn, run_row(engine, a["run_id"]), attestor.sealer) == (
            None, "the run row no longer matches what was attested")
    # A genuine attestation replaces a forged row.
    assert ask(pb, b["run_id"]) == (True, "")
    with engine.connect() as conn:
        assert verified_leader(conn, b_row, attestor.sealer)[0].pid == b["pid"]


def _raw(path: str, payload: bytes, shut: bool = True) -> bytes:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    try:
        s.sendall(payload)
        if shut:
            s.shutdown(socket.SHUT_WR)
        return s.recv(4096)
    finally:
        s.close()


def test_malformed_requests_are_answered_and_the_server_goes_on(db_url, attestor, children):
    for payload, why in [(b"not json\n", "one line of JSON"), (b"[1]\n", "JSON object"),
                         (b'{"run": 42}\n', "run id"), (b"x" * 5000, "longer than 512 bytes"),
                         (b"\xff\xfe\n", "one line of JSON")]:
        reply = json.loads(_raw(attestor.socket, payload))
        assert reply["ok"] is False and why in reply["error"], (payload[:20], reply)
    _p, info = children(db_url, attestor.socket)
    assert info["ok"] is True


def test_a_peer_that_says_nothing_holds_one_slot_for_the_timeout_only(db_url, attestor, children):
    silent = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
    try:
        for s in silent:
            s.connect(attestor.socket)
        t0 = time.monotonic()
        _p, info = children(db_url, attestor.socket)  # served meanwhile
        assert info["ok"] is True
        silent[0].settimeout(30)
        assert silent[0].recv(4096).startswith(b'{"ok": false')  # timed out, answered, closed
        assert time.monotonic() - t0 < 30
    finally:
        for s in silent:
            s.close()


def test_the_socket_path_is_checked_at_start(sqlite_url):
    engine = make_engine(sqlite_url)
    sealer = Sealer(os.urandom(32))
    folder = short_dir()
    path = str(folder / "attest.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # left behind by a daemon that died: replaced
    first = AttestServer(engine, sealer, path, "h").start()
    try:
        assert oct(os.stat(path).st_mode & 0o777) == "0o666"
        with pytest.raises(ConfigError, match=r"\[daemon\] socket = .*another daemon is listening"):
            AttestServer(engine, sealer, path, "h").start()
    finally:
        first.stop()
    assert not os.path.exists(path)
    (folder / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a socket"):
        AttestServer(engine, sealer, str(folder / "file"), "h").start()
    with pytest.raises(ConfigError, match="does not exist"):
        AttestServer(engine, sealer, str(folder / "no" / "s.sock"), "h").start()
    engine.dispose()


def test_no_daemon_is_a_reason_not_an_error(tmp_path):
    ok, why = request(str(tmp_path / "absent.sock"), "a" * 32, "process")
    assert not ok and why.startswith("no daemon at ")
    assert request("", "a" * 32, "process") == (False, "attestation is off (empty socket path)")
