"""Real attestation for the tests: a daemon key, the daemon's socket server, real users.

The ladder signals only processes the daemon attested, so every test that wants
a signal sent runs a real AttestServer (the daemon's own code) on a short
socket path and hands its Sealer to the Ticker; agents find the socket through
$AGENT_WATCHDOG_SOCKET, as in production. Nothing bypasses the check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from watchdog.core.seal import Sealer
from watchdog.daemon import keyfile
from watchdog.daemon.attest import AttestServer
from watchdog.daemon.killer import Killer
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


def shared_sqlite(tmp_root: Path | None = None) -> tuple[str, Path]:
    """A SQLite store every local user may write (as the README's group setup allows):
    directory 0777, file 0666; SQLite gives its -wal and -shm the file's mode and owner."""
    from watchdog.store import migrate

    folder = short_dir("awdb") if tmp_root is None else tmp_root
    folder.chmod(0o777)
    path = folder / "runs.db"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    path.chmod(0o666)
    return url, folder


def run_as(user: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run argv as `user` (a fresh process; its HOME is not needed)."""
    env = dict(kw.pop("env", os.environ))
    return subprocess.run(argv, user=user, env=env, capture_output=True, text=True, timeout=60, **kw)
