"""Start the command as exec's child, held at a gate until the supervisor lets it go.

Our own fork + exec instead of subprocess: the child must wait (blocked on a pipe) while the
supervisor moves it into the run's cgroup and attests the run, so no process of the command
ever runs outside its cgroup; and exec's failure (not found, not executable) must come back
as an errno so exec can exit 127 / 126 as timeout(1) does. Only async-signal-safe work
happens between fork and exec (os.* calls on file descriptors, no locks, no allocation of note).
"""

from __future__ import annotations

import errno
import os
import signal
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The signals the supervisor blocks to wait for them synchronously; the child gets them back.
SUPERVISED_SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_ERRNO = struct.Struct("i")
_LENGTH = struct.Struct("I")
EXTRA_ENV_MAX_BYTES = 1 << 20  # what the gate carries at most (the child reads it all before exec)
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127


@dataclass
class Child:
    pid: int
    _gate_w: int
    _err_r: int

    def release(self, extra_env: Mapping[str, str] | None = None) -> int | None:
        """Let the child exec the command, with `extra_env` over its environment (what exec
        learnt from the daemon after the fork: the run's OTLP token); the errno exec failed
        with, or None once it runs."""
        payload = b"\0".join(os.fsencode(k) + b"=" + os.fsencode(v) for k, v in (extra_env or {}).items())
        if len(payload) > EXTRA_ENV_MAX_BYTES:
            payload = b""
        try:
            data = b"g" + _LENGTH.pack(len(payload)) + payload
            while data:  # the child reads it all before it execs
                data = data[os.write(self._gate_w, data):]
        except OSError:
            pass  # the child is gone already: its status says why
        finally:
            os.close(self._gate_w)
        data = b""
        try:
            while len(data) < _ERRNO.size:
                chunk = os.read(self._err_r, _ERRNO.size - len(data))
                if not chunk:
                    break  # closed on exec (O_CLOEXEC): the command runs
                data += chunk
        finally:
            os.close(self._err_r)
        return _ERRNO.unpack(data)[0] if len(data) == _ERRNO.size else None

    def abandon(self) -> None:
        """exec failed before the command could start: the child exits without running it."""
        for fd in (self._gate_w, self._err_r):
            try:
                os.close(fd)
            except OSError:
                pass


def exit_status_for(err: int) -> int:
    """The exit status of a command exec(3) could not run, as timeout(1) and the shells say."""
    return EXIT_NOT_FOUND if err in (errno.ENOENT, errno.ENOTDIR) else EXIT_CANNOT_RUN


def start(argv: Sequence[str], env: Mapping[str, str]) -> Child:
    """Fork the child; it waits at the gate, then execs `argv` (searched on env's PATH)."""
    gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    args = [os.fsencode(a) for a in argv]
    env_b = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    candidates = _candidates(args[0], env.get("PATH", os.defpath))
    pid = os.fork()
    if pid == 0:  # the child: nothing here may raise out of it
        code = EXIT_CANNOT_RUN
        try:
            os.close(gate_w)
            os.close(err_r)
            if os.read(gate_r, 1) != b"g":
                os._exit(EXIT_CANNOT_RUN)  # the supervisor gave up on us
            extra = _read_exactly(gate_r, _LENGTH.size)
            size = _LENGTH.unpack(extra)[0] if len(extra) == _LENGTH.size else 0
            for pair in _read_exactly(gate_r, min(size, EXTRA_ENV_MAX_BYTES)).split(b"\0"):
                key, sep, value = pair.partition(b"=")
                if sep and key:
                    env_b[key] = value
            os.close(gate_r)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; the command must not
                signal.signal(sig, signal.SIG_DFL)
            for sig in SUPERVISED_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            first = None
            for path in candidates:
                try:
                    os.execve(path, args, env_b)
                except OSError as exc:
                    # As execvp: keep the first error other than "not here", else "not found".
                    if first is None or first in (errno.ENOENT, errno.ENOTDIR):
                        first = exc.errno
            os.write(err_w, _ERRNO.pack(first or errno.ENOENT))
            code = exit_status_for(first or errno.ENOENT)
        except BaseException:  # noqa: BLE001 — never return into the parent's code
            pass
        os._exit(code)
    os.close(gate_r)
    os.close(err_w)
    return Child(pid, gate_w, err_r)


def _read_exactly(fd: int, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _candidates(name: bytes, path_env: str) -> list[bytes]:
    if b"/" in name:
        return [name]
    dirs = [os.fsencode(d) or b"." for d in path_env.split(os.pathsep)]
    return [os.path.join(d, name) for d in dirs]
