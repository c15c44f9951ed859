"""Real local alert receivers for tests: an SMTP server and a JSON webhook.

Both bind only to 127.0.0.1 on a kernel-chosen port and run in a background
thread. Use them as context managers; `wait_for(n)` blocks (bounded) until n
messages were accepted, so tests never sleep for a guessed duration.
"""

from __future__ import annotations

import email
import email.message
import email.policy
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

from aiosmtpd.controller import Controller

LOCALHOST = "127.0.0.1"
# Generous: the SMTP thread must start on a loaded 2-core CI box.
_SMTP_READY_TIMEOUT_S = 30.0


class _Inbox:
    """Accepted messages plus a scripted-failure counter, safe across threads."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.items: list = []
        self.rejected = 0
        self._fail_left = 0
        self._fail_code = 0

    def fail_next(self, n: int, code: int) -> None:
        with self._cond:
            self._fail_left, self._fail_code = n, code

    def take_failure(self) -> int | None:
        """The code to fail this request with, or None to accept it."""
        with self._cond:
            if self._fail_left <= 0:
                return None
            self._fail_left -= 1
            self.rejected += 1
            return self._fail_code

    def add(self, item) -> None:
        with self._cond:
            self.items.append(item)
            self._cond.notify_all()

    def wait_for(self, n: int, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.items) >= n, timeout_s)


class _PreboundController(Controller):
    """A Controller serving on a socket we bound ourselves.

    aiosmtpd cannot use port=0 (its start-up probe connects to `self.port`),
    and "pick a free port, close it, hope" races with other tests.
    """

    def __init__(self, handler, sock: socket.socket, **kwargs):
        self._sock = sock
        super().__init__(handler, hostname=LOCALHOST, port=sock.getsockname()[1], **kwargs)

    def _create_server(self):
        return self.loop.create_server(self._factory_invoker, sock=self._sock)


class SmtpSink:
    """A plain (no TLS, no AUTH) SMTP server; `.messages` holds parsed mails."""

    def __init__(self) -> None:
        self._inbox = _Inbox()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOCALHOST, 0))
        self.port: int = sock.getsockname()[1]
        # server_hostname skips aiosmtpd's getfqdn(), a DNS lookup that can stall.
        self._controller = _PreboundController(
            self, sock, server_hostname="localhost", ready_timeout=_SMTP_READY_TIMEOUT_S
        )

    @property
    def messages(self) -> list[email.message.Message]:
        return list(self._inbox.items)

    # aiosmtpd handler hook (this object is its own handler).
    async def handle_DATA(self, server, session, envelope) -> str:
        code = self._inbox.take_failure()
        if code is not None:
            return f"{code} sink told to refuse this message"
        self._inbox.add(email.message_from_bytes(envelope.content, policy=email.policy.default))
        return "250 OK"

    def fail_next(self, n: int, code: int = 550) -> None:
        """Refuse the next n messages at DATA with this SMTP code."""
        self._inbox.fail_next(n, code)

    def url(self, to: str = "oncall@example.org", sender: str = "watchdog@example.org") -> str:
        # mailto:// (not mailtos://) is already plain SMTP; mode=insecure makes it
        # explicit so no STARTTLS is attempted against a server that lacks it.
        # No user:password, so apprise skips AUTH (which the sink does not offer).
        return (
            f"mailto://{LOCALHOST}:{self.port}"
            f"?to={quote(to, safe='@')}&from={quote(sender, safe='@')}&mode=insecure"
        )

    def wait_for(self, n: int, timeout_s: float = 10) -> bool:
        return self._inbox.wait_for(n, timeout_s)

    def __enter__(self) -> SmtpSink:
        self._controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self._controller.stop()


class HttpSink:
    """A JSON webhook: each accepted POST body (parsed) is appended to `.received`."""

    def __init__(self) -> None:
        self._inbox = _Inbox()
        self.delay_s = 0.0  # answer each POST this late (a slow target, not a dead one)
        inbox = self._inbox
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if sink.delay_s:
                    time.sleep(sink.delay_s)
                code = inbox.take_failure()
                if code is None:
                    try:
                        inbox.add(json.loads(raw))
                        code = 200
                    except ValueError:
                        code = 400
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass  # keep test output clean; the sink's state is the record

        self._server = ThreadingHTTPServer((LOCALHOST, 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def received(self) -> list:
        return list(self._inbox.items)

    @property
    def rejected(self) -> int:
        """How many requests were failed on purpose by fail_next()."""
        return self._inbox.rejected

    def fail_next(self, n: int, status: int = 500) -> None:
        """Answer the next n requests with this HTTP status (not recorded)."""
        self._inbox.fail_next(n, status)

    def url(self) -> str:
        return f"json://{LOCALHOST}:{self.port}/hook"

    def wait_for(self, n: int, timeout_s: float = 10) -> bool:
        return self._inbox.wait_for(n, timeout_s)

    def __enter__(self) -> HttpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def closed_port() -> tuple[socket.socket, int]:
    """A 127.0.0.1 port that refuses connections for as long as the socket lives.

    Bound but never listening: the kernel answers connects with RST, and no
    other process can take the port meanwhile. Close the socket when done.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOCALHOST, 0))
    return sock, sock.getsockname()[1]


class HangSink:
    """A target that hangs: it accepts every connection and never answers a byte, until closed.
    `connections` counts the connections it accepted (a sender that piles up shows here)."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((LOCALHOST, 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)  # the accept loop sees the stop flag
        self.port: int = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)

    def url(self, read_timeout_s: float | None = None) -> str:
        # apprise's own read timeout is 4 s: `rto` makes the wait last (the Notifier caps it at its timeout_s).
        return f"json://{LOCALHOST}:{self.port}/hook" + (f"?rto={read_timeout_s:g}" if read_timeout_s else "")

    def __enter__(self) -> HangSink:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()
        with self._lock:  # the senders blocked on these get their EOF now
            for conn in self._conns:
                conn.close()
