"""Review (hostile) of revision 0017 as a confined agent login (the shipped roles script): every way
into `events` a login has, against the statement-level seq-once check, row-level security's EXISTS
test and `aw_burst`. All held at review time; kept as regressions."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from pg_support import RolesStore, raw

INSERT = "INSERT INTO events (run_id, seq, at, kind, tool) VALUES (%s, %s, now(), 'tool', 't')"
UPS = "[[1, 1, 0, 0, 0, 0, 0, 0, 0, {seq}, null, null, \"{rid}\"]]"


@pytest.fixture(scope="module")
def store(pg_server_url):
    with RolesStore(pg_server_url, "aw_rev").create() as s:
        yield s


def _conn(store, who: str, **kw):
    return raw(store.url(who), autocommit=True, **kw)


def _run(store, who: str) -> str:
    rid = uuid.uuid4().hex
    with _conn(store, who) as c:
        c.execute("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at, source) "
                  "VALUES (%s, 'bot', 'running', 'cooperative', 'h', now(), now(), 'sdk')", (rid,))
    return rid


def _count(store, rid: str, seq: int | None = None) -> int:
    with _conn(store, "daemon") as c:
        q = "SELECT count(*) FROM events WHERE run_id = %s" + ("" if seq is None else " AND seq = %s")
        return c.execute(q, (rid,) if seq is None else (rid, seq)).fetchone()[0]


def _counters(store, rid: str) -> tuple:
    with _conn(store, "daemon") as c:
        return c.execute("SELECT steps, tool_calls, last_seq FROM runs WHERE id = %s", (rid,)).fetchone()


MERGE = ("MERGE INTO events e USING (VALUES (%s::text, %s::int)) v(rid, s) ON false WHEN NOT MATCHED THEN "
         "INSERT (run_id, seq, at, kind, tool) VALUES (v.rid, v.s, now(), 'tool', 't')")
CTE = ("WITH x AS (INSERT INTO events (run_id, seq, at, kind, tool) VALUES (%s, %s, now(), 'tool', 't') "
       "RETURNING 1) INSERT INTO events (run_id, seq, at, kind, tool) VALUES (%s, %s, now(), 'tool', 't')")


@pytest.mark.parametrize("how", ["merge", "cte", "two_rows"])
def test_a_seq_twice_by_any_statement_shape_is_refused(store, how):
    rid = _run(store, "a")
    with _conn(store, "a") as a:
        a.execute(INSERT, (rid, 1))
        with pytest.raises(psycopg.errors.UniqueViolation):
            if how == "merge":
                a.execute(MERGE, (rid, 1))
            elif how == "cte":
                a.execute(CTE, (rid, 2, rid, 2))
            else:
                a.execute("INSERT INTO events (run_id, seq, at, kind, tool) VALUES "
                          "(%s, 3, now(), 'tool', 't'), (%s, 3, now(), 'tool', 't')", (rid, rid))
    assert _count(store, rid) == 1


def test_a_merge_insert_is_numbered_in_the_change_feed(store):
    rid = _run(store, "a")
    with _conn(store, "daemon") as d:
        before = d.execute("SELECT change_seq FROM runs WHERE id = %s", (rid,)).fetchone()[0]
    with _conn(store, "a") as a:
        a.execute(MERGE, (rid, 1))
    with _conn(store, "daemon") as d:
        assert d.execute("SELECT change_seq FROM runs WHERE id = %s", (rid,)).fetchone()[0] > before


def test_a_repeatable_read_writer_cannot_repeat_a_seq_committed_after_its_snapshot(store):
    rid = _run(store, "a")
    with _conn(store, "a") as a, raw(store.url("a")) as late:
        late.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        late.execute("SELECT 1 FROM runs WHERE id = %s", (rid,)).fetchall()  # its snapshot, before the row
        a.execute(INSERT, (rid, 5))
        with pytest.raises(psycopg.errors.SerializationFailure):
            late.execute(INSERT, (rid, 5))
    assert _count(store, rid, 5) == 1


def test_copy_update_and_delete_of_events_are_refused(store):
    rid = _run(store, "a")
    with _conn(store, "a") as a:
        a.execute(INSERT, (rid, 1))
        with pytest.raises(psycopg.errors.FeatureNotSupported):  # row-level security refuses COPY FROM
            with a.cursor().copy("COPY events (run_id, seq, at, kind, tool) FROM STDIN") as cp:
                cp.write_row((rid, 1, "2026-12-07 15:00:00+00", "tool", "t"))
        for sql in ("UPDATE events SET seq = 9 WHERE run_id = %s", "DELETE FROM events WHERE run_id = %s"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                a.execute(sql, (rid,))
    assert _count(store, rid, 1) == 1


def test_aw_burst_cannot_write_or_count_for_another_login(store):
    theirs = _run(store, "b")
    with _conn(store, "a") as a:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            a.execute("SELECT * FROM aw_burst(%s::jsonb, %s::jsonb)",
                      (f'[["{theirs}", 5, null, "tool", "t"]]', UPS.format(seq=5, rid=theirs)))
        # Counters alone: row-level security hides the row from the UPDATE; no status read back.
        assert a.execute("SELECT * FROM aw_burst('[]'::jsonb, %s::jsonb)",
                         (UPS.format(seq=5, rid=theirs),)).fetchall() == []
    assert _count(store, theirs) == 0 and _counters(store, theirs) == (0, 0, 0)


@pytest.mark.parametrize("evs, ups, error", [
    ("{}", "[]", psycopg.errors.InvalidParameterValue),  # not an array
    ("[null]", "[]", psycopg.errors.CheckViolation),  # an event of no kind
    ('[["{rid}", "x"]]', "[]", psycopg.errors.InvalidTextRepresentation),
    ("[]", '[[-5, 0, 0, 0, 0, 0, 0, 0, 0, 0, null, null, "{rid}"]]', psycopg.errors.CheckViolation),  # lower
    ("[]", '[[null, 0, 0, 0, 0, 0, 0, 0, 0, 0, null, null, "{rid}"]]', psycopg.errors.CheckViolation),
    ("[]", '[[0, 0, 0, 0, 0, "NaN", 0, 0, 0, 0, null, null, "{rid}"]]', psycopg.errors.CheckViolation),
])
def test_aw_burst_garbage_is_refused_whole(store, evs, ups, error):
    rid = _run(store, "a")
    with _conn(store, "a") as a:
        with pytest.raises(error):
            a.execute("SELECT * FROM aw_burst(%s::jsonb, %s::jsonb)",
                      (evs.replace("{rid}", rid), ups.replace("{rid}", rid)))
    assert _count(store, rid) == 0 and _counters(store, rid) == (0, 0, 0)


def test_aw_burst_cannot_set_last_seen_at_in_the_future(store):
    rid = _run(store, "a")
    with _conn(store, "a") as a:
        a.execute("SELECT * FROM aw_burst('[]'::jsonb, %s::jsonb)",
                  (f'[[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, "2099-01-01T00:00:00Z", null, "{rid}"]]',))
    with _conn(store, "daemon") as d:
        assert d.execute("SELECT last_seen_at <= now() FROM runs WHERE id = %s", (rid,)).fetchone() == (True,)
