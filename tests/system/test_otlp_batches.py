"""Issue 35: one OTLP export of N spans is one transaction, its events written by multi-row INSERTs
(watchdog.store.witness), each span counted once, on both stores.

The real OTel SDK encodes the spans, real HTTP carries them to the daemon's own receiver. What
the store saw is read from the store itself: on PostgreSQL every event row of the export has the
same xmin (one transaction) and the same cmin (one statement of it); on SQLite the connection's
own statement trace shows its few INSERTs between one BEGIN and its COMMIT.
"""

from __future__ import annotations

import math

from sqlalchemy import event, select, text

from otlp_support import OtlpDaemon, otlp_runs, post, spans_request, wait_for
from watchdog.store import witness
from watchdog.store.schema import events

PB = {"Content-Type": "application/x-protobuf"}
N = 60  # steps and as many tool calls: 120 spans, more than one SQLite statement's rows


def test_one_export_of_many_spans_is_one_transaction_and_counts_each_span_once(db_url):
    traced: list[tuple[int, str]] = []  # (connection, statement): the tick's own connections write too
    with OtlpDaemon(db_url, defaults={"max_tool_calls": 1000, "max_steps": 1000}) as d:
        if d.engine.dialect.name == "sqlite":
            def trace(dbapi_conn, _record) -> None:
                dbapi_conn.set_trace_callback(lambda sql: traced.append((id(dbapi_conn), sql)))

            event.listen(d.engine, "connect", trace)
            d.engine.dispose()  # every connection from now on is traced
        body = spans_request(N, conversation="conv-batch").SerializeToString()
        status, _ = post(d.address, body, PB)
        assert status == 200
        run = wait_for(lambda: next(iter(otlp_runs(d.engine)), None))
        assert (run.steps, run.tool_calls) == (N, N)
        with d.engine.connect() as conn:
            seqs = conn.execute(select(events.c.seq).where(events.c.run_id == run.id)
                                .order_by(events.c.seq)).scalars().all()
            assert len(seqs) == 2 * N and len(set(seqs)) == 2 * N  # every span once
            if d.engine.dialect.name == "postgresql":
                assert conn.execute(text("SELECT count(DISTINCT xmin::text), count(DISTINCT cmin::text) "
                                         "FROM events WHERE run_id = :r"), {"r": run.id}).one() == (1, 1)
        if traced:  # SQLite: the export's INSERTs, all inside one BEGIN ... COMMIT of one connection
            writer = next(c for c, sql in traced if sql.startswith("INSERT INTO events"))
            mine = [sql for c, sql in traced if c == writer]
            # (SQLite's trace names a statement again at each trigger program it starts: once is enough.)
            statements = [s for i, s in enumerate(mine) if i == 0 or s != mine[i - 1]]
            inserts = [i for i, s in enumerate(statements) if s.startswith("INSERT INTO events")]
            assert len(inserts) == math.ceil(2 * N / witness._SQLITE_ROWS)
            begins = [i for i, s in enumerate(statements) if s.startswith("BEGIN") and i < inserts[0]]
            commits = [i for i, s in enumerate(statements) if s.startswith("COMMIT") and i > begins[-1]]
            assert commits[0] > inserts[-1]
        # The exporter retries the same export: nothing counted twice.
        status, _ = post(d.address, body, PB)
        assert status == 200
        with d.engine.connect() as conn:
            assert conn.execute(select(events.c.id).where(events.c.run_id == run.id)).all().__len__() == 2 * N
        assert (otlp_runs(d.engine)[0].steps, otlp_runs(d.engine)[0].tool_calls) == (N, N)
