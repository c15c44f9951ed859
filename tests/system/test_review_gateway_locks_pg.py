"""Hostile review: can one store login make a gateway let another login's stopped run through?

A real `litellm --config` proxy, its callback on the gateway's login of a store set up with the
shipped roles script (tests/pg_support.RolesStore). Login `a` is the attacker, login `b` the
victim whose runaway the daemon stopped. The gateway must refuse b's next call whatever `a`
does to the store.

The attack: `a` opens a few transactions, each inserting a run under an id it picked and left
uncommitted, then sends one proxy call per id as its trace id. The callback does not see the row
(uncommitted), so it makes its own run of that id, and its INSERT waits on `a`'s open one for ever
(no lock timeout). The pre-call deadline (2 s) let the call through, but its thread stayed
blocked in the proxy's default executor; a handful of them filled it, and from then on every
pre-call check of every user, b's included, timed out and failed open. (Found by this review:
the victim's stopped run got 200.) Now a gateway's sessions have a lock_timeout, the held id's
call is refused, and no record is buffered behind the lock.
"""

from __future__ import annotations

import threading
import time
import uuid

import openai
import pytest

from daemon_support import daemon_toml
from litellm_support import call, proxy
from pg_support import RolesStore, raw
from watchdog import RunKilled, Watchdog

TOML = """
[defaults]
max_steps = 5
max_tool_calls = 40
"""
HELD = 12  # more than the default executor's threads on any machine up to 8 cores


@pytest.fixture(scope="module")
def store(pg_server_url):
    with RolesStore(pg_server_url, "aw_gwlk").create() as s:
        yield s


@pytest.fixture(scope="module")
def litellm(store, tmp_path_factory):
    with proxy(tmp_path_factory.mktemp("gwlk"), store.url("gw"), daemon_toml() + TOML) as base:
        yield base


def stopped_run(store: RolesStore) -> str:
    """A run of login b that its own budget stopped (max_steps 1, two steps)."""
    wd = Watchdog(store.url("b"), attest_socket="")
    try:
        with pytest.raises(RunKilled):
            with wd.run(agent="victim", max_steps=1) as run:
                run.step(model="gpt-x", cost_eur=0.0)
                run.step(model="gpt-x", cost_eur=0.0)
    finally:
        wd.close()
    return run.id


def refused(base: str, trace: str) -> str:
    with pytest.raises(openai.BadRequestError) as no:
        call(base, trace)
    assert no.value.status_code == 400
    return str(no.value)


def test_another_logins_held_inserts_never_make_the_proxy_let_a_stopped_run_through(store, litellm):
    victim = stopped_run(store)
    assert "agent-watchdog: run stopped: max_steps" in refused(litellm, victim)

    held = []
    try:
        for _ in range(HELD):  # a's uncommitted runs, under ids it chose
            conn = raw(store.url("a"))
            rid = f"held-{uuid.uuid4().hex[:12]}"
            conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host) "
                         "VALUES (%s, 'attacker', 'running', 'cooperative', 'elsewhere')", (rid,))
            held.append((conn, rid))
        answers: list[object] = []

        def attack(rid: str) -> None:
            try:
                answers.append(call(litellm, rid))
            except Exception as exc:  # noqa: BLE001 — a refusal is fine too
                answers.append(exc)

        threads = [threading.Thread(target=attack, args=(rid,)) for _, rid in held]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(answers) == HELD
        # A held id's call is refused (its row cannot be judged); one that waited past the pre-call
        # deadline behind the others in the executor passed as a slow store does (fails open).
        locked = [a for a in answers if isinstance(a, openai.BadRequestError) and "row is locked" in str(a)]
        assert len(locked) >= HELD // 2, answers
        t0 = time.monotonic()
        # The victim's stopped run: still refused, and promptly (no lock of a's is in its way).
        text = refused(litellm, victim)
        assert "agent-watchdog: run stopped: max_steps" in text, text
        assert time.monotonic() - t0 < 10
    finally:
        for conn, _ in held:
            conn.rollback()
            conn.close()
