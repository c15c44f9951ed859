"""Hermetic tests: no test reads or writes this machine's own agent-watchdog paths.

As root the daemon's defaults are the host's /var/lib/agent-watchdog, /run/agent-watchdog and
/etc/agent-watchdog (watchdog.core.paths, the shipped unit). A test that forgets to name its own
directories would read a real daemon's key or store, or leave files that break the next run (the
systemd steps' test once failed on a machine where a daemon had run). conftest.py gives every
test session its own STATE_DIRECTORY and RUNTIME_DIRECTORY; this guard fails a test that still
reaches a host path in the test process: opening, listing, creating, removing, renaming or
chmod-ing one, a SQLite store under one, or a socket bound or connected there.

It is an audit hook (PEP 578), installed once by the root conftest for the whole session. A touch
raises HostPathTouched at the call and fails the test at the end of its phase, so that code that
swallows the error (`except OSError`) still fails it. Processes a test starts are not watched:
they inherit the session's directories through the environment; the scratch root of
tests/scratch_root.py gives the systemd steps a private /etc, /var/lib and /run.

$AGENT_WATCHDOG_TEST_HOST_PATHS (paths separated by ':') replaces the list; empty turns it off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Mapping

import pytest

HOST_PATHS_ENV = "AGENT_WATCHDOG_TEST_HOST_PATHS"
DEFAULT_HOST_PATHS = ("/var/lib/agent-watchdog", "/run/agent-watchdog", "/etc/agent-watchdog")

# Audit events whose arguments name files (https://docs.python.org/3/library/audit_events.html).
FILE_EVENTS = frozenset({
    "open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.listdir", "os.scandir", "os.chmod",
    "os.chown", "os.symlink", "os.link", "os.truncate", "os.utime", "os.chdir", "os.mkfifo", "os.mknod",
    "os.setxattr", "os.getxattr", "os.listxattr", "os.removexattr", "shutil.rmtree", "shutil.copyfile",
    "shutil.copytree", "shutil.move", "shutil.chown", "glob.glob", "sqlite3.connect", "socket.bind",
    "socket.connect",
})


class HostPathTouched(PermissionError):
    """A test reached one of this machine's own agent-watchdog paths."""


def host_paths(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    raw = environ.get(HOST_PATHS_ENV)
    if raw is None:
        return DEFAULT_HOST_PATHS
    return tuple(os.path.normpath(p) for p in raw.split(":") if p)


class _Guard:
    def __init__(self, paths: tuple[str, ...]) -> None:
        self.paths = paths
        self.prefixes = tuple(p.rstrip("/") + "/" for p in paths)
        self.breaches: list[str] = []

    def audit(self, event: str, args: tuple) -> None:
        if event not in FILE_EVENTS or not self.paths:
            return
        for arg in args:
            if isinstance(arg, (str, bytes, os.PathLike)):
                path = self.host_path(arg)
                if path is not None:
                    self.breaches.append(f"{event} {path}")
                    raise HostPathTouched(f"a test touched this machine's {path} ({event}): give it its own "
                                          f"directory (tmp_path; see tests/hermetic.py)")

    def host_path(self, arg: str | bytes | os.PathLike) -> str | None:
        try:
            path = os.fsdecode(arg)
        except TypeError:
            return None
        if path.startswith("file:"):  # a SQLite URI
            path = path[len("file:"):].split("?", 1)[0]
        if not path.startswith("/"):
            if "agent-watchdog" not in path:  # cheap: most relative names cannot be one
                return None
            path = os.path.abspath(path)
        path = os.path.normpath(path)
        if path in self.paths or path.startswith(self.prefixes):
            return path
        return None


_GUARD = _Guard(host_paths())
sys.addaudithook(_GUARD.audit)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _failing_on_touch(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _failing_on_touch(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _failing_on_touch(item))


def _failing_on_touch(item: pytest.Item) -> Generator[None, None, None]:
    _GUARD.breaches.clear()
    result = yield
    if _GUARD.breaches:
        first, _GUARD.breaches = _GUARD.breaches[0], []
        pytest.fail(f"{item.nodeid} touched this machine's path: {first} (tests/hermetic.py)", pytrace=False)
    return result
