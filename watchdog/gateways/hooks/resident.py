"""The hook's resident helper: `python -m watchdog.gateways.hooks.resident SOCKET`.

Started by the hook's client (watchdog.gateways.hooks.fastpath) when it found none; answers hook
calls on a Unix socket with the imports and the store's engine warm, so a coding CLI's tool call
costs an interpreter start with the stdlib, not SQLAlchemy's import and a new connection. One
helper per user and store (the socket's name); it answers only its own Unix user (SO_PEERCRED),
and leaves after `fastpath.IDLE_S` without a call, or when its socket file is gone or replaced.
Calls are judged one at a time (a session's calls are counted in order, and SQLite has one writer).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time
from typing import Any

from watchdog.gateways.hooks import fastpath
from watchdog.gateways.hooks.main import answer, parse_args

CHECK_EVERY_S = 1.0


class Helper:
    def __init__(self, path: str, idle_s: float) -> None:
        self.path = path
        self.idle_s = idle_s
        self.engines: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.last = time.monotonic()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def bind(self) -> bool:
        """Take the socket; False if another helper holds it (it answers), or it cannot be made."""
        old = os.umask(0o077)
        try:
            self.sock.bind(self.path)
        except OSError:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
                return False  # alive: that one serves
            except OSError:
                pass  # a dead helper's file
            finally:
                probe.close()
            try:
                os.unlink(self.path)
                self.sock.bind(self.path)
            except OSError:
                return False
        finally:
            os.umask(old)
        self.sock.listen(64)
        self.sock.settimeout(CHECK_EVERY_S)
        self.inode = os.stat(self.path).st_ino
        with open(self.path + ".pid", "w") as f:  # for whoever must stop it by its id (tests)
            f.write(str(os.getpid()))
        return True

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                if self._should_leave():
                    return
                continue
            self.last = time.monotonic()
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _should_leave(self) -> bool:
        if time.monotonic() - self.last > self.idle_s:
            return True
        try:
            return os.stat(self.path).st_ino != self.inode
        except OSError:
            return True

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(fastpath.ANSWER_TIMEOUT_S)
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():
                return  # another user's call is never judged as ours
            head = _read(conn, 4)
            size = struct.unpack("!I", head)[0]
            if size > fastpath.MAX_INPUT_BYTES + 4096:
                return
            request = json.loads(_read(conn, size))
            reply = self.handle(request)
            conn.sendall(json.dumps(reply).encode())
        except (OSError, ValueError, struct.error):
            pass  # the client gave up or sent garbage: it decides on its own (fail-open / closed)
        finally:
            conn.close()

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        argv = [str(a) for a in request.get("argv") or []]
        try:
            opts = parse_args(argv)
        except ValueError as exc:
            return {"stdout": "", "stderr": f"{exc}\n", "exit": 1}
        env = request.get("env") or {}
        opts["db"] = opts["db"] or env.get("AGENT_WATCHDOG_DB")
        opts["config"] = opts["config"] or env.get("AGENT_WATCHDOG_CONFIG")
        with self.lock:
            ans = answer(opts, str(request.get("stdin") or ""), self.engines)
            self.last = time.monotonic()
        return {"stdout": ans.stdout, "stderr": ans.stderr, "exit": ans.exit_code}

    def close(self) -> None:
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
                os.unlink(self.path + ".pid")
        except OSError:
            pass
        self.sock.close()
        for engine in self.engines.values():
            engine.dispose()


def _read(conn: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        got = conn.recv(min(left, 1 << 20))
        if not got:
            raise ValueError("short read")
        chunks.append(got)
        left -= len(got)
    return b"".join(chunks)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m watchdog.gateways.hooks.resident SOCKET\n")
        return 2
    idle_s = float(os.environ.get(fastpath.ENV_IDLE_S) or fastpath.IDLE_S)
    helper = Helper(argv[0], idle_s)
    if not helper.bind():
        return 0
    try:
        helper.serve()
    finally:
        helper.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
