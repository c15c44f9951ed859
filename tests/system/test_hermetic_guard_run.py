"""The hermetic guard bites: pytest, run with the suite's root conftest.py on small tests that
reach a "host" path (a folder named in $AGENT_WATCHDOG_TEST_HOST_PATHS, standing in for
/var/lib/agent-watchdog and the others), fails each of them, even one that swallows the error,
and passes the one that stays in its tmp_path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from hermetic import DEFAULT_HOST_PATHS, HOST_PATHS_ENV, host_paths

TESTS = Path(__file__).resolve().parents[1]

OFFENDERS = textwrap.dedent('''
    import os
    import socket
    import sqlite3

    HOST = os.environ["FAKE_HOST"]

    def test_stays_in_its_tmp_path(tmp_path):
        (tmp_path / "attest.key").write_bytes(b"k")
        assert os.path.exists(HOST)  # asking whether it exists reads nothing

    def test_reads_the_host_key():
        with open(os.path.join(HOST, "attest.key"), "rb") as f:
            f.read()

    def test_writes_into_the_host_directory():
        with open(os.path.join(HOST, "new.txt"), "w") as f:
            f.write("x")

    def test_lists_the_host_directory():
        os.listdir(HOST)

    def test_opens_the_host_store():
        sqlite3.connect(os.path.join(HOST, "store", "runs.db")).close()

    def test_connects_to_the_host_socket():
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(os.path.join(HOST, "attest.sock"))

    def test_swallows_the_error():
        try:
            os.makedirs(os.path.join(HOST, "sub", "dir"))
        except OSError:
            pass
''')


def test_the_default_list_is_the_units_directories_and_the_environment_replaces_it():
    assert DEFAULT_HOST_PATHS == ("/var/lib/agent-watchdog", "/run/agent-watchdog", "/etc/agent-watchdog")
    assert host_paths({}) == DEFAULT_HOST_PATHS
    assert host_paths({HOST_PATHS_ENV: "/srv/aw/:/opt/x"}) == ("/srv/aw", "/opt/x")
    assert host_paths({HOST_PATHS_ENV: ""}) == ()


def test_the_hermetic_guard_fails_tests_that_touch_a_host_path(tmp_path):
    host = tmp_path / "host" / "agent-watchdog"
    (host / "store").mkdir(parents=True)
    (host / "attest.key").write_bytes(b"secret")
    case = tmp_path / "case"
    case.mkdir()
    (case / "test_offenders.py").write_text(OFFENDERS)
    env = {**os.environ, "PYTHONPATH": str(TESTS), HOST_PATHS_ENV: str(host), "FAKE_HOST": str(host),
           "COLUMNS": "400"}
    # -p conftest: the suite's own root conftest.py (its pytest_plugins load the guard), not a copy.
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "-rf",
                           "--rootdir", str(case), "-o", "addopts=", str(case)],
                          cwd=case, env=env, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "6 failed, 1 passed" in out, out
    failed = [ln for ln in out.splitlines() if ln.startswith("FAILED")]
    assert len(failed) == 6 and all(str(host) in ln for ln in failed), out
    assert not (host / "new.txt").exists() and not (host / "sub").exists()  # the guard stopped the writes
