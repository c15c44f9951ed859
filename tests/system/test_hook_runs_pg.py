"""The hook's session run on PostgreSQL with the shipped roles script and two agent logins: no
other identity can pre-empt or capture it (a hostile review of issue 33).

Under row-level security a login sees only its own runs, so a row another login (or the daemon,
receiving the session's log events first) made under the hook's run id would be invisible to the
hook, and its insert would fail: every call let through (fail-open). The hook's id is keyed by its
user's secret now, and the logs receiver never makes the hook's row: it holds the events until the
hook's own run exists, then counts them there.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from otlp_support import OtlpDaemon, wait_for
from pg_support import RolesStore
from test_otlp_logs_identity import VICTIM_TOKEN, _old_predictable_id, export, hook
from watchdog.store import witness
from watchdog.store.engine import make_engine
from watchdog.store.schema import runs

B_TOKEN = "login-b-logs-token-" + "f6" * 10


class Store(RolesStore):
    def __init__(self, server: str):
        super().__init__(server, "aw_hkpg")


@pytest.fixture(scope="module")
def store(pg_server_url):
    s = Store(pg_server_url).create()
    try:
        yield s
    finally:
        s.drop()


def session_rows(store: Store, session: str) -> list:
    engine = make_engine(store.url("daemon"))
    try:
        with engine.connect() as conn:
            return [r for r in conn.execute(select(runs)) if (r.labels or {}).get("session") == session]
    finally:
        engine.dispose()


def test_another_login_making_the_hooks_run_first_does_not_make_the_hook_fail_open(store, tmp_path):
    """Login B inserts a run under the id the hook's run had (uuid5 of cli, uid, session): the hook
    (login A) does not see it, and still counts its calls on a run of its own."""
    import os

    b = make_engine(store.url("b"))
    try:
        with b.begin() as conn:
            witness.create_run(conn, run_id=_old_predictable_id("pg-pre", os.getuid()), agent="victim-bot",
                               source="hook", host="x", kill_mode="cooperative",
                               labels={"cli": "claude-code", "session": "pg-pre"}, now=witness.store_now(conn))
    finally:
        b.dispose()
    for i in range(2):
        done = hook(store.url("a"), "pg-pre", tmp_path / "home", tool_use_id=f"toolu_{i}")
        assert done.returncode == 0 and "fail-open" not in done.stderr, done.stderr
    mine = [r for r in session_rows(store, "pg-pre") if r.owner == store.logins["a"]]
    assert [(r.source, r.tool_calls) for r in mine] == [("hook", 2)], session_rows(store, "pg-pre")


def test_log_events_before_the_first_hook_call_never_make_a_row_the_hook_cannot_own(store, tmp_path):
    """The daemon receives the session's first API request (a token booked to login A) before the
    hook's first call: it makes no run; the hook (login A) makes its own, and the held event is
    counted there. Login A's hook keeps counting on it (it sees and owns it)."""
    tokens = [f"{VICTIM_TOKEN} agent=victim-bot owner={store.logins['a']}",
              f"{B_TOKEN} agent=victim-bot owner={store.logins['b']}"]
    with OtlpDaemon(store.url("daemon"), tokens=tokens) as d:
        assert export(d, "pg-first", steps=1) == ["SUCCESS"]
        assert d.daemon.otlp_server.logs.held == 1 and session_rows(store, "pg-first") == []
        for i in range(2):
            done = hook(store.url("a"), "pg-first", tmp_path / "home", tool_use_id=f"toolu_{i}")
            assert done.returncode == 0 and "fail-open" not in done.stderr, done.stderr
        got = wait_for(lambda: [r for r in session_rows(store, "pg-first") if r.steps == 1])
        assert [(r.source, r.owner, r.tool_calls) for r in got] == [("hook", store.logins["a"], 2)], \
            session_rows(store, "pg-first")
        # Another login's events (a token booked to B) for the same session: B's own run, never A's.
        assert export(d, "pg-first", steps=3, token=B_TOKEN) == ["SUCCESS"] * 3
        theirs = wait_for(lambda: [r for r in session_rows(store, "pg-first") if r.source == "otlp"])
        assert [(r.steps, r.owner) for r in theirs] == [(3, store.logins["b"])]
    assert [r.steps for r in session_rows(store, "pg-first") if r.source == "hook"] == [1]


def test_a_subagents_child_run_is_the_hooks_login_own_under_row_level_security(store, tmp_path):
    """A sub-agent's call (agent_id in the hook input) as login A: a child run naming A's session
    run as its parent (the database checks: same owner, at insert), and rolled up into it."""
    sub = {"agent_id": "a1b2c3", "agent_type": "Explore"}
    for i, fields in enumerate(({}, sub, sub)):
        done = hook(store.url("a"), "pg-sub", tmp_path / "home", tool_use_id=f"toolu_{i}", command=f"echo {i}",
                    **fields)
        assert done.returncode == 0 and "fail-open" not in done.stderr and not done.stdout.strip(), done.stderr
    engine = make_engine(store.url("daemon"))
    try:
        with engine.connect() as conn:
            rows = [r for r in conn.execute(select(runs)) if "pg-sub" in json.dumps(r.labels or {})]
    finally:
        engine.dispose()
    (parent,) = [r for r in rows if r.parent_id is None]
    (child,) = [r for r in rows if r.parent_id is not None]
    assert child.parent_id == parent.id and {parent.owner, child.owner} == {store.logins["a"]}
    assert (parent.tool_calls, child.tool_calls) == (3, 2)


def test_nul_control_characters_and_lone_surrogates_never_make_the_hook_fail_open(store, tmp_path):
    """PostgreSQL's text takes no NUL and UTF-8 no lone surrogate, and both are valid JSON in a
    session id, a tool name or a tool use id: each call is still counted on the session's one run
    (they were let through unjudged, every one of them, with `the store failed`)."""
    session = "pg-\u0000\x1b[31m\ud800\n" + "s" * 300
    for i in range(3):
        done = hook(store.url("a"), session, tmp_path / "home", tool_use_id=f"toolu_\u0000{i}",
                    command=f"ls \u0000\ud800 {i}", tool_name="Bash\u0000")
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), done.stderr
    engine = make_engine(store.url("daemon"))
    try:
        with engine.connect() as conn:
            rows = [r for r in conn.execute(select(runs)) if str((r.labels or {}).get("session", "")).startswith("pg-")
                    and r.owner == store.logins["a"] and "\ufffd" in r.labels["session"]]
    finally:
        engine.dispose()
    assert [(r.source, r.tool_calls) for r in rows] == [("hook", 3)], rows
