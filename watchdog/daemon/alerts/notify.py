"""Alert delivery through apprise: one apprise object per URL, one result per target.

Secrets: a notify URL carries tokens and passwords, and apprise itself logs URLs:
at TRACE it dumps every parsed URL verbatim (password included), some plugins
echo rejected tokens in warnings, and socket errors can quote webhook paths. So
this module puts one filter on the "apprise" logger that drops TRACE records and
masks the secret parts of every configured URL; its own logs use privacy_url only.

Concurrency: each target is sent to in a lane of its own (watchdog.daemon.alerts.lanes), in our
own thread, never in apprise's shared pool: apprise abandons a late service but its pool
worker stays blocked, and a few hanging targets would starve every other delivery.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import math
import re
import threading
import time
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import apprise

from watchdog.core.text import url_scheme_only
from watchdog.daemon.alerts.lanes import Job, Lanes

if TYPE_CHECKING:
    from watchdog.core.config import Config

log = logging.getLogger("watchdog.notify")
_APPRISE_LOG = logging.getLogger(apprise.LOGGER_NAME)

_MASK = "****"
_MIN_SECRET_CHARS = 3  # shorter URL pieces ("no", "to") are not secrets; masking them mangles text
_MAX_REASON_CHARS = 300


@dataclass(frozen=True)
class Target:
    id: str  # sha256(url)[:12]: stored in the outbox, so never the URL itself
    privacy_url: str  # apprise's masked form: the only form that may be logged or shown


@dataclass(frozen=True)
class TargetResult:
    target: Target
    ok: bool
    error: str | None  # one line, secret-free


_lock = threading.Lock()
_registered: dict[object, frozenset[str]] = {}
_all_secrets: tuple[str, ...] = ()  # longest first: a secret's substring must not mask it partially


def _set_secrets(key: object, secrets: frozenset[str] | None) -> None:
    global _all_secrets
    with _lock:
        if secrets:
            _registered[key] = secrets
        else:
            _registered.pop(key, None)
        _all_secrets = tuple(sorted(set().union(*_registered.values()), key=len, reverse=True))


def _scrub(text: str, secrets: Sequence[str] | None = None) -> str:
    for secret in _all_secrets if secrets is None else secrets:
        text = text.replace(secret, _MASK)
    return text


def _url_pieces(url: str) -> set[str]:
    """Every piece of a URL that could be a credential: everything but schema and query keys."""
    rest = url.split("://", 1)[-1]
    base, _, query = rest.partition("?")
    pieces = re.split(r"[/:@#,\s]+", base)
    for pair in query.split("&"):
        pieces += re.split(r"[,\s]+", pair.partition("=")[2])
    return {p for raw in pieces for p in (raw, unquote(raw)) if len(p) >= _MIN_SECRET_CHARS}


def _secrets_of(url: str, privacy_url: str) -> frozenset[str]:
    # Whatever apprise chose to hide in its privacy form is, by apprise's own judgement, a secret.
    shown = privacy_url + " " + unquote(privacy_url)
    return frozenset(p for p in _url_pieces(url) if p not in shown)


class _AppriseLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.DEBUG:
            return False  # apprise's TRACE level exists to dump parsed URLs with their passwords
        secrets = _all_secrets
        if secrets:
            try:
                message = record.getMessage()
            except Exception:  # logging's error report would print the raw args
                message = "(unformattable apprise log message)"
            record.msg, record.args = _scrub(message, secrets), None
        return True


_FILTER = _AppriseLogFilter()


def _guard_apprise_log() -> None:
    """Install the secret filter on apprise's logger before we first use apprise (not at
    import: importing a module must not change global logging). A logger-level filter runs
    before every handler, apprise's own result capture included."""
    if _FILTER not in _APPRISE_LOG.filters:
        _APPRISE_LOG.addFilter(_FILTER)


class _ThreadWarnings(logging.Handler):
    """apprise WARNING+ messages from this thread: instantiate() has no result object to ask."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._thread = threading.get_ident()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self._thread:
            self.messages.append(record.getMessage())

    def __enter__(self) -> _ThreadWarnings:
        _APPRISE_LOG.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _APPRISE_LOG.removeHandler(self)


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 1] + "…"


def _load(url: str, asset: apprise.AppriseAsset | None = None) -> tuple[Any, str | None]:
    """(apprise plugin, None) or (None, one-line secret-free reason)."""
    _guard_apprise_log()
    if not isinstance(url, str) or not url.strip():
        return None, "empty URL"
    if not re.match(r"[A-Za-z][\w+.-]*://", url):
        return None, "not an apprise URL (expected schema://...)"
    key = object()
    # Until apprise says which pieces are secret, treat them all as secret.
    _set_secrets(key, frozenset(_url_pieces(url)))
    try:
        with _ThreadWarnings() as captured:
            try:
                plugin = apprise.Apprise.instantiate(url, asset=asset)
            except Exception as exc:  # a plugin bug must read as a bad URL, not crash config checks
                plugin = None
                captured.messages.insert(0, f"apprise raised {type(exc).__name__}")
    finally:
        _set_secrets(key, None)
    if plugin is None:
        # The first warning is the cause ("invalid token"); later ones are "could not load".
        reason = captured.messages[0] if captured.messages else "apprise cannot load this URL"
        return None, _one_line(_scrub(reason, sorted(_url_pieces(url), key=len, reverse=True)))
    return plugin, None


def url_error(url: str) -> str | None:
    """None if apprise can load `url`, else a one-line reason that never quotes a secret."""
    return _load(url)[1]


_NOTIFY_TYPES = {"failure": apprise.NotifyType.FAILURE, "warning": apprise.NotifyType.WARNING,
                 "info": apprise.NotifyType.INFO}


class Notifier:
    def __init__(self, urls: Sequence[str], timeout_s: float = 10.0, hard_limit_s: float | None = None):
        if isinstance(urls, str):
            raise TypeError("urls must be a sequence of URLs, not one string")
        if not (0 < timeout_s < math.inf):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self._timeout_s = float(timeout_s)
        self._entries: list[tuple[Target, apprise.Apprise]] = []
        self._by_id: dict[str, apprise.Apprise] = {}
        # A send past the hard limit is given up (dead-lettered for its target): by default
        # longer than its socket timeouts allow, so only a send that truly hangs reaches it.
        self.hard_limit_s = float(hard_limit_s) if hard_limit_s else self.wait_s
        self._lanes = Lanes(self._send_to, lambda target, why: TargetResult(target, False, why), self.hard_limit_s)
        # No apprise deadline: the send runs in the lane's thread, bounded by the socket timeouts below.
        asset = apprise.AppriseAsset(service_timeout=0)
        for index, url in enumerate(urls):
            plugin, reason = _load(url, asset)
            if plugin is None:
                raise ValueError(f"notify URL #{index} ({url_scheme_only(url)}): {reason}")
            target_id = hashlib.sha256(url.encode()).hexdigest()[:12]
            if any(t.id == target_id for t, _ in self._entries):
                continue  # the same URL twice would page the same human twice
            # notify(timeout=) only stops waiting; the worker lives until its socket times out.
            for attr in ("socket_connect_timeout", "socket_read_timeout"):
                current = getattr(plugin, attr, None)
                if isinstance(current, (int, float)) and current > self._timeout_s:
                    setattr(plugin, attr, self._timeout_s)
            privacy_url = _without_added_params(plugin.url(privacy=True), url)
            _set_secrets(target_id, _secrets_of(url, privacy_url))
            one = apprise.Apprise()
            one.add(plugin)
            self._entries.append((Target(target_id, privacy_url), one))
            self._by_id[target_id] = one

    @property
    def targets(self) -> list[Target]:
        return [target for target, _ in self._entries]

    @property
    def wait_s(self) -> float:
        """How long one send may take: connecting and reading, each bounded by timeout_s."""
        return 2 * self._timeout_s + 5.0

    def send(self, title: str, body: str, skip: Collection[str] = (), kind: str = "info") -> list[TargetResult]:
        """Deliver to every target not in `skip`, all at once; failures are results, never exceptions."""
        targets = [t for t, _ in self._entries if t.id not in skip]
        key = object()  # this send's own: never a result another caller is waiting for
        results = self.deliver({t: [(key, title, body, kind)] for t in targets}, time.monotonic() + self.wait_s)
        return [results[(key, t.id)] for t in targets]

    def deliver(self, work: Mapping[Target, Sequence[Job]], deadline: float) -> dict[tuple[Hashable, str], TargetResult]:
        """Each target's jobs (key, title, body) in its own lane, in order, until `deadline`
        (time.monotonic()); a result per (key, target id): lanes.PENDING for a send its lane has
        not finished yet (it goes on, and is never sent twice; watchdog.daemon.alerts.lanes)."""
        return self._lanes.run(work, deadline)

    def busy(self) -> list[str]:
        """Targets whose lane is still sending."""
        return self._lanes.busy()

    def _send_to(self, target: Target, title: str, body: str, kind: str = "warning") -> TargetResult:
        return self._send_one(target, self._by_id[target.id], title, body, kind)

    def _send_one(self, target: Target, ap: apprise.Apprise, title: str, body: str,
                  kind: str = "warning") -> TargetResult:
        error = None
        try:
            with _DeliveryLog() as cause, ap.notify(
                body=body,
                title=title,
                body_format=apprise.NotifyFormat.TEXT,
                notify_type=_NOTIFY_TYPES.get(kind, apprise.NotifyType.WARNING),  # watchdog.core.outcomes.notify_kind
            ) as outcome:
                # notify() returns an AppriseResult in apprise 2.x (a bool before): coerce.
                if not bool(outcome):
                    error = _first_warning(outcome) or "delivery failed"
                    if cause.reason and cause.reason.lower() not in error.lower():
                        error = f"{error.rstrip('.')} ({cause.reason})"
        except Exception as exc:  # apprise should not raise here, but the outbox loop must survive
            error = f"delivery failed: apprise raised {type(exc).__name__}"
        if error is None:
            return TargetResult(target, True, None)
        error = _one_line(_scrub(error))
        # DEBUG: callers (outbox, test-alert) report the result themselves.
        log.debug("alert to %s failed: %s", target.privacy_url, error)
        return TargetResult(target, False, error)


def _first_warning(outcome: apprise.AppriseResult) -> str | None:
    # apprise 2.x keeps each service's WARNING+ log lines in its result; they were
    # captured after our logger filter ran, so they are already masked.
    for entry in outcome.logs():
        level = logging.getLevelName(entry.level)  # "WARNING" -> 30
        if isinstance(level, int) and level >= logging.WARNING:
            return str(entry.message)
    return None


# The cause apprise logs only at DEBUG ("Socket Exception: ... [Errno 111] Connection refused"):
# the warning alone says "A Connection error occurred", which does not tell refused from unknown host.
_CAUSES = (re.compile(r"\[Errno -?\d+\] ([^\"'()\]\[]+)"), re.compile(r"((?:Read |Connect )?timed out)"),
           re.compile(r"(CERTIFICATE_VERIFY_FAILED|certificate verify failed[^\"'()]*)"),
           # smtplib's refusal: (550, b'5.7.1 relaying denied') -> "server said 550 5.7.1 relaying denied"
           re.compile(r"Socket Exception: \(((?:4|5)\d\d), b?['\"]([^'\"]*)"))


# Deliveries run in several lanes at once: the handler of a record is the delivery of the
# context that logged it, and apprise's logger is opened to DEBUG while any delivery runs.
_delivery: contextvars.ContextVar[_DeliveryLog | None] = contextvars.ContextVar("watchdog_delivery", default=None)
_open_lock = threading.Lock()
_open_count = 0
_host_view: tuple[int, bool, int, bool] | None = None  # (level, propagate, threshold, forced) before the first


class _DeliveryLog(logging.Handler):
    """While one delivery runs, apprise's records exist down to DEBUG: its result then holds
    the warning ("A Connection error occurred...") even when the host's logging silences
    apprise (the CLI sets it to CRITICAL), and this handler keeps the socket-level cause it
    logs at DEBUG ("[Errno 111] Connection refused"): only the cause's words, never the URL.
    What the host's logging did not ask for still reaches no handler of the host's."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reason: str | None = None
        self._token: contextvars.Token[_DeliveryLog | None] | None = None  # while entered

    def emit(self, record: logging.LogRecord) -> None:
        if _delivery.get() is not self:
            return  # another lane's delivery (or none): not ours to read or forward
        if self.reason is None:
            message = record.getMessage()
            for pattern in _CAUSES:
                m = pattern.search(message)
                if m:
                    words = " ".join(g for g in m.groups() if g).strip().rstrip(".")
                    self.reason = f"server said {words}" if len(m.groups()) == 2 else words
                    break
        view = _host_view
        if view is not None and view[3] and view[1] and record.levelno >= view[2]:
            parent = _APPRISE_LOG.parent  # what the host did ask for propagates as before
            if parent is not None:
                parent.handle(record)

    def __enter__(self) -> _DeliveryLog:
        global _open_count, _host_view
        self._token = _delivery.set(self)
        with _open_lock:
            if _open_count == 0:
                threshold = _APPRISE_LOG.getEffectiveLevel()
                forced = threshold > logging.DEBUG
                _host_view = (_APPRISE_LOG.level, _APPRISE_LOG.propagate, threshold, forced)
                if forced:
                    _APPRISE_LOG.setLevel(logging.DEBUG)
                    _APPRISE_LOG.propagate = False
            _open_count += 1
        _APPRISE_LOG.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        global _open_count, _host_view
        _APPRISE_LOG.removeHandler(self)
        with _open_lock:
            _open_count -= 1
            if _open_count == 0 and _host_view is not None:
                level, propagate, _threshold, forced = _host_view
                if forced:
                    _APPRISE_LOG.setLevel(level)
                    _APPRISE_LOG.propagate = propagate
                _host_view = None
        assert self._token is not None, "__exit__ without __enter__"
        _delivery.reset(self._token)


def _without_added_params(privacy_url: str, url: str) -> str:
    """apprise's privacy form without the query parameters apprise added itself (method=POST,
    overflow=upstream, retry=0, our timeouts...): what is shown is what the user wrote, masked."""
    base, sep, query = privacy_url.partition("?")
    if not sep:
        return privacy_url
    given = {pair.partition("=")[0].lower() for pair in url.partition("?")[2].split("&") if pair}
    kept = [pair for pair in query.split("&") if pair and pair.partition("=")[0].lower() in given]
    base = base.rstrip("/") if not kept and base.endswith("/") and not url.partition("?")[0].endswith("/") else base
    return base + ("?" + "&".join(kept) if kept else "")


def daemon_alert_urls(config: Config) -> tuple[str, ...]:
    """The daemon's alert URLs. A relative urls_file (the unit's credential) that a daemon started
    by hand cannot read is one error line, and alerts go to `[alerts] urls` only (issue 36): the
    daemon still stops runaways. Any other unreadable or invalid file stays fatal."""
    from watchdog.core.config import alert_urls, credential_by_hand
    from watchdog.errors import ConfigError

    try:
        return alert_urls(config, url_error=url_error)
    except ConfigError as exc:
        if not credential_by_hand(config):
            raise
        log.error("%s: a systemd credential read outside systemd; alerts go only to [alerts] urls (run the daemon "
                  "under its unit, or set urls_file to an absolute path this user can read)", exc)
        return tuple(config.alert_urls)
