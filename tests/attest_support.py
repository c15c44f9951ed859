"""Real attestation for the tests: a daemon key, the daemon's socket server, real users.

The ladder signals only processes the daemon attested, so every test that wants
a signal sent runs a real AttestServer (the daemon's own code) on a short
socket path and hands its Sealer to the Ticker; agents find the socket through
$AGENT_WATCHDOG_SOCKET, as in production. Nothing bypasses the check.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from watchdog.core.seal import Sealer
from watchdog.daemon.trust import keyfile
from watchdog.daemon.stops.attest import AttestServer
from watchdog.daemon.stops.killer import Killer
from watchdog.store.engine import make_engine


def short_dir(prefix: str = "aw") -> Path:
    """A fresh directory with a short path: a Unix socket path must fit in 107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


class Attestor:
    """The daemon's key and socket, for one test."""

    def __init__(self, url: str, host: str | None = None, socket: str | None = None):
        self.dir = short_dir()
        self.key_file = str(self.dir / "attest.key")
        self.socket = socket or str(self.dir / "attest.sock")
        self.host = host or Killer().host
        self.sealer = Sealer(keyfile.load_or_create(self.key_file), self.host)
        self.engine = make_engine(url)
        self.server = AttestServer(self.engine, self.sealer, self.socket, self.host)

    def start(self) -> "Attestor":
        self.server.start()
        return self

    def close(self) -> None:
        self.server.stop()
        self.engine.dispose()
        shutil.rmtree(self.dir, ignore_errors=True)


class LocalUsers:
    """Real local users for permission tests (useradd; CI runs as root), removed afterwards."""

    def __init__(self):
        self.created: list[str] = []

    def add(self, role: str) -> str:
        name = f"aw{role[:8]}{uuid.uuid4().hex[:6]}"
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                       capture_output=True)
        self.created.append(name)
        return name

    def close(self) -> None:
        for name in self.created:
            subprocess.run(["userdel", name], capture_output=True)


@contextmanager
def local_user(role: str) -> Iterator[str]:
    """One real local user (LocalUsers.add) for the block, removed after it."""
    users = LocalUsers()
    try:
        yield users.add(role)
    finally:
        users.close()


def shared_sqlite(tmp_root: Path | None = None) -> tuple[str, Path]:
    """A SQLite store every local user may write (as the README's group setup allows):
    directory 0777, file 0666; SQLite gives its -wal and -shm the file's mode and owner."""
    from watchdog.store import access

    folder = short_dir("awdb") if tmp_root is None else tmp_root
    folder.chmod(0o777)
    path = folder / "runs.db"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    access.upgrade(engine)
    engine.dispose()
    path.chmod(0o666)
    return url, folder


def run_as(user: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run argv as `user` (a fresh process; its HOME is not needed)."""
    env = dict(kw.pop("env", os.environ))
    return subprocess.run(argv, user=user, env=env, capture_output=True, text=True, timeout=60, **kw)


def _world_runnable(path: str) -> bool:
    """Every directory on the way is traversable by others and the file executable by them."""
    real = Path(os.path.realpath(path))
    if not (real.is_file() and os.stat(real).st_mode & 0o001):
        return False
    return all(os.stat(p).st_mode & 0o001 for p in real.parents)


def foreign_python() -> tuple[str, dict]:
    """An interpreter (same major.minor as ours) and the environment with which another local
    user runs this checkout's SDK. The test's own interpreter may live under a home directory
    other users cannot enter (pyenv in /root), and its venv or the checkout under a private
    directory (CI's `mktemp -d` is 0700): then a system interpreter of the same version runs a
    world-readable copy of the checkout and of the imported site-packages (made once per process)."""
    import sys

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for exe in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if os.path.exists(exe) and _world_runnable(exe):
            env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
            env["PYTHONPATH"] = os.pathsep.join(_foreign_paths())  # the checkout first
            env["PYTHONNOUSERSITE"] = "1"
            return exe, env
    raise AssertionError(f"no Python {version} that other users can run (the test's is {sys.executable}); "
                         f"install python{version} system-wide to run the multi-user tests")


@functools.cache
def _foreign_paths() -> tuple[str, ...]:
    import sys
    import sysconfig

    repo = Path(__file__).resolve().parents[1]
    tests = Path(__file__).resolve().parent
    site = list(dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]))
    paths = [str(repo), str(tests), *site]
    if all(_world_readable_dir(p) for p in paths):
        return tuple(dict.fromkeys(paths))
    shadow = Path(tempfile.mkdtemp(prefix="aw-foreign-", dir="/tmp"))
    atexit.register(shutil.rmtree, shadow, True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "scratch_root")
    shutil.copytree(repo / "watchdog", shadow / "repo" / "watchdog", ignore=skip)
    # The source tree's migrations beside the package (watchdog.store.access looks there): a
    # plain user's `db upgrade` runs from this copy too.
    shutil.copytree(repo / "migrations", shadow / "repo" / "migrations", ignore=skip)
    shutil.copytree(tests, shadow / "tests", ignore=skip)
    lib = shadow / "site"
    lib.mkdir()
    # Copy only what the agents' processes import (the SDK, SQLAlchemy, the PostgreSQL driver):
    # import it here first, then copy the top-level packages of every loaded module.
    for name in ("watchdog.client", "sqlalchemy", "psycopg", "psycopg_binary", "psycopg_pool"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    roots = {Path(os.path.realpath(d)) for d in site}
    tops: set[Path] = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file:
            continue
        real = Path(os.path.realpath(file))
        for root in roots:
            if root in real.parents:
                tops.add(root / real.relative_to(root).parts[0])
    for root in roots:
        tops.update(root.glob("*.dist-info"))
        tops.update(root.glob("*.libs"))  # wheels' vendored shared libraries (psycopg_binary.libs)
    for top in tops:
        target = lib / top.name
        if top.is_dir() and not target.exists():
            shutil.copytree(top, target, ignore=skip, symlinks=True)
        elif top.is_file():
            shutil.copy2(top, target)
    for d in (shadow, *shadow.rglob("*")):
        mode = d.stat(follow_symlinks=False).st_mode if not d.is_symlink() else None
        if mode is not None:
            d.chmod(mode | (0o755 if d.is_dir() else 0o444))
    return (str(shadow / "repo"), str(shadow / "tests"), str(lib))


def _world_readable_dir(path: str) -> bool:
    p = Path(os.path.realpath(path))
    return (p.is_dir() and os.stat(p).st_mode & 0o005 == 0o005
            and all(os.stat(q).st_mode & 0o001 for q in p.parents))
