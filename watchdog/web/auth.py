"""Who may read the web view: an `--auth-file` of bearer tokens and htpasswd-style users.

One entry a line (`#` comments and blank lines ignored):

    TOKEN                                       a bearer token (`Authorization: Bearer TOKEN`), 16+ characters
    USER:$pbkdf2-sha256$ROUNDS$SALT$HASH        a user for basic authentication (a browser's login prompt)

The password hash is PBKDF2-HMAC-SHA256 in passlib's `pbkdf2_sha256` format (salt and hash in
its adapted base64), so the standard library verifies it and passlib or `agent-watchdog web
--hash-password` makes one. bcrypt/apr1/{SHA} lines (nginx's htpasswd) are refused by name: the
standard library cannot verify bcrypt, and {SHA}/crypt are too weak or deprecated.

The file holds secrets: it must not be readable or writable by other users (the view refuses
to start otherwise). Tokens and passwords are compared in constant time and never logged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

SCHEME = "pbkdf2-sha256"
ROUNDS = 600_000  # OWASP's 2023 figure for PBKDF2-HMAC-SHA256: ~0.3 s a verification on one core
MIN_ROUNDS = 10_000  # below it a stolen file falls to a dictionary in minutes
MIN_TOKEN_CHARS = 16
REALM = "agent-watchdog"
CHALLENGE = f'Basic realm="{REALM}", charset="UTF-8"', f'Bearer realm="{REALM}"'
VERIFY_SLOTS = 2  # verifications at once: a flood of wrong passwords costs two cores' worth, not every thread's
VERIFIED_CACHE = 256  # credentials verified once (a browser sends them with every request, each 5 s)


class AuthFileError(ValueError):
    """The auth file is unusable: one line naming the path and the fix."""


def _ab64_encode(raw: bytes) -> str:
    return base64.b64encode(raw).decode().rstrip("=").replace("+", ".")


def _ab64_decode(text: str) -> bytes:
    text = text.replace(".", "+")
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def hash_password(password: str, *, rounds: int = ROUNDS) -> str:
    """A `$pbkdf2-sha256$ROUNDS$SALT$HASH` line part for `password` (passlib-compatible)."""
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, rounds)
    return f"${SCHEME}${rounds}${_ab64_encode(salt)}${_ab64_encode(digest)}"


@dataclass(frozen=True)
class _Hash:
    rounds: int
    salt: bytes
    digest: bytes

    @classmethod
    def parse(cls, text: str, min_rounds: int = MIN_ROUNDS) -> "_Hash":
        parts = text.split("$")
        if len(parts) != 5 or parts[0] != "" or parts[1] != SCHEME:
            raise ValueError("not $pbkdf2-sha256$ROUNDS$SALT$HASH")
        rounds = int(parts[2])
        if rounds < min_rounds:
            raise ValueError(f"{rounds} rounds: give at least {min_rounds}")
        return cls(rounds, _ab64_decode(parts[3]), _ab64_decode(parts[4]))

    def matches(self, password: bytes) -> bool:
        return hmac.compare_digest(hashlib.pbkdf2_hmac("sha256", password, self.salt, self.rounds), self.digest)


# An unknown user costs one verification too: response times do not tell which users exist.
_DUMMY = _Hash(ROUNDS, b"\0" * 16, b"\0" * 32)


@dataclass
class Credentials:
    tokens: tuple[bytes, ...] = ()  # their sha256 digests
    users: dict[str, _Hash] = field(default_factory=dict)
    # Keyed by an HMAC of the header under a key of this process: the cache holds no secret.
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _verified: OrderedDict[bytes, str] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # the server's threads share the cache
    _slots: threading.BoundedSemaphore = field(default_factory=lambda: threading.BoundedSemaphore(VERIFY_SLOTS))

    def __len__(self) -> int:
        return len(self.tokens) + len(self.users)

    def check(self, header: str | None) -> str | None:
        """Who the `Authorization` header authenticates ("token", or the user), else None."""
        if not header:
            return None
        scheme, _, value = header.strip().partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer":
            return "token" if self._token(value.encode()) else None
        if scheme.lower() != "basic":
            return None
        seen = hmac.new(self._key, header.encode("utf-8", "replace"), "sha256").digest()
        with self._lock:
            who = self._verified.get(seen)
            if who is not None:
                self._verified.move_to_end(seen)
                return who
        who = self._basic(value)  # outside the lock: one slow verification never holds the others
        if who is not None:
            with self._lock:
                self._verified[seen] = who
                while len(self._verified) > VERIFIED_CACHE:
                    self._verified.popitem(last=False)
        return who

    def _token(self, given: bytes) -> bool:
        # Digests of equal length (compare_digest's time would tell a token's length), every one
        # compared: the time does not say which one nearly matched.
        seen = hashlib.sha256(given).digest()
        ok = False
        for token in self.tokens:
            ok |= hmac.compare_digest(seen, token)
        return ok

    def _basic(self, value: str) -> str | None:
        try:
            user, sep, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
        except ValueError:
            return None
        known = self.users.get(user) if sep else None
        with self._slots:
            ok = (known or _DUMMY).matches(password.encode())
        return user if ok and known is not None else None


# Others may not read it (the secrets) nor write it (a token of their own); the group may read it.
OPEN_BITS = stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH


def check_private(path: Path) -> os.stat_result:
    """The file's stat, unless others may read or change it: other users (mode), the group (write),
    or an owner who is neither this user nor root. Not a regular file: refused too."""
    try:
        st = path.stat()
    except OSError as exc:
        raise AuthFileError(f"--auth-file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise AuthFileError(f"--auth-file {path}: not a regular file")
    if st.st_mode & OPEN_BITS:
        raise AuthFileError(f"--auth-file {path} is accessible to other users (mode {stat.S_IMODE(st.st_mode):04o}): "
                            f"run `chmod g-w,o-rw {path}` (600, or 640 for a group that may read it)")
    if st.st_uid not in (os.getuid(), 0):
        raise AuthFileError(f"--auth-file {path} belongs to uid {st.st_uid}, who may rewrite it: "
                            f"`chown {os.getuid()} {path}` (or root)")
    return st


def load(path: Path) -> Credentials:
    """The credentials of `path`; AuthFileError (naming the line, never its secret) if unusable."""
    check_private(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthFileError(f"--auth-file {path}: cannot read it ({exc})") from None
    tokens: list[bytes] = []
    users: dict[str, _Hash] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"--auth-file {path} line {number}"
        if ":" in line:
            user, _, hashed = line.partition(":")
            if not user:
                raise AuthFileError(f"{where}: USER:HASH with no user")
            try:
                users[user] = _Hash.parse(hashed)
            except ValueError as exc:
                raise AuthFileError(f"{where} (user {user!r}): the password hash must be $pbkdf2-sha256$…: "
                                    f"{exc}; make one with `agent-watchdog web --hash-password`") from None
        elif any(c.isspace() for c in line) or len(line) < MIN_TOKEN_CHARS:
            raise AuthFileError(f"{where}: a token is one word of at least {MIN_TOKEN_CHARS} characters "
                                "(e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
        else:
            tokens.append(hashlib.sha256(line.encode()).digest())
    creds = Credentials(tuple(tokens), users)
    if not len(creds):
        raise AuthFileError(f"--auth-file {path}: no token and no user in it")
    return creds
