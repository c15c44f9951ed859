"""tests/unit: pure tests only (no store, no process, no socket); the whole folder runs in seconds.

`python -m pytest tests/unit` is the inner loop while editing (docs/howto/develop.md). The guard
(tests/purity.py) fails a test here that opens a socket, starts a process or opens a database;
tests/system/test_unit_guard_run.py proves that it does.
"""

from purity import pytest_runtest_call, pytest_runtest_setup, pytest_runtest_teardown

__all__ = ["pytest_runtest_call", "pytest_runtest_setup", "pytest_runtest_teardown"]
