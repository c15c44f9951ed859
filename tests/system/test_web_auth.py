"""The web view is private (issue 32 item 11): the real `agent-watchdog web` on a real port, a
real HTTP client, a real PostgreSQL store with the roles script and two agents' logins.

Without credentials nothing of the store is served (401); a bearer token and a PBKDF2 user
(made by `web --hash-password`) are let in; `--owner` shows one owner's runs and 404s the
other's; it refuses to start beyond loopback without --auth-file, and with an auth file other
users can read. The "no live daemon since" banner follows the daemons' leases (issue 36)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from watchdog import Watchdog
from watchdog.store.engine import make_engine

CLI = shutil.which("agent-watchdog", path=str(Path(sys.executable).parent)) or "agent-watchdog"
SCRIPT = Path(__file__).resolve().parents[2] / "sql" / "postgres-roles.sql"
PASSWORD = "correct horse battery staple"
ENV = {k: v for k, v in os.environ.items() if k not in ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str, auth: str | None = None) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": auth} if auth else {})
        res = conn.getresponse()
        headers: dict[str, list[str]] = {}
        for k, v in res.getheaders():
            headers.setdefault(k.lower(), []).append(v)
        return res.status, headers, res.read().decode()
    finally:
        conn.close()


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def store(pg_migrated):
    """Two agents' logins, each with a run, and a viewer login; the roles dropped afterwards."""
    from pg_support import empty_pg

    empty_pg(pg_migrated)
    tag = uuid.uuid4().hex[:8]
    group, gateway, viewer_role = f"aw_agents_{tag}", f"aw_gateway_{tag}", f"aw_viewer_{tag}"
    alice, bob, viewer = f"aw_alice_{tag}", f"aw_bob_{tag}", f"aw_view_{tag}"
    url = make_url(pg_migrated)
    done = subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-v", f"agents_role={group}", "-v",
                           f"gateway_role={gateway}", "-v", f"viewer_role={viewer_role}", "-h", url.host,
                           "-p", str(url.port or 5432), "-U", url.username, "-d", url.database, "-f", str(SCRIPT)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    admin = make_engine(pg_migrated)
    with admin.begin() as conn:
        for login, role in ((alice, group), (bob, group), (viewer, viewer_role)):
            conn.execute(text(f'CREATE ROLE "{login}" LOGIN'))
            conn.execute(text(f'GRANT "{role}" TO "{login}"'))
    ids = {}
    for login in (alice, bob):
        wd = Watchdog(url.set(username=login).render_as_string(hide_password=False), attest_socket="")
        with wd.run(agent=f"bot-of-{login}", labels={"conversation": f"secret-{login}"}) as run:
            run.step(model="m", tokens_in=10, tokens_out=1, cost_eur=0.001)
            run.tool_call("search", {"q": 1}, lambda q: "hit")
        ids[login] = run.id
        wd.close()
    yield {"alice": alice, "bob": bob, "ids": ids, "admin": admin,
           "viewer_url": url.set(username=viewer).render_as_string(hide_password=False)}
    with admin.begin() as conn:
        for login in (alice, bob, viewer):
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{login}'"))
        for role in (alice, bob, viewer, group, gateway, viewer_role):
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
    admin.dispose()


@pytest.fixture(scope="module")
def web(store, tmp_path_factory):
    folder = tmp_path_factory.mktemp("webauth")
    hashed = subprocess.run([CLI, "web", "--hash-password"], input=PASSWORD + "\n", capture_output=True,
                            text=True, timeout=60, env=ENV)
    assert hashed.returncode == 0 and hashed.stdout.startswith("$pbkdf2-sha256$"), hashed.stderr
    token = secrets.token_urlsafe(32)
    auth_file = folder / "web.auth"
    auth_file.write_text(f"# the view's readers\n{token}\nalice:{hashed.stdout.strip()}\n")
    auth_file.chmod(0o600)
    port = _free_port()
    log = folder / "web.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([CLI, "--db", store["viewer_url"], "web", "--listen", f"127.0.0.1:{port}",
                                 "--auth-file", str(auth_file), "--owner", store["alice"]],
                                env=ENV, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            if _get(port, "/")[0] == 401:
                break
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    yield {"port": port, "token": token, "log": log, **store}
    proc.terminate()
    assert proc.wait(timeout=30) == 0, log.read_text()


def test_without_credentials_nothing_is_served(web):
    for path in ("/", "/api/runs", f"/api/runs/{web['ids'][web['alice']]}", f"/runs/{web['ids'][web['alice']]}",
                 "/static/style.css", "/budgets"):
        for auth in (None, "Bearer " + "x" * 43, _basic("alice", "wrong"), _basic("mallory", PASSWORD), "Basic !!"):
            status, headers, body = _get(web["port"], path, auth)
            assert status == 401, (path, auth)
            assert {'Basic realm="agent-watchdog", charset="UTF-8"', 'Bearer realm="agent-watchdog"'} <= set(
                headers["www-authenticate"]), path
            assert not any(rid in body for rid in web["ids"].values()), path


def test_a_bearer_token_and_a_basic_user_are_let_in_and_never_logged(web):
    for auth in ("Bearer " + web["token"], _basic("alice", PASSWORD)):
        status, _, body = _get(web["port"], "/api/runs", auth)
        assert status == 200, auth
        assert [r["id"] for r in json.loads(body)] == [web["ids"][web["alice"]]]
    log = web["log"].read_text()
    assert " 401 " in log and " 200 " in log  # the requests are logged ...
    assert web["token"] not in log and PASSWORD not in log  # ... their secrets are not
    assert base64.b64encode(f"alice:{PASSWORD}".encode()).decode() not in log


def test_owner_scopes_the_pages_and_the_api_to_one_owners_runs(web):
    auth = "Bearer " + web["token"]
    mine, theirs = web["ids"][web["alice"]], web["ids"][web["bob"]]
    status, _, page = _get(web["port"], "/", auth)
    assert status == 200 and mine in page and theirs not in page and f"secret-{web['bob']}" not in page
    for path in (f"/runs/{theirs}", f"/runs/{theirs[:8]}", f"/api/runs/{theirs}", f"/runs/{theirs}/postmortem",
                 f"/runs/{theirs}/timeline.svg", f"/runs/{theirs}/postmortem.md", f"/api/runs?before={theirs}"):
        status, _, body = _get(web["port"], path, auth)
        assert status == 404 and f"bot-of-{web['bob']}" not in body, path
    assert _get(web["port"], f"/api/runs/{mine}", auth)[0] == 200
    status, _, postmortem = _get(web["port"], f"/runs/{mine}/postmortem.md", auth)
    assert status == 200 and theirs[:8] not in postmortem and web["bob"] not in postmortem  # overlapping runs: hers
    assert _get(web["port"], "/api/budgets", auth)[0] == 404  # period spend adds up every owner's runs


def test_the_banner_says_when_no_daemon_is_alive(web):
    auth = "Bearer " + web["token"]
    assert "no live daemon: none has ticked" in _get(web["port"], "/", auth)[2]
    with web["admin"].begin() as conn:
        conn.execute(text("INSERT INTO daemons (host, pid, pid_create_time, started_at, last_tick_at, expires_at) "
                          "VALUES ('h1', 42, 1.0, now() - interval '1 hour', timestamptz '2026-01-02 03:04:05+00', "
                          "now() + interval '30 seconds')"))
    try:
        assert 'id="daemon-banner"' not in _get(web["port"], f"/runs/{web['ids'][web['alice']]}", auth)[2]
        with web["admin"].begin() as conn:
            conn.execute(text("UPDATE daemons SET expires_at = now() - interval '1 second'"))
        assert "no live daemon since 2026-01-02 03:04:05 UTC" in _get(web["port"], "/", auth)[2]
    finally:
        with web["admin"].begin() as conn:
            conn.execute(text("DELETE FROM daemons"))


def _start(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, "--db", f"sqlite:///{tmp_path / 'none.db'}", "web", *args], capture_output=True,
                          text=True, timeout=60, env=ENV, stdin=subprocess.DEVNULL)


def test_it_refuses_to_start_open_beyond_loopback_or_with_a_readable_auth_file(tmp_path):
    for args in (["--listen", "0.0.0.0:0"], ["--listen", "0.0.0.0:0", "--no-auth"], ["--listen", "[::]:0"]):
        done = _start(tmp_path, *args)
        assert done.returncode != 0 and "beyond loopback: give --auth-file" in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1
    auth_file = tmp_path / "web.auth"
    auth_file.write_text(secrets.token_urlsafe(32) + "\n")
    auth_file.chmod(0o604)
    done = _start(tmp_path, "--listen", "0.0.0.0:0", "--auth-file", str(auth_file))
    assert done.returncode != 0 and f"--auth-file {auth_file} is accessible to other users" in done.stderr
    assert f"chmod g-w,o-rw {auth_file}" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "none.db").exists()  # refused before the store was opened
    # Loopback without an auth file: it serves (DESIGN.md's `web [--listen 127.0.0.1:8765]`), and says
    # loudly that every local user can read it.
    proc = subprocess.Popen([CLI, "--db", f"sqlite:///{tmp_path / 'none.db'}", "web", "--listen", "127.0.0.1:0"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
                            env=ENV)
    try:
        said = [proc.stderr.readline() for _ in range(2)] if proc.stderr else []
        assert "WARNING: no --auth-file: every local user can read every run" in said[0], said
    finally:
        proc.terminate()
        proc.wait(timeout=30)
