"""docs/howto/develop.md's two commands, run: the inner loop (tests/unit, in seconds) and the store
tests on the PostgreSQL server AGENT_WATCHDOG_TEST_PG names, on both backends."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import docblocks as d
from docreader import copy_checkout
from pg_support import PG_ADMIN_URL

PAGE = d.DOCS / "howto" / "develop.md"
TESTS = Path(__file__).resolve().parents[1]


def _block(name: str) -> str:
    (block,) = [b for b in d.blocks(PAGE) if b.kind == "run-by" and b.target == name]
    return block.text


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def test_the_inner_loop_runs_the_unit_folder_in_seconds(tmp_path):
    command = _block("test_the_inner_loop_runs_the_unit_folder_in_seconds")
    checkout = copy_checkout(tmp_path / "agent-watchdog")
    start = time.monotonic()
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=checkout, env=_env(),
                          capture_output=True, text=True, timeout=600)
    took = time.monotonic() - start
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-2000:]
    # No time limit here (tests are never timed: this one shares 2 cores with a system test); what
    # keeps the folder fast is tests/unit/conftest.py's guard, which fails any unit test that opens
    # a socket, a process or a database. The time is printed for whoever reads the log.
    print(f"tests/unit took {took:.1f} s")


STORE_TEST = textwrap.dedent('''
    from sqlalchemy import text
    from watchdog.store.engine import make_engine

    def test_both_backends(db_url):
        with make_engine(db_url).connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
''')


def test_the_store_kind_runs_on_both_backends_on_the_server_the_page_names(tmp_path):
    command = _block("test_the_store_kind_runs_on_both_backends_on_the_server_the_page_names").strip()
    variable, rest = command.split(" ", 1)
    name, url = variable.split("=", 1)
    assert name == "AGENT_WATCHDOG_TEST_PG" and url == PG_ADMIN_URL  # the page names the suite's default
    assert rest == "python -m pytest tests/store"
    case = tmp_path / "store"
    case.mkdir()
    (case / "test_backends.py").write_text(STORE_TEST)
    # The suite's own root conftest.py (-p conftest) gives the fixtures, on a copy of one store test.
    env = {**_env(), "PYTHONPATH": str(TESTS), name: os.environ.get(name, url)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "-o", "addopts=", "--rootdir", str(tmp_path), "-rA", str(case)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    passed = {line.rsplit("::", 1)[-1] for line in out.splitlines() if line.startswith("PASSED ")}
    assert passed == {"test_both_backends[sqlite]", "test_both_backends[postgresql]"}, out
