"""A real PgBouncer (Debian package `pgbouncer`) in transaction pooling mode, started on a
free 127.0.0.1 port in front of the test PostgreSQL server, for tests and benchmarks.

    with PgBouncer(users=["aw_limited"], pool_size=3) as bouncer:
        url = bouncer.url("aw_limited", "mydb")

It runs in the foreground as a child process (as user `postgres` when we are root:
PgBouncer refuses to run as root) and is stopped with SIGTERM, by its own pid.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SERVER_HOST = "127.0.0.1"
SERVER_PORT = 5432
START_TIMEOUT_S = 30.0


def binary() -> str | None:
    return shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
                                              if os.access(p, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgBouncer:
    def __init__(self, users, *, pool_size: int = 10, max_client_conn: int = 2000, run_as: str = "postgres",
                 server_user: str | None = None):
        self.exe = binary()
        if self.exe is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)")
        self.users = list(users)
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.server_user = server_user  # [databases] user=: every client reaches the server as that one login
        self.run_as = run_as if os.geteuid() == 0 else None
        self.dir = Path(tempfile.mkdtemp(prefix="aw_pgbouncer_"))
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def _write_config(self) -> Path:
        (self.dir / "users.txt").write_text("".join(f'"{u}" ""\n' for u in self.users))
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(f"""[databases]
* = host={SERVER_HOST} port={SERVER_PORT}{f" user={self.server_user}" if self.server_user else ""}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir / 'users.txt'}
pool_mode = transaction
default_pool_size = {self.pool_size}
max_db_connections = {self.pool_size}
reserve_pool_size = 0
max_client_conn = {self.max_client_conn}
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {self.dir / 'pgbouncer.log'}
pidfile =
admin_users = postgres
""")
        if self.run_as:
            pw = pwd.getpwnam(self.run_as)
            for p in (self.dir, *self.dir.iterdir()):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        return ini

    def start(self) -> "PgBouncer":
        last = ""
        for _ in range(5):  # a free port may be taken between our probe and pgbouncer's bind
            self.port = _free_port()
            ini = self._write_config()
            argv = [self.exe, *(["-u", self.run_as] if self.run_as else []), str(ini)]
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        return self
                except OSError:
                    time.sleep(0.05)
            last = self.log()
            self.stop()
        raise RuntimeError(f"pgbouncer did not start:\n{last}")

    def url(self, user: str, dbname: str) -> str:
        return f"postgresql+psycopg://{user}@127.0.0.1:{self.port}/{dbname}"

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "PgBouncer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
