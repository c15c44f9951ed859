#!/usr/bin/env python
"""What owners cost an agent's record on PostgreSQL: row-level security and the writer trigger
(migration 0010) against the store of revision 0009, in the same run.

Two fresh databases on one server: `old` migrated to 0009, where an agent's login has the
grants the roles script gave before 0010 (no row-level security, no writer trigger), and `new`
migrated to head with sql/postgres-roles.sql, the login in its agents' role. One process
records through the SDK (`run.record_tool`, the whole public call) into one run of each,
in interleaved rounds (old, new, new, old, ...), with `synchronous_commit = off` on the
server for both databases so that the WAL fsync (milliseconds, and noisy on a shared
machine) does not hide the server-side cost; the median per-record time of each and
their ratio are printed. The issue asks for at most 1.2x.

Run:  python benchmarks/bench_owners.py [--rounds 20] [--per-round 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings

import psycopg
from sqlalchemy.engine import make_url

PG_SERVER = os.environ.get("AW_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sql", "postgres-roles.sql")


def _conninfo(db: str, user: str | None = None) -> str:
    u = make_url(PG_SERVER)
    return (f"host={u.host or '127.0.0.1'} port={u.port or 5432} user={user or u.username or 'postgres'} dbname={db}"
            + (f" password={u.password}" if u.password else ""))


def _url(db: str, user: str) -> str:
    return make_url(PG_SERVER).set(username=user, database=db).render_as_string(hide_password=False)


class Stores:
    def __init__(self):
        tag = os.getpid()
        self.dbs = {"old": f"aw_bench_own_old_{tag}", "new": f"aw_bench_own_new_{tag}"}
        self.roles = [f"aw_bench_own_{k}_{tag}" for k in ("agents", "gw", "view", "old", "new")]
        self.logins = {"old": self.roles[3], "new": self.roles[4]}
        try:
            self._make()
        except BaseException:
            self.close()  # nothing left behind on the server
            raise

    def _make(self):
        from watchdog.store import access
        from watchdog.store.engine import make_engine

        with psycopg.connect(_conninfo("postgres"), autocommit=True) as admin:
            for db in self.dbs.values():
                admin.execute(f'CREATE DATABASE "{db}"')
                admin.execute(f'ALTER DATABASE "{db}" SET synchronous_commit = off')
            admin.execute(f'CREATE ROLE "{self.roles[3]}" LOGIN')
        for key, rev in (("old", "0009"), ("new", "head")):
            engine = make_engine(make_url(PG_SERVER).set(database=self.dbs[key]).render_as_string(hide_password=False))
            access.upgrade(engine, rev)
            engine.dispose()
        with psycopg.connect(_conninfo(self.dbs["old"]), autocommit=True) as conn:  # the grants before 0010
            login = self.logins["old"]
            conn.execute(f'GRANT SELECT, INSERT ON runs TO "{login}"')
            conn.execute(f'GRANT UPDATE (steps, tool_calls, tool_errors, tokens_in, tokens_out, cost_eur, '
                         f'cached_tokens_in, reasoning_tokens, cost_unpriced_tokens, last_seq, last_seen_at, progress, '
                         f'status, stop_reason, stop_detail, stop_requested_at, ended_at, parent_id, paused_at, partial) '
                         f'ON runs TO "{login}"')
            conn.execute(f'GRANT INSERT ON events TO "{login}"')
            seq = conn.execute("SELECT pg_get_serial_sequence('events', 'id')").fetchone()[0]
            conn.execute(f'GRANT USAGE ON SEQUENCE {seq} TO "{login}"')
            conn.execute(f'GRANT SELECT ON settings, tool_circuits, circuit_probes TO "{login}"')
        u = make_url(PG_SERVER)
        subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", "-v", f"agents_role={self.roles[0]}",
                        "-v", f"gateway_role={self.roles[1]}", "-v", f"viewer_role={self.roles[2]}",
                        "-h", u.host or "127.0.0.1", "-p", str(u.port or 5432), "-U", u.username or "postgres",
                        "-d", self.dbs["new"], "-f", SCRIPT], check=True, capture_output=True, timeout=60)
        with psycopg.connect(_conninfo("postgres"), autocommit=True) as admin:
            admin.execute(f'CREATE ROLE "{self.logins["new"]}" LOGIN IN ROLE "{self.roles[0]}"')

    def close(self):
        with psycopg.connect(_conninfo("postgres"), autocommit=True) as admin:
            for db in self.dbs.values():
                admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            for role in reversed(self.roles):
                admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=200)
    args = ap.parse_args(argv)
    from watchdog import Watchdog

    warnings.simplefilter("ignore", RuntimeWarning)
    stores = Stores()
    try:
        runs, wds = {}, {}
        for key in ("old", "new"):
            wds[key] = Watchdog(_url(stores.dbs[key], stores.logins[key]), attest_socket="", circuit_cache_s=3600)
            runs[key] = wds[key].run("bench-owners", guards=False).start()
            for i in range(100):  # warm: connection, statement caches
                runs[key].record_tool("search", {"q": -1 - i}, ok=True)
        per = {"old": [], "new": []}
        seq = 0
        for r in range(args.rounds):
            for key in (("old", "new") if r % 2 == 0 else ("new", "old")):
                t0 = time.perf_counter()
                for _ in range(args.per_round):
                    seq += 1
                    runs[key].record_tool("search", {"q": seq}, ok=True)
                per[key].append((time.perf_counter() - t0) / args.per_round * 1e6)
        for key in ("old", "new"):
            runs[key].end("completed", None, None)
            assert wds[key].rejected_events == 0 and wds[key].buffered == 0, key
            wds[key].close()
        old, new = statistics.median(per["old"]), statistics.median(per["new"])
        print(f"# owners on PostgreSQL: {args.rounds} interleaved rounds x {args.per_round} run.record_tool() "
              f"per store, synchronous_commit off, load average {os.getloadavg()[0]:.1f}")
        print("| store | per record (median of rounds) | ratio |")
        print("|---|---|---|")
        print(f"| 0009, agent login with the old grants | {old:.0f} us | 1.00x |")
        print(f"| head (0010), agent login, row-level security + writer trigger | {new:.0f} us | {new / old:.2f}x |")
    finally:
        stores.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
