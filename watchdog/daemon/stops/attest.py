"""Attested process identity: the daemon's Unix socket, and the check the killer relies on.

An agent names its run over `[daemon] socket`; the kernel (SO_PEERCRED) tells
the daemon which process and user are on the other end, so nothing the peer
says about itself is believed. The daemon checks that process against the run's
row (this host, the same pid, the same create time, a process that existed
before it connected) and writes the identity to `attestations`, sealed with its
key. The ladder signals only identities whose seal verifies: a row anyone
writes can name a victim, it cannot make the daemon attest one.

Protocol, one line of JSON each way, bounded and timed out on both sides:

    → {"run": "<run id>", "kill_mode": "process"}
    ← {"ok": true, "key": "<64 hex>"[, "otlp": {"endpoint": "<traces URL>", "token": "<bearer>"}]}
      |  {"ok": false, "error": "<why>"}

`key` is the run's evidence key (watchdog.core.evidence_mac): the process MACs its records
with it, and on SQLite only such records can justify a signal (watchdog.daemon.trust.authentic).
`otlp`, while `[otlp] listen` is on: the receiver's traces URL and the run's own bearer token
(watchdog.daemon.otlp.auth), so exec's command exports spans for its run without reading the
daemon's config (mode 0640) or any token file. `{"run": "<id>", "otlp_only": true}` asks for
that alone, without being attested (exec in a systemd scope, whose command must run before it
can be attested): the same checks of the row against the kernel, no key, no seal written.

Under abuse (the socket is open to every local user): each request has one deadline for the
whole of it (a peer trickling a byte at a time is dropped when it passes), each Unix user may
hold at most PER_UID_MAX connections at once (the ones beyond are closed as they arrive), so
a flood from one user never holds the slots another user's run needs.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable

import psutil

from watchdog.core.rowviews import RunView
from watchdog.core import lifecycle as lc
from watchdog.core.seal import Sealer
from watchdog.core.procid import CREATE_TIME_TOLERANCE_S, ProcessIdentity
from watchdog.errors import ConfigError
from watchdog.daemon.trust.authentic import new_evidence, parse_evidence, run_key
from watchdog.store import attestations as rows, attestations as evstore
from watchdog.core.periods import utcnow
from watchdog.store.engine import Connection, Engine, bound_lock_waits

log = logging.getLogger("watchdog.attest")

REQUEST_MAX_BYTES = 512
IO_TIMEOUT_S = 2.0  # the whole request, from accept to its last byte (not per recv)
REPLY_TIMEOUT_S = 2.0  # writing the reply
MAX_CONCURRENT = 64  # handler threads in all
PER_UID_MAX = 4  # connections one Unix user may hold at once: a flood holds these, never the others'
SOCKET_KEY = "[daemon] socket"
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Refused(Exception):
    """Why a peer's request is not attested (said back to it)."""


def verified_leader(conn: Connection, row: RunView, sealer: Sealer | None) -> tuple[ProcessIdentity | None, str]:
    """The run's process identity if this daemon attested it and its seal verifies, else (None, why).

    The identity comes from the attestation, never from the run row: a row changed
    after the attestation (another pid, another kill mode) names nobody.
    """
    if sealer is None:
        return None, "this daemon has no sealing key"
    a = rows.load(conn, row.id)
    if a is None:
        return None, "the run never attested itself to this host's daemon"
    if not sealer.identity_ok(a.mac, a.run_id, a.host, a.pid, a.pid_create_time, a.uid, a.kill_mode, a.cgroup):
        return None, "its attestation's seal does not verify (forged or from another daemon)"
    if ((a.host, a.pid, a.kill_mode) != (row.host, row.pid, row.kill_mode)
            or row.pid_create_time is None or abs(row.pid_create_time - a.pid_create_time) > CREATE_TIME_TOLERANCE_S):
        return None, "the run row no longer matches what was attested"
    return ProcessIdentity(a.host, a.pid, a.pid_create_time, a.uid), ""


class AttestServer:
    """Listens on `path` in a thread of the daemon; `attest()` is the whole decision."""

    def __init__(self, engine: Engine, sealer: Sealer, path: str, host: str,
                 otlp: Callable[[], str | None] | None = None) -> None:
        self.engine = engine
        self.otlp = otlp  # the OTLP receiver's URL while it listens (handed to attested runs)
        self.sealer = sealer
        self.path = path
        self.host = host
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self._per_uid: dict[int, int] = {}
        self._per_uid_lock = threading.Lock()
        self.dropped_slow = 0  # peers dropped at the whole-request deadline (tests, metrics)

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> "AttestServer":
        self._sock = sock = _bind(self.path)
        sock.settimeout(0.5)  # so stop() is seen without a connection
        self._thread = threading.Thread(target=self._serve, args=(sock,), name="attest", daemon=True)
        self._thread.start()
        log.info("attesting run identities on %s", self.path)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                    os.unlink(self.path)
            except OSError:
                pass

    def __enter__(self) -> AttestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving -------------------------------------------------------------------

    def _serve(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.1)  # EMFILE and the like: do not spin
                continue
            deadline = time.monotonic() + IO_TIMEOUT_S
            try:
                pid, uid, _gid = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                  _PEERCRED.size))
            except OSError:
                conn.close()
                continue
            if not self._admit(uid):
                conn.close()  # this user holds its share already (or all slots are busy): the SDK retries later
                continue
            try:
                threading.Thread(target=self._handle, args=(conn, pid, uid, deadline), daemon=True).start()
            except RuntimeError:  # no thread to be had: drop this one, keep serving
                self._release(uid)
                conn.close()

    def _admit(self, uid: int) -> bool:
        with self._per_uid_lock:
            if self._per_uid.get(uid, 0) >= PER_UID_MAX:
                return False
            if not self._slots.acquire(blocking=False):
                return False
            self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
            return True

    def _release(self, uid: int) -> None:
        with self._per_uid_lock:
            n = self._per_uid.get(uid, 1) - 1
            if n > 0:
                self._per_uid[uid] = n
            else:
                self._per_uid.pop(uid, None)
            self._slots.release()

    def held(self, uid: int) -> int:
        """Connections user `uid` holds now (for tests and metrics)."""
        with self._per_uid_lock:
            return self._per_uid.get(uid, 0)

    def _handle(self, conn: socket.socket, pid: int, uid: int, deadline: float) -> None:
        try:
            accepted_at = time.time()
            try:
                try:
                    line = _read_line(conn, deadline)
                except socket.timeout:  # told why (one short write, never waited on), then dropped
                    self.dropped_slow += 1
                    raise Refused(f"no whole request within {IO_TIMEOUT_S:g} s") from None
                run_id, kill_mode = _parse(line)
                url = self.otlp() if self.otlp is not None else None
                reply: dict[str, object] = {"ok": True}
                if _only_otlp(line):  # exec in a systemd scope: the token before its command starts
                    self._registered_process(run_id, pid, uid, connected_before=accepted_at)
                else:
                    _a, key = self.attest_with_key(run_id, pid, uid, kill_mode, connected_before=accepted_at,
                                                   cgroup=_requested_cgroup(line))
                    reply["key"] = key.hex()
                if url:  # where to export spans, with the run's own bearer token (no file, no config)
                    reply["otlp"] = {"endpoint": url, "token": self.sealer.otlp_token(run_id)}
            except Refused as exc:
                reply = {"ok": False, "error": str(exc)}
                log.info("attestation refused for pid %d uid %d: %s", pid, uid, exc)
            except OSError:
                raise  # the peer went away: nobody to answer
            except Exception as exc:  # noqa: BLE001 — a store blip: the SDK asks again later
                reply = {"ok": False, "error": "the daemon could not record it now; try again later"}
                log.warning("attestation failed for pid %d: %s", pid, type(exc).__name__)
            conn.settimeout(REPLY_TIMEOUT_S)
            conn.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass  # the peer went away, or took longer than the deadline: dropped
        finally:
            conn.close()
            self._release(uid)

    # -- the decision -----------------------------------------------------------------

    def attest(self, run_id: str, pid: int, uid: int, kill_mode: str | None, *,
               connected_before: float | None = None, cgroup: str | None = None) -> rows.Attestation:
        """Attest that process `pid` (uid `uid`, as the kernel says) is the one of run `run_id`."""
        return self.attest_with_key(run_id, pid, uid, kill_mode, connected_before=connected_before, cgroup=cgroup)[0]

    def attest_with_key(self, run_id: str, pid: int, uid: int, kill_mode: str | None, *,
                        connected_before: float | None = None,
                        cgroup: str | None = None) -> tuple[rows.Attestation, bytes]:
        """`attest`, and the run's evidence key (for the attested process only: the reply)."""
        create_time = self._connected(pid, uid, connected_before)
        with self.engine.begin() as conn:
            bound_lock_waits(conn)  # the attestation's key waits on the run's row, which its writer may hold
            row = self._row_of(conn, run_id, pid, create_time)
            if kill_mode is not None and kill_mode != row.kill_mode:
                raise Refused(f"run {run_id} is registered with kill_mode {row.kill_mode!r}, you said {kill_mode!r}")
            cgroup = checked_cgroup(run_id, row.kill_mode, cgroup, pid, create_time)
            mac = self.sealer.identity(run_id, self.host, pid, create_time, uid, row.kill_mode, cgroup)
            now = utcnow()
            a = rows.Attestation(run_id, self.host, pid, create_time, uid, row.kill_mode, now, mac, cgroup)
            current = evstore.load_evidence(conn, run_id)
            if current is not None and current.mac == mac:  # asked twice: the same key again
                sealed = parse_evidence(self.sealer, run_id, current.evidence)
                stored = rows.load(conn, run_id)  # the row `current` is, as its typed record
                if sealed is not None and stored is not None:
                    return stored, run_key(self.sealer, run_id, sealed)
            else:
                rows.replace(conn, a)
            # A new key for a new identity (or for one whose evidence record is gone or forged).
            text = new_evidence(self.sealer, run_id, row.budgets, now)
            evstore.save_evidence(conn, run_id, text)
            sealed = parse_evidence(self.sealer, run_id, text)
            if sealed is None:  # this daemon's own record, sealed a line above: it always verifies
                raise RuntimeError(f"run {run_id}: the evidence record just sealed does not verify")
        log.info("attested run %s: pid %d uid %d on %s (%s)", run_id[:8], pid, uid, self.host, row.kill_mode)
        return a, run_key(self.sealer, run_id, sealed)


    def _connected(self, pid: int, uid: int, connected_before: float | None) -> float:
        """The connecting process's create time, checked (Refused: gone, recycled, changed user)."""
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                create_time = proc.create_time()
                uids = proc.uids()
        except psutil.Error:
            raise Refused("your process is gone") from None
        if connected_before is not None and create_time > connected_before + CREATE_TIME_TOLERANCE_S:
            # The pid was recycled after it connected (a child holding the socket would
            # otherwise lend its dead parent's pid to a newcomer).
            raise Refused("the connecting process is gone")
        if uids.real != uid or uids.effective != uid:
            raise Refused("the connecting process changed user")
        return float(create_time)

    def _row_of(self, conn: Connection, run_id: str, pid: int, create_time: float) -> rows.RegisteredRun:
        """The run's row, if it registers this very process on this host (else Refused)."""
        row = rows.registered(conn, run_id)
        if row is None:
            raise Refused(f"no run {run_id!r} in the store")
        if row.status not in lc.ACTIVE_STATUSES:
            raise Refused(f"run {run_id} is {row.status}")
        if row.host != self.host:
            raise Refused(f"run {run_id} is registered on host {row.host!r}, this daemon watches {self.host!r}")
        if row.pid != pid:
            raise Refused(f"run {run_id} is registered with pid {row.pid}, you are pid {pid}")
        if row.pid_create_time is None or abs(row.pid_create_time - create_time) > CREATE_TIME_TOLERANCE_S:
            raise Refused(f"run {run_id} is registered with another create time than your process's")
        return row

    def _registered_process(self, run_id: str, pid: int, uid: int, *, connected_before: float | None) -> None:
        """A request for the run's OTLP token alone (`"otlp_only": true`): the process the row
        registers asks, attested or not (the token lets spans count for the run only from inside
        its attested tree, which the receiver checks with the kernel)."""
        create_time = self._connected(pid, uid, connected_before)
        with self.engine.connect() as conn:
            self._row_of(conn, run_id, pid, create_time)


# -- exec's cgroup (kill_mode cgroup) ---------------------------------------------------------


def checked_cgroup(run_id: str, kill_mode: str, cgroup: str | None, pid: int, create_time: float) -> str | None:
    """The cgroup to seal with the identity: exec's, checked against the kernel (named for the
    run, under the cgroup2 mount, exec's process or its child in it); raises Refused. Only a
    cgroup run has one: any other kill mode never gets the daemon to a cgroup."""
    if kill_mode != lc.CGROUP:
        return None
    if cgroup is None:
        raise Refused(f"run {run_id} has kill_mode cgroup: name its cgroup (\"cgroup\": \"/...\")")
    from watchdog.daemon.stops.runtree import attest_refusal

    why = attest_refusal(run_id, cgroup, pid, create_time)
    if why is not None:
        raise Refused(f"cgroup refused: {why}")
    return cgroup


def verified_cgroup(conn: Connection, row: RunView, sealer: Sealer | None) -> str | None:
    """The cgroup of a verified attestation (the ladder's only source of one), else None."""
    if sealer is None or verified_leader(conn, row, sealer)[0] is None:
        return None
    a = rows.load(conn, row.id)
    return a.cgroup if a is not None and a.kill_mode == lc.CGROUP else None


def _only_otlp(line: bytes) -> bool:
    try:
        return json.loads(line.decode("utf-8")).get("otlp_only") is True
    except (UnicodeDecodeError, ValueError, AttributeError):
        return False


def _requested_cgroup(line: bytes) -> str | None:
    try:
        value = json.loads(line.decode("utf-8")).get("cgroup")
    except (UnicodeDecodeError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and 0 < len(value) <= 400 else None


def _parse(line: bytes) -> tuple[str, str | None]:
    try:
        req = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise Refused("expected one line of JSON: {\"run\": \"<run id>\"}") from None
    if not isinstance(req, dict):
        raise Refused("expected a JSON object")
    run_id, kill_mode = req.get("run"), req.get("kill_mode")
    if not isinstance(run_id, str) or not 0 < len(run_id) <= 32:
        raise Refused("run: expected a run id")
    if kill_mode is not None and not isinstance(kill_mode, str):
        raise Refused("kill_mode: expected a string")
    return run_id, kill_mode


def _read_line(conn: socket.socket, deadline: float) -> bytes:
    """One line, all of it before `deadline` (monotonic): a peer that trickles is timed out."""
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("request deadline passed")
        conn.settimeout(left)
        chunk = conn.recv(REQUEST_MAX_BYTES + 1 - len(buf))
        if not chunk:
            break
        buf += chunk
        if len(buf) > REQUEST_MAX_BYTES:
            raise Refused(f"request longer than {REQUEST_MAX_BYTES} bytes")
    return buf.split(b"\n", 1)[0]


def _bind(path: str) -> socket.socket:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError(f"{SOCKET_KEY} = {path!r}: directory {parent} does not exist; create it or set "
                          "socket to a path in the daemon's runtime directory (RuntimeDirectory= in the unit)")
    if len(os.fsencode(path)) >= 108:
        raise ConfigError(f"{SOCKET_KEY} = {path!r}: longer than a Unix socket path may be (107 bytes)")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"{SOCKET_KEY} = {path!r}: exists and is not a socket; remove it or choose another path")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise ConfigError(f"{SOCKET_KEY} = {path!r}: cannot check the existing socket ({exc.strerror})") from None
            os.unlink(path)  # left behind by a daemon that died
        else:
            raise ConfigError(f"{SOCKET_KEY} = {path!r}: another daemon is listening there; stop it or set "
                              "a different socket")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        # Anyone may attest their OWN process (the kernel says who they are); the
        # directory's mode decides who can reach the socket at all.
        os.chmod(path, 0o666)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{SOCKET_KEY} = {path!r}: cannot listen there ({exc.strerror})") from None
    return sock
