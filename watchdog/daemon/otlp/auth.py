"""Who may report spans: bearer tokens, as the OpenTelemetry Collector's `bearertokenauth` checks them.

An exporter sends `Authorization: Bearer <token>` (any OTel SDK: `OTEL_EXPORTER_OTLP_HEADERS=
"Authorization=Bearer <token>"`). Two kinds of token are known:

- `[otlp] tokens_file`: one token per line, `TOKEN agent=NAME[,NAME...] [owner=WHO]` (`#` comments
  and blank lines allowed). A token reports only for the agents it names; its identity is `owner`
  (else `token <8 hex of its SHA-256>`), which is what its runs are booked under.
- a run's own token, derived by the daemon from its key and the run id (`aw1.<run>.<mac>`,
  watchdog.core.seal.Sealer.otlp_token) and handed to the run's attested process over the Unix
  socket (exec gives it to its command): it reports for that run only. Nothing is stored.

No token (or an unknown one) is refused (401) unless `[otlp] allow_anonymous = true`; an
anonymous sender is the socket's owner uid (`uid N`): its spans count only for runs it started
itself, judged by [defaults] whatever agent they claim. Tokens are compared in constant time
(every known token's digest, each with hmac.compare_digest) and never logged nor written anywhere.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
from dataclasses import dataclass

from watchdog.core.config import ENV_CREDENTIALS, Config
from watchdog.core.seal import Sealer
from watchdog.errors import ConfigError

log = logging.getLogger("watchdog.otlp")

TOKENS_KEY = "[otlp] tokens_file"
LINE_FORMAT = "<token> agent=NAME[,NAME...] [owner=WHO]"  # (worded so that the CLI's scrubbing keeps it)
TOKEN_MIN_CHARS = 16
TOKENS_MAX = 10_000
NAME_MAX_CHARS = 63  # an owner is booked like a PostgreSQL login (runs.owner is 63 characters)


@dataclass(frozen=True)
class Identity:
    """Who sent a request, as far as the receiver can check it."""

    name: str  # what its runs are booked under: a token's owner, "token <id>", "uid N" (anonymous)
    agents: frozenset[str] | None  # the agents it may report for; None: any (anonymous: judged by [defaults])
    run_id: str | None = None  # a run's own token: that run only
    anonymous: bool = False


def tokens_path(config: Config) -> str | None:
    """The tokens file as the daemon reads it: relative to $CREDENTIALS_DIRECTORY (systemd's
    LoadCredential=), else to the config's directory; None when no file is configured."""
    value = config.otlp.tokens_file
    if not value:
        return None
    if not os.path.isabs(value):
        base = os.environ.get(ENV_CREDENTIALS) or os.path.dirname(os.path.abspath(config.path or "."))
        value = os.path.join(base, value)
    return value


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def parse_tokens(text: str, where: str) -> list[tuple[bytes, Identity]]:
    """(digest, identity) per line; ConfigError (one line: the key, the line, the fix) for a bad one."""
    out: list[tuple[bytes, Identity]] = []
    seen: set[bytes] = set()

    def bad(n: int, why: str) -> ConfigError:
        return ConfigError(f"{TOKENS_KEY} ({where}) line {n}: {why}; expected `{LINE_FORMAT}` "
                           f"(a token of at least {TOKEN_MIN_CHARS} characters, e.g. from `openssl rand -hex 24`)")

    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        token, *fields = line.split()
        if len(token) < TOKEN_MIN_CHARS or "=" in token:
            raise bad(n, "the line does not begin with a token")
        if token.startswith("aw1."):
            raise bad(n, "tokens beginning with aw1. are the daemon's own")
        opts: dict[str, str] = {}
        for f in fields:
            key, sep, value = f.partition("=")
            if not sep or key not in ("agent", "owner") or not value or key in opts:
                raise bad(n, f"{f[:40]!r} is not agent=... or owner=... (each once)")
            opts[key] = value
        if "agent" not in opts:
            raise bad(n, "no agent=NAME: each line names the agents it may report for")
        agents = frozenset(a for a in opts["agent"].split(",") if a)
        owner = opts.get("owner")
        if owner is not None and len(owner) > NAME_MAX_CHARS:
            raise bad(n, f"owner is longer than {NAME_MAX_CHARS} characters")
        digest = _digest(token)
        if digest in seen:
            raise bad(n, "the same token is on an earlier line")
        seen.add(digest)
        out.append((digest, Identity(owner or f"token {digest.hex()[:8]}", agents)))
        if len(out) > TOKENS_MAX:
            raise bad(n, f"more than {TOKENS_MAX} tokens")
    return out


def load_tokens(config: Config) -> list[tuple[bytes, Identity]]:
    """The configured tokens (none without a file); ConfigError naming the key for a file that
    cannot be read or a bad line. A file other users can read is warned about (it holds secrets)."""
    path = tokens_path(config)
    if path is None:
        return []
    try:
        with open(path, encoding="utf-8") as f:
            st = os.fstat(f.fileno())
            text = f.read(4 * 1024 * 1024)
    except OSError as exc:
        raise ConfigError(f"{TOKENS_KEY} ({config.otlp.tokens_file}): cannot read {path} "
                          f"({exc.strerror or exc}); create it (mode 0600, the daemon's user) or empty the key "
                          "to take no file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{TOKENS_KEY} ({config.otlp.tokens_file}): {path} is not UTF-8 text") from None
    if st.st_mode & (stat.S_IROTH | stat.S_IWOTH):
        log.warning("%s (%s): %s is readable by every user (it holds bearer tokens): chmod 0600 it",
                    TOKENS_KEY, config.otlp.tokens_file, path)
    return parse_tokens(text, config.otlp.tokens_file)


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (the scheme case-insensitive)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class Authenticator:
    """The one check every route of the receiver applies (watchdog.daemon.otlp.server)."""

    def __init__(self, config: Config, sealer: Sealer | None) -> None:
        self._tokens = load_tokens(config)
        self._sealer = sealer
        self.allow_anonymous = config.otlp.allow_anonymous

    @property
    def tokens(self) -> int:
        return len(self._tokens)

    def identify(self, authorization: str | None, uid: int | None, address: str) -> tuple[Identity | None, str]:
        """(the sender's identity, "") or (None, why it is refused)."""
        token = bearer(authorization)
        if token is None:
            if authorization:
                return None, "the Authorization header is not `Bearer <token>`"
            if not self.allow_anonymous:
                return None, "no bearer token"
            who = f"uid {uid}" if uid is not None else f"address {address}"
            return Identity(who, None, anonymous=True), ""
        if token.startswith("aw1.") and self._sealer is not None:
            run_id = self._sealer.otlp_token_ok(token)
            if run_id is not None:
                return Identity(f"run {run_id}", None, run_id=run_id), ""
            return None, "an unknown run token"
        digest = _digest(token)
        found: Identity | None = None
        for known, ident in self._tokens:  # every one of them: the time says nothing of which matched
            if hmac.compare_digest(known, digest):
                found = ident
        return (found, "") if found is not None else (None, "an unknown bearer token")
