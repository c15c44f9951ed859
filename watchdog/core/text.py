"""Small text rules every surface shares: how a URL is shown without its secret, how a
duration reads. Pure."""

from __future__ import annotations

import re

_SCHEME = re.compile(r"([A-Za-z][\w+.-]*)://")


def url_scheme_only(url: object) -> str:
    """An alert URL as `slack://…`: everything after an apprise scheme may be a secret."""
    m = _SCHEME.match(url) if isinstance(url, str) else None
    return f"{m[1]}://…" if m else "…"


def url_without_password(url: str | None) -> str | None:
    """A store URL fit for a terminal or a log: `scheme://user:***@host/db`, no query string
    (it may carry a password too). Works on URLs no parser accepts."""
    if not url:
        return url
    m = _SCHEME.match(url)
    if not m:
        return "(unparsable URL)"
    rest = url[m.end():].split("?", 1)[0]
    auth, at, hostpart = rest.rpartition("@")
    if at:
        user = auth.split(":", 1)[0]
        rest = f"{user}:***@{hostpart}" if ":" in auth else f"{user}@{hostpart}"
    return f"{m[1]}://{rest}"


def duration(seconds: float | None) -> str:
    """`45s`, `12m05s`, `3h20m`: short enough for a table column."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069]+")


def one_line(text: object, limit: int = 200) -> str:
    """Text from the store (a name any writer chose) fit for one line of an alert or a log:
    control and bidi characters become one space, and it is cut at `limit` with a marker."""
    s = _UNPRINTABLE.sub(" ", text if isinstance(text, str) else repr(text)).strip()
    return s if len(s) <= limit else s[: max(0, limit - 1)] + "…"


_TERMINAL_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069]+")


def terminal_safe(text: str) -> str:
    """A text the CLI prints whose lines and tabs stay, but no escape sequence (ANSI colours, an
    OSC 8 link, a screen clear) nor bidi control of a writer's name reaches the terminal."""
    return _TERMINAL_UNSAFE.sub(" ", text)


def printable(text: str) -> bool:
    """No control, line-break or bidi characters: fit to be a name on one line."""
    return _UNPRINTABLE.search(text) is None
