"""The daemon's sealing key: 32 random bytes in a file only the daemon can read.

Created 0600 at the first start (O_EXCL: two daemons starting at once cannot
both write one), refused at start when anyone but its owner could read or
replace it: a key another user can read lets that user forge an attestation.
"""

from __future__ import annotations

import os
import secrets
import stat

from watchdog.errors import ConfigError

KEY_BYTES = 32
KEY_HEX_CHARS = 2 * KEY_BYTES
KEY_FILE_KEY = "[daemon] key_file"


def load_or_create(path: str) -> bytes:
    """The key in `path`, created there if the file does not exist yet."""
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ConfigError(f"{KEY_FILE_KEY} = {path!r}: directory {parent} does not exist; create it (owned by the "
                          "daemon's user, mode 0700) or set key_file to a file in the daemon's state directory")
    key = secrets.token_hex(KEY_BYTES)
    # Written whole under a private name, then linked into place: link() fails if the key
    # exists, so two daemons started at once agree on one key, and neither ever reads a key
    # file the other is still writing (an O_EXCL create of `path` itself would show it empty).
    tmp = os.path.join(parent, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise ConfigError(f"{KEY_FILE_KEY} = {path!r}: cannot create the sealing key ({exc.strerror}); "
                          "the daemon's user must own the directory") from None
    try:
        try:
            os.fchmod(fd, 0o600)  # whatever the umask said
            os.write(fd, (key + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return _read(path)  # another daemon won the race: use its key
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return bytes.fromhex(key)


def load_existing(path: str) -> bytes | None:
    """The daemon's key for someone acting as the daemon (`sudo -u agent-watchdog agent-watchdog
    kill`, or root): None when this user cannot read it (then nothing it writes is sealed). Never
    creates. Root may read the key of a daemon running as its own user: root can act as that
    user anyway; the file must still be private to its owner."""
    try:
        return _read(path, any_owner=os.geteuid() == 0)
    except (FileNotFoundError, ConfigError):
        return None


def _read(path: str, any_owner: bool = False) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ConfigError(f"{KEY_FILE_KEY} = {path!r}: cannot read the sealing key ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{KEY_FILE_KEY} = {path!r}: not a regular file")
        if st.st_uid != os.geteuid() and not any_owner:
            raise ConfigError(f"{KEY_FILE_KEY} = {path!r}: owned by uid {st.st_uid}, not by the daemon's user "
                              f"(uid {os.geteuid()}); remove it and let the daemon create its own")
        if st.st_mode & 0o077:
            raise ConfigError(f"{KEY_FILE_KEY} = {path!r}: mode {stat.S_IMODE(st.st_mode):04o} lets other users "
                              f"read or change the sealing key; chmod 0600 {path} (and restart the daemon)")
        text = os.read(fd, 4 * KEY_HEX_CHARS).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < KEY_BYTES:
        raise ConfigError(f"{KEY_FILE_KEY} = {path!r}: not a sealing key ({KEY_HEX_CHARS} hex digits expected); "
                          "remove the file and let the daemon create a new one")
    return key
