"""The unit folder's guard bites: pytest, run on a copy of tests/unit/conftest.py beside small
offending tests, fails each test that opens a socket, starts a process or opens a database (even
one that swallows the error), and passes the pure one, one on a SQLite database in memory (no
file: watchdog.store.inmemory) and the same acts outside the unit folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

OFFENDERS = textwrap.dedent('''
    import socket
    import sqlite3
    import subprocess
    import sys

    def test_pure():
        assert sorted([3, 1, 2]) == [1, 2, 3]

    def test_opens_a_socket():
        with socket.socket() as s:
            s.connect(("127.0.0.1", 9))

    def test_starts_a_process():
        subprocess.run([sys.executable, "-c", "pass"], check=True)

    def test_opens_a_database(tmp_path):
        sqlite3.connect(str(tmp_path / "store.db")).close()

    def test_opens_a_temporary_database():
        sqlite3.connect("").close()  # "": SQLite's temporary database, a file on disk

    def test_swallows_the_error(tmp_path):
        try:
            sqlite3.connect(str(tmp_path / "store.db")).close()
        except Exception:
            pass

    def test_may_use_a_store_in_memory():
        db = sqlite3.connect(":memory:")
        assert db.execute("SELECT 1").fetchone() == (1,)
        db.close()

    def test_connects_to_postgresql():
        import psycopg
        psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres").close()
''')

OUTSIDE = textwrap.dedent('''
    import sqlite3
    import subprocess
    import sys

    def test_a_store_test_may():
        sqlite3.connect(":memory:").close()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
''')


def test_the_unit_guard_fails_impure_tests_and_only_under_tests_unit(tmp_path):
    unit = tmp_path / "unit"
    unit.mkdir()
    shutil.copy(TESTS / "unit" / "conftest.py", unit / "conftest.py")
    (unit / "test_offenders.py").write_text(OFFENDERS)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "test_outside.py").write_text(OUTSIDE)
    env = {**os.environ, "PYTHONPATH": str(TESTS), "COLUMNS": "400"}  # summary lines not cut
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "--rootdir", str(tmp_path), "-o", "addopts=", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "6 failed, 3 passed" in out, out
    for name, what in [("opens_a_socket", "opened a socket"), ("starts_a_process", "started a process"),
                       ("opens_a_database", "opened a database"), ("opens_a_temporary_database", "opened a database"),
                       ("swallows_the_error", "opened a database"),
                       ("connects_to_postgresql", "opened a database (psycopg connect)")]:
        (line,) = [ln for ln in out.splitlines() if ln.startswith("FAILED") and name in ln]
        assert what in line, line
