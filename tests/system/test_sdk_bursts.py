"""Records that an agent process's threads make at the same moment go in one transaction (issue 35).

Real stores (SQLite and PostgreSQL), the daemon's real attestation socket and key, the real CLI
for the stop; the SDK's threads record flat out. A burst must store exactly the events one
record per transaction would (each seq once, consecutive, each MAC the run's own), and a stop
must be seen by every thread's next record.
"""

from __future__ import annotations

import threading

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from watchdog import RunKilled, Watchdog
from watchdog.cli import main
from watchdog.core.evidence_mac import RecordMac
from watchdog.daemon.trust.authentic import own_counts, parse_evidence, run_key
from watchdog.store.attestations import macd_events
from watchdog.store.schema import attestations, events, runs

RUNS, THREADS_PER_RUN, RECORDS_PER_THREAD = 4, 4, 25


def _burst(wd: Watchdog, run, barrier: threading.Barrier, errors: list) -> None:
    try:
        barrier.wait()
        for i in range(RECORDS_PER_THREAD):
            if i % 5 == 4:
                run.step(model="gpt-x", tokens_in=10, tokens_out=2, cost_eur=0.001)
            else:
                run.record_tool("search", {"q": i}, ok=i % 7 != 3, duration_s=0.01)
    except BaseException as exc:  # noqa: BLE001 — reported by the test, not lost in a thread
        errors.append(exc)


def test_a_burst_of_records_from_many_threads_arrives_as_each_record_with_its_seq_and_mac(db_url, engine, attest):
    attestor = attest(db_url)
    wd = Watchdog(db_url, pool_size=2)
    try:
        opened = [wd.run("burst-bot", kill_mode="process", guards=False).start() for _ in range(RUNS)]
        assert all(r.attested for r in opened)
        barrier = threading.Barrier(RUNS * THREADS_PER_RUN)
        errors: list = []
        threads = [threading.Thread(target=_burst, args=(wd, r, barrier, errors))
                   for r in opened for _ in range(THREADS_PER_RUN)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert (wd.rejected_events, wd.dropped_events, wd.buffered) == (0, 0, 0)
        assert wd.bursts.bursts > 0 and wd.bursts.burst_records > wd.bursts.bursts  # the bursts happened
        n = THREADS_PER_RUN * RECORDS_PER_THREAD
        steps = THREADS_PER_RUN * (RECORDS_PER_THREAD // 5)
        errs = THREADS_PER_RUN * sum(1 for i in range(RECORDS_PER_THREAD) if i % 5 != 4 and i % 7 == 3)
        with engine.connect() as conn:
            for r in opened:
                seqs = conn.execute(select(events.c.seq).where(events.c.run_id == r.id)
                                    .order_by(events.c.seq)).scalars().all()
                assert seqs == list(range(1, n + 1))  # every record once, none lost, none twice
                row = conn.execute(select(runs).where(runs.c.id == r.id)).one()
                assert (row.steps, row.tool_calls, row.tool_errors, row.last_seq) == (steps, n - steps, errs, n)
                assert (row.tokens_in, row.tokens_out) == (10 * steps, 2 * steps)
                assert row.cost_eur == pytest.approx(0.001 * steps)
                a = conn.execute(select(attestations).where(attestations.c.run_id == r.id)).one()
                sealed = parse_evidence(attestor.sealer, r.id, a.evidence)
                # Every record carries the MAC its process computed with the run's key (the time it
                # binds: the SDK's on SQLite; on PostgreSQL the server's, which the SDK never reads).
                mac = RecordMac(run_key(attestor.sealer, r.id, sealed))
                macd = macd_events(conn, r.id)
                assert sorted(e.seq for e in macd) == seqs
                assert all(mac.ok(e.mac, r.id, e.seq, e.kind, e.tool, e.args_hash, e.ok, e.model, e.tokens_in,
                                  e.tokens_out, e.cached_tokens_in, e.reasoning_tokens, e.cost_eur, e.attempt,
                                  e.at_text if engine.dialect.name == "sqlite" else None) for e in macd)
                if engine.dialect.name == "sqlite":  # where the daemon's evidence fold rests on them
                    own = own_counts(conn, attestor.sealer, r.id, sealed)
                    assert (own.steps, own.tool_calls, own.tool_errors) == (steps, n - steps, errs)
                    assert own.tokens == 12 * steps and own.records == n
    finally:
        wd.close()


def test_a_stop_asked_mid_burst_is_seen_by_each_threads_next_record(db_url, engine):
    wd = Watchdog(db_url, pool_size=2)
    try:
        run = wd.run("burst-bot", guards=False).start()
        threads_n = 8
        stopped = threading.Event()  # set once the stop is committed
        recording = threading.Barrier(threads_n + 1)
        late: list[int] = []  # records begun after the stop was committed that still went through
        seen: list[RunKilled] = []
        lock = threading.Lock()

        def agent() -> None:
            recording.wait()
            i = 0
            while True:
                after = stopped.is_set()
                try:
                    run.record_tool("search", {"q": i}, ok=True)
                except RunKilled as exc:
                    with lock:
                        seen.append(exc)
                    return
                i += 1
                if after:
                    with lock:
                        late.append(i)
                    return

        threads = [threading.Thread(target=agent) for _ in range(threads_n)]
        for t in threads:
            t.start()
        recording.wait()

        def records() -> int:
            with engine.connect() as conn:
                return len(conn.execute(select(events.c.id).where(events.c.run_id == run.id)).all())

        while records() < 200 or wd.bursts.bursts == 0:  # mid-burst: the threads meet at the store
            pass
        res = CliRunner().invoke(main, ["--db", db_url, "kill", run.id[:8], "--reason", "operator wants it back"])
        assert res.exit_code == 0, res.output
        stopped.set()
        for t in threads:
            t.join()
        assert late == []  # no record begun after the stop was stored went through
        assert len(seen) == threads_n
        assert all("operator wants it back" in str(s) for s in seen)
    finally:
        wd.close()
