"""tests/unit: pure tests only (no store, no process, no socket); the whole folder runs in seconds.

`python -m pytest tests/unit` is the inner loop while editing (docs/howto/develop.md). The guard
(tests/purity.py) fails a test here that opens a socket, starts a process or opens a database;
tests/system/test_unit_guard_run.py proves that it does.
"""

# urllib3 (under apprise's and requests' imports) binds a socket on ::1 once, when it is first
# imported, to learn whether the host has IPv6 (urllib3.util.connection.HAS_IPV6). Imported here,
# before any test, so that the guard sees the tests' own sockets, not that probe: a test that
# happens to import it first (a slack:// URL parsed by apprise) would otherwise fail when this
# folder runs alone, depending on what the session had imported before.
import urllib3.util.connection  # noqa: F401

from purity import pytest_runtest_call, pytest_runtest_setup, pytest_runtest_teardown

__all__ = ["pytest_runtest_call", "pytest_runtest_setup", "pytest_runtest_teardown"]
