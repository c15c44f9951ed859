"""The hook's client: stdin to the resident helper, its answer to stdout / stderr / exit status.

Stdlib only (os, sys, socket, json): this is what a coding CLI pays per tool call. The helper
(watchdog.gateways.hooks.resident) keeps the store's engine and the imports warm; it is one per
Unix user and store, started here on first use, and it exits after `IDLE_S` without a call.
When there is none yet, this call is answered in this process (the slow path, once) while the
helper starts for the next ones. `AGENT_WATCHDOG_HOOK_RESIDENT=0` turns the helper off.

The helper's socket is in a directory only this user can enter (checked: owner and mode), and
the helper answers only its own user (SO_PEERCRED): the answers and the runs are that user's.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys

from watchdog.gateways.hooks import sessionkey

ENV_RESIDENT = "AGENT_WATCHDOG_HOOK_RESIDENT"  # "0": no resident helper, every call in-process
ENV_IDLE_S = "AGENT_WATCHDOG_HOOK_IDLE_S"  # the helper's idle lifetime (default IDLE_S)
IDLE_S = 900.0
CONNECT_TIMEOUT_S = 1.0
ANSWER_TIMEOUT_S = 25.0  # under the hook timeout hook install writes (30 s)
MAX_INPUT_BYTES = 8 << 20  # a hook event with a huge tool_input (a file's text) is still one call
_ENV_KEYS = ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG")


def socket_dir() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return os.path.join(base, f"agent-watchdog-hook-{os.getuid()}")


def socket_path(argv: list[str], env: dict[str, str], environ: dict[str, str] | None = None) -> str:
    """One helper per store, config and session key (the CLI and agent are per call). `argv` and
    `env` as `resolved` made them: a relative path names a different file from another directory.
    `environ`: the caller's environment (default this process's), where the session key's path is."""
    key = json.dumps([_opt(argv, "--db"), _opt(argv, "--config")] + [env.get(k, "") for k in _ENV_KEYS]
                     + [sessionkey.key_path(environ), "" if _names_store(argv, env) else os.getcwd()])
    return os.path.join(socket_dir(), hashlib.sha256(key.encode()).hexdigest()[:16] + ".sock")


def _names_store(argv: list[str], env: dict[str, str]) -> bool:
    """The store is named here (--db, AGENT_WATCHDOG_DB), not by a config's [store] url (whose
    relative SQLite path is the working directory's: then that directory is in the key)."""
    return bool(_opt(argv, "--db") or env.get("AGENT_WATCHDOG_DB"))


def _abs_db(url: str) -> str:
    """A relative SQLite URL (`sqlite:///runs.db`) made absolute; any other URL as it is."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and not url[len(prefix):].startswith(":memory:") \
            and not url[len(prefix):].startswith("file:"):
        return prefix + os.path.abspath(url[len(prefix):])
    return url


def resolved(argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """argv and env with the store's and config's relative paths made absolute (this process's
    working directory): the resident helper serves calls from every directory."""
    out: list[str] = []
    rest = list(argv)
    while rest:
        a = rest.pop(0)
        name, sep, val = a.partition("=")
        if name in ("--db", "--config") and not sep and rest:
            out += [a, _fix(name, rest.pop(0))]
        elif name in ("--db", "--config") and sep:
            out.append(f"{name}={_fix(name, val)}")
        else:
            out.append(a)
    fixed = dict(env)
    if fixed.get("AGENT_WATCHDOG_DB"):
        fixed["AGENT_WATCHDOG_DB"] = _abs_db(fixed["AGENT_WATCHDOG_DB"])
    if fixed.get("AGENT_WATCHDOG_CONFIG"):
        fixed["AGENT_WATCHDOG_CONFIG"] = os.path.abspath(fixed["AGENT_WATCHDOG_CONFIG"])
    return out, fixed


def _fix(name: str, value: str) -> str:
    return _abs_db(value) if name == "--db" else os.path.abspath(value)


def _opt(argv: list[str], name: str) -> str:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return ""


def private_dir(path: str) -> bool:
    """The directory exists (made if missing), is this user's and nobody else's (0700)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    st = os.lstat(path)
    import stat

    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and (st.st_mode & 0o077) == 0


def _ask(path: str, request: bytes) -> dict | None:
    """The helper's answer, or None when there is no helper to ask (nothing was sent)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(CONNECT_TIMEOUT_S)
        try:
            s.connect(path)
        except OSError:
            return None
        s.settimeout(ANSWER_TIMEOUT_S)
        s.sendall(struct.pack("!I", len(request)) + request)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            got = s.recv(65536)
            if not got:
                break
            chunks.append(got)
        return json.loads(b"".join(chunks))
    finally:
        s.close()


def _start_helper(path: str) -> None:
    import subprocess

    try:
        # -P: never put the working directory (a cloned repo's json.py) first on sys.path.
        subprocess.Popen([sys.executable, "-P", "-m", "watchdog.gateways.hooks.resident", path],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
    except OSError:
        pass  # no helper: every call stays in-process


def _in_process(argv: list[str], raw: str) -> int:
    from watchdog.gateways.hooks.main import emit, parse_args, answer

    try:
        opts = parse_args(argv)
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    return emit(answer(opts, raw))


def run(argv: list[str]) -> int:
    """`agent-watchdog hook CLI [options]`: the exit status."""
    try:
        raw = sys.stdin.buffer.read(MAX_INPUT_BYTES).decode("utf-8", "replace")
    except OSError:
        raw = ""
    if os.environ.get(ENV_RESIDENT, "1") == "0" or not private_dir(socket_dir()):
        return _in_process(argv, raw)
    argv, env = resolved(argv, {k: os.environ[k] for k in _ENV_KEYS if k in os.environ})
    path = socket_path(argv, env)
    request = json.dumps({"argv": argv, "stdin": raw, "env": env}).encode()
    try:
        reply = _ask(path, request)
    except (OSError, ValueError) as exc:
        # Sent, but no answer: the call may be counted already, so it is not asked again.
        fail_closed = "--fail-closed" in argv
        sys.stderr.write(f"agent-watchdog: hook: the resident helper did not answer ({type(exc).__name__}); "
                         f"the call is {'refused' if fail_closed else 'let through'}\n")
        if fail_closed:
            from watchdog.gateways.hooks.main import refuse_unanswered

            return refuse_unanswered(argv)
        return 0
    if reply is None:
        _start_helper(path)
        return _in_process(argv, raw)
    if reply.get("stdout"):
        sys.stdout.write(reply["stdout"] + "\n")
        sys.stdout.flush()
    if reply.get("stderr"):
        sys.stderr.write(reply["stderr"])
    return int(reply.get("exit", 0))
