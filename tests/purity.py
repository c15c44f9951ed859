"""The unit kind's promise, enforced: a test in tests/unit opens no socket, starts no process and
opens no database, so that the whole folder runs in seconds as the inner loop while editing.

tests/unit/conftest.py imports the three hooks below; pytest applies a conftest's hooks only to
the tests under its folder, so the store and system kinds are untouched. A SQLite database in memory
(`:memory:`, watchdog.store.inmemory) is no database file and is let through: the judge's rules are
unit-tested on the real store verbs over it. The checks are Python's
audit events (PEP 578: every socket, process and sqlite3 connection raises one, whatever library
asks) plus the PostgreSQL driver's connect, which is C code without an event. An audit hook
cannot be removed, so it is installed once and stays off outside a unit test's phases.

A breach raises ImpureTest at the call and fails the test at the end of its phase, so that code
that swallows the exception (a retry loop, `except Exception`) still fails the test.
"""

from __future__ import annotations

import sys
from collections.abc import Generator

import pytest

try:  # loaded here so that a test importing it later is guarded too (libpq raises no audit event)
    import psycopg
except ImportError:  # pragma: no cover - the store's PostgreSQL driver is a test dependency
    psycopg = None
# audit event -> what the test did (https://docs.python.org/3/library/audit_events.html)
IMPURE_EVENTS = {
    "socket.connect": "opened a socket",
    "socket.bind": "opened a socket",
    "socket.getaddrinfo": "looked a host name up",
    "subprocess.Popen": "started a process",
    "os.system": "started a process",
    "os.exec": "started a process",
    "os.posix_spawn": "started a process",
    "os.spawn": "started a process",
    "os.fork": "started a process",
    "os.forkpty": "started a process",
    "sqlite3.connect": "opened a database",
}
WHERE_INSTEAD = "a test that needs it goes to tests/store/ (a store) or tests/system/ (processes, sockets)"


class ImpureTest(RuntimeError):
    """A unit test did what only store and system tests may do."""


class _Guard:
    def __init__(self) -> None:
        self.on = False
        self.breaches: list[str] = []

    def audit(self, event: str, args: tuple) -> None:
        if not self.on:
            return
        what = IMPURE_EVENTS.get(event)
        if what is not None and not _in_memory(event, args):
            self.breach(f"{what} ({event}{_brief(args)})")

    def breach(self, what: str) -> None:
        self.breaches.append(what)
        raise ImpureTest(f"a unit test {what}: {WHERE_INSTEAD}")


def _in_memory(event: str, args: tuple) -> bool:
    # Only the exact name: "" is a temporary file on disk, and a `file:` URI may name any file.
    return event == "sqlite3.connect" and bool(args) and args[0] == ":memory:"


def _brief(args: tuple) -> str:
    text = ", ".join(repr(a) for a in args[:2])
    return f": {text[:120]}" if text else ""


_GUARD = _Guard()
sys.addaudithook(_GUARD.audit)


def _psycopg_refused(*_args: object, **_kwargs: object) -> None:
    _GUARD.breach("opened a database (psycopg connect)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item))


def _guarded(item: pytest.Item) -> Generator[None, None, None]:
    mp = pytest.MonkeyPatch()
    if psycopg is not None:  # psycopg.connect is Connection.connect, bound when psycopg was imported
        mp.setattr(psycopg, "connect", _psycopg_refused)
        mp.setattr(psycopg.Connection, "connect", classmethod(_psycopg_refused))
        mp.setattr(psycopg.AsyncConnection, "connect", classmethod(_psycopg_refused))
    _GUARD.breaches.clear()
    _GUARD.on = True
    try:
        result = yield
    finally:
        _GUARD.on = False
        mp.undo()
    if _GUARD.breaches:
        breaches, _GUARD.breaches = _GUARD.breaches, []
        pytest.fail(f"{item.nodeid}: a unit test {breaches[0]}: {WHERE_INSTEAD}", pytrace=False)
    return result
