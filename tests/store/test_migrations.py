"""Alembic migrations against real SQLite and PostgreSQL databases.

Round trips run on a database of their own (a fresh SQLite file, a fresh
PostgreSQL database), never on the session's shared one.
"""
from __future__ import annotations

import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from click.testing import CliRunner
from sqlalchemy import create_engine, inspect, text

from watchdog import Watchdog

from watchdog.store import access, change_index, partitions, shards
from watchdog.cli import main
from watchdog.store.engine import make_engine
from watchdog.store.schema import metadata

TABLES = {"runs", "events", "interventions", "alerts", "tool_circuits", "settings", "daemons"}


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request, tmp_path):
    """An empty, un-migrated database on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    server = request.getfixturevalue("pg_server_url")
    name = f"aw_mig_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield server.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"), {"n": name})
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


def diffs(engine):
    with engine.connect() as conn:
        parts = set()
        if partitions.is_partitioned(conn):
            parts = set(conn.execute(text("SELECT inhrelid::regclass::text FROM pg_inherits "
                                          "WHERE inhparent = 'events'::regclass")).scalars())

        def include(obj, name, type_, reflected, compare_to):
            # PostgreSQL's day partitions of events (revision 0015) are tables the models do not
            # name, and the partitioned table differs from the models in exactly these names.
            if type_ == "table" and name in parts:
                return False
            if parts and type_ == "table" and name in change_index.PG_ONLY:
                return False  # revision 0018's index of the change numbers (watchdog.store.change_index)
            table = getattr(obj, "table", None)
            if parts and getattr(table, "name", None) == "runs" and name in change_index.MODEL_ONLY:
                return False  # SQLite's index of runs.change_seq, which PostgreSQL keeps in run_changes
            if parts and getattr(table, "name", None) in ("runs", "events") and name in shards.PG_ONLY:
                return False  # revision 0016's stored buckets: PostgreSQL's, read by name (watchdog.store.shards)
            return not (parts and getattr(table, "name", None) == "events"
                        and name in partitions.PG_ONLY + partitions.MODEL_ONLY)

        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True,
                                                     "include_object": include})
        return compare_metadata(ctx, metadata)


def tables(engine) -> set:
    return set(inspect(engine).get_table_names())


def head() -> str:
    return ScriptDirectory.from_config(access.alembic_config(make_engine("sqlite://"))).get_current_head()


def test_one_linear_history_ending_at_head():
    script = ScriptDirectory.from_config(access.alembic_config(make_engine("sqlite://")))
    assert len(script.get_heads()) == 1
    assert [r.revision for r in script.walk_revisions()][-1] == "0001"
    assert access.migrations_dir().joinpath("env.py").is_file()


def test_models_and_migrations_never_drift(db_url, engine):
    """compare_metadata (what `alembic check` runs) against a migrated database: no diffs."""
    assert access.current(engine) == head()
    assert TABLES <= tables(engine)
    assert diffs(engine) == []


def test_drift_detection_would_notice_a_change(sqlite_url):
    """The drift test is not vacuous: a model change shows up as a diff."""
    from sqlalchemy import Column, Integer, MetaData, Table

    engine = make_engine(sqlite_url)
    try:
        changed = MetaData()
        for table in metadata.sorted_tables:
            table.to_metadata(changed)
        Table("runs", changed, Column("extra", Integer), extend_existing=True)
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            found = compare_metadata(ctx, changed)
        assert any(d[0] == "add_column" and d[3].name == "extra" for d in found), found
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_round_trip(fresh_url):
    engine = make_engine(fresh_url)
    try:
        assert access.current(engine) is None
        access.upgrade(engine)
        assert access.current(engine) == head()
        assert TABLES <= tables(engine)
        # Some data in it: downgrade must drop it in foreign-key order without complaint.
        wd = Watchdog(fresh_url)
        with wd.run(agent="a") as run:
            run.step(tokens_in=1)
            run.record_tool("t", {"a": 1})
        wd.close()

        access.downgrade(engine, "base")
        assert access.current(engine) is None
        assert tables(engine) & TABLES == set()

        access.upgrade(engine)
        assert access.current(engine) == head()
        assert TABLES <= tables(engine)
        assert diffs(engine) == []
        with engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM runs")).scalar() == 0
        wd = Watchdog(fresh_url)
        with wd.run(agent="a") as run:
            run.step(tokens_in=1)
        assert wd.buffered == 0 and wd.rejected_events == 0
        wd.close()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT steps FROM runs")).scalar() == 1
    finally:
        engine.dispose()


def test_db_upgrade_twice_is_idempotent_and_keeps_data(fresh_url):
    runner = CliRunner()
    first = runner.invoke(main, ["--db", fresh_url, "db", "upgrade"])
    assert first.exit_code == 0, first.output
    assert f"revision {access.head()}" in first.stdout
    wd = Watchdog(fresh_url)
    with wd.run(agent="keep-me") as run:
        run.step(tokens_in=5)
    wd.close()
    second = runner.invoke(main, ["db", "upgrade", "--db", fresh_url])
    assert second.exit_code == 0, second.output
    assert f"revision {access.head()}" in second.stdout
    engine = make_engine(fresh_url)
    try:
        assert access.current(engine) == access.head()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT agent, steps FROM runs")).one() == ("keep-me", 1)
            assert conn.execute(text("SELECT COUNT(*) FROM alembic_version")).scalar() == 1
        assert diffs(engine) == []
    finally:
        engine.dispose()


def test_db_downgrade_base_from_the_cli(fresh_url):
    runner = CliRunner()
    assert runner.invoke(main, ["--db", fresh_url, "db", "upgrade"]).exit_code == 0
    asked = runner.invoke(main, ["--db", fresh_url, "db", "downgrade", "base"])  # no terminal: refused
    assert asked.exit_code != 0 and "add --yes" in asked.output, asked.output
    unknown = runner.invoke(main, ["--db", fresh_url, "db", "downgrade", "nope", "--yes"])
    assert unknown.exit_code != 0 and "unknown revision 'nope': give head, base or one of 0001" in unknown.output
    assert "CommandError" not in unknown.output
    up = runner.invoke(main, ["--db", fresh_url, "db", "upgrade", "--revision", "nope"])
    assert up.exit_code != 0 and "unknown revision 'nope'" in up.output and "CommandError" not in up.output
    down = runner.invoke(main, ["--db", fresh_url, "db", "downgrade", "base", "--yes"])
    assert down.exit_code == 0, down.output
    engine = make_engine(fresh_url)
    try:
        assert tables(engine) & TABLES == set()
    finally:
        engine.dispose()


def test_sqlite_upgrade_leaves_wal_and_no_open_transaction(sqlite_url, tmp_path):
    """After `db upgrade` other processes can write at once (no lock left behind)."""
    import sqlite3

    path = sqlite_url.split("sqlite:///", 1)[1]
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_the_pause_migration_lets_an_existing_status_check_allow_paused(fresh_url):
    """A store whose runs.status is checked (ck_runs_status, from the constraints revision) gets
    that one constraint replaced: `paused` is accepted after 0006, refused again after its downgrade."""
    from alembic.operations import Operations

    from watchdog.core import lifecycle as lc

    engine = make_engine(fresh_url)
    before = [s for s in lc.STATUSES if s != lc.PAUSED]
    check = "status IN (" + ", ".join(f"'{s}'" for s in before) + ")"
    insert = ("INSERT INTO runs (id, agent, status, kill_mode, host, started_at, last_seen_at) "
              "VALUES (:id, 'a', :status, 'cooperative', 'h', '2026-12-01 00:00:00', '2026-12-01 00:00:00')")
    try:
        access.upgrade(engine, "0005")
        with engine.begin() as conn:
            ops = Operations(MigrationContext.configure(conn))
            with ops.batch_alter_table("runs", recreate="always" if conn.dialect.name == "sqlite" else "auto") as b:
                b.create_check_constraint("ck_runs_status", check)
        with pytest.raises(Exception), engine.begin() as conn:
            conn.execute(text(insert), {"id": "p0", "status": "paused"})
        access.upgrade(engine, "0006")
        with engine.begin() as conn:
            conn.execute(text(insert), {"id": "p1", "status": "paused"})
        with pytest.raises(Exception), engine.begin() as conn:
            conn.execute(text(insert), {"id": "p2", "status": "nonsense"})
        access.downgrade(engine, "0005")
        with engine.connect() as conn:  # the paused run went back to running with the revision
            assert conn.execute(text("SELECT status FROM runs WHERE id = 'p1'")).scalar() == "running"
        with pytest.raises(Exception), engine.begin() as conn:
            conn.execute(text(insert), {"id": "p3", "status": "paused"})
    finally:
        engine.dispose()


def test_the_outbox_migration_closes_dead_letters_on_its_way_down(fresh_url):
    """0008 down: a dead letter becomes a closed alert (the older outbox would retry it), a
    waiting one stays waiting, and the claim and dead-letter columns are gone; up again is clean."""
    engine = make_engine(fresh_url)
    insert = ("INSERT INTO alerts (dedupe_key, created_at, title, body, attempts, dead_at, last_error) "
              "VALUES (:k, '2026-12-01 00:00:00', 't', 'b', 3, :dead, 'why')")
    try:
        access.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text(insert), {"k": "dead", "dead": "2026-12-02 00:00:00"})
            conn.execute(text(insert), {"k": "waiting", "dead": None})
        access.downgrade(engine, "0007")
        assert {"claimed_by", "claimed_until", "dead_at"}.isdisjoint(c["name"] for c in inspect(engine).get_columns("alerts"))
        with engine.connect() as conn:
            closed = dict(conn.execute(text("SELECT dedupe_key, delivered_at FROM alerts")).all())
        assert closed["dead"] is not None and closed["waiting"] is None
        access.upgrade(engine)
        assert diffs(engine) == []
    finally:
        engine.dispose()
