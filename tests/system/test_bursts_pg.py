"""Issue 35: a burst of records (watchdog.store.bursts) on PostgreSQL with the shipped roles script,
against revision 0017's statement triggers.

One database for the module, owned by a daemon login, two agent logins (A, B). A burst goes in
whole or not at all: its events each with their seq once (against what is stored and within the
burst), under the login's own runs only (row-level security refuses a burst that names another
login's run, before any number is looked at), its runs' counters summed, and each run's status
read back by the same statement, so a stop committed before the burst is seen by it. A
multi-row INSERT numbers each of its runs once in the change feed.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

from pg_support import RolesStore, raw
from watchdog.store.agent_writes import Writer
from watchdog.store.bursts import burst_statements
from watchdog.store.engine import make_engine


@pytest.fixture(scope="module")
def store(pg_server_url):
    with RolesStore(pg_server_url, "aw_burst").create() as s:
        yield s


@pytest.fixture(scope="module")
def writers(store):
    made = {who: Writer(make_engine(store.url(who))) for who in ("a", "b")}
    yield made
    for w in made.values():
        w.close()
        w.engine.dispose()


def _raw(url: str):
    return raw(url, autocommit=True)


def _run(url: str) -> str:
    rid = uuid.uuid4().hex
    with _raw(url) as conn:
        conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, source) "
                     "VALUES (%s, 'bot', 'running', 'cooperative', 'h', now(), now(), 'sdk')", (rid,))
    return rid


def _record(rid: str, seq: int, *, step: bool = False):
    event = (rid, seq, None, "step" if step else "tool", None if step else "search", f"h{seq}", '{"q": 1}',
             None if step else True, None, None, 0.5, "m" if step else None, 10 if step else None,
             2 if step else None, 0.001 if step else None, None, None, None, None, None)
    update = (int(step), int(not step), 0, 10 if step else 0, 2 if step else 0, 0.001 if step else 0.0, 0, 0, 0,
              seq, None, None, rid)
    return event, update


def _burst(writer: Writer, records) -> dict:
    rows = writer.transaction_rows(burst_statements(writer.sql, records))
    return {r[0]: tuple(r[1:]) for r in rows}


def _events(store, rid: str) -> list[tuple]:
    with _raw(store.url("daemon")) as conn:
        return conn.execute("SELECT seq, kind, args::text, at <= now() FROM events WHERE run_id = %s ORDER BY seq",
                            (rid,)).fetchall()


def _counters(store, rid: str) -> tuple:
    with _raw(store.url("daemon")) as conn:
        return conn.execute("SELECT steps, tool_calls, tokens_in, tokens_out, last_seq, cost_eur "
                            "FROM runs WHERE id = %s", (rid,)).fetchone()


def test_a_burst_lands_whole_with_each_seq_once_and_its_runs_counted_once(store, writers):
    one, two = _run(store.url("a")), _run(store.url("a"))
    records = [_record(one, s, step=s % 2 == 0) for s in (3, 1, 2)] + [_record(two, s) for s in (1, 2)]
    status = _burst(writers["a"], records)
    assert status == {one: ("running", None, None), two: ("running", None, None)}
    assert _events(store, one) == [(1, "tool", '{"q": 1}', True), (2, "step", '{"q": 1}', True),
                                   (3, "tool", '{"q": 1}', True)]
    assert [e[0] for e in _events(store, two)] == [1, 2]
    assert _counters(store, one) == (1, 2, 10, 2, 3, pytest.approx(0.001))
    assert _counters(store, two) == (0, 2, 0, 0, 2, 0)


def test_a_burst_naming_another_logins_run_is_refused_whole(store, writers):
    mine, theirs = _run(store.url("a")), _run(store.url("b"))
    for seq in (1, 7):  # a number B's run has, and one it has not: the same refusal
        if seq == 1:
            _burst(writers["b"], [_record(theirs, 1)])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            _burst(writers["a"], [_record(mine, seq), _record(theirs, seq)])
    assert _events(store, mine) == []  # nothing of the burst, its own run's record neither
    assert [e[0] for e in _events(store, theirs)] == [1]
    assert _counters(store, mine)[:2] == (0, 0) and _counters(store, theirs)[:2] == (0, 1)


def test_a_burst_repeating_a_stored_seq_or_one_of_its_own_is_refused_whole(store, writers):
    rid, other = _run(store.url("a")), _run(store.url("a"))
    _burst(writers["a"], [_record(rid, 1), _record(rid, 2)])
    for records in ([_record(other, 1), _record(rid, 3), _record(rid, 2)],  # 2 is stored
                    [_record(other, 1), _record(rid, 4), _record(rid, 4)]):  # 4 twice in the burst
        with pytest.raises(psycopg.errors.UniqueViolation) as refused:
            _burst(writers["a"], records)
        assert refused.value.diag.constraint_name == "uq_events_run_id_seq"
    assert [e[0] for e in _events(store, rid)] == [1, 2] and _events(store, other) == []
    assert _counters(store, rid)[1] == 2 and _counters(store, other)[1] == 0


def test_a_stop_committed_before_a_burst_is_read_back_by_it(store, writers):
    stopped, running = _run(store.url("a")), _run(store.url("a"))
    _burst(writers["a"], [_record(stopped, 1), _record(running, 1)])
    with _raw(store.url("daemon")) as conn:
        conn.execute("UPDATE runs SET status = 'stopping', stop_reason = 'manual', stop_detail = 'operator' "
                     "WHERE id = %s", (stopped,))
    status = _burst(writers["a"], [_record(stopped, 2), _record(running, 2), _record(stopped, 3)])
    assert status == {stopped: ("stopping", "manual", "operator"), running: ("running", None, None)}


def test_one_multi_row_insert_numbers_each_of_its_runs_once_in_the_change_feed(store):
    ids = [_run(store.url("daemon")) for _ in range(3)]
    with _raw(store.url("daemon")) as conn:
        before = dict(conn.execute("SELECT id, change_seq FROM runs WHERE id = ANY(%s)", (ids,)).fetchall())
        top = conn.execute("SELECT last_value FROM aw_change_seq").fetchone()[0]
        conn.execute("INSERT INTO events (run_id, seq, at, kind) SELECT id, s, now(), 'step' "
                     "FROM unnest(%s::text[]) id, generate_series(1, 4) s", (ids,))
        after = dict(conn.execute("SELECT id, change_seq FROM runs WHERE id = ANY(%s)", (ids,)).fetchall())
        assert conn.execute("SELECT last_value FROM aw_change_seq").fetchone()[0] == top + 3  # one number a run
    assert all(after[r] > before[r] for r in ids) and sorted(after.values()) == [top + 1, top + 2, top + 3]
