"""How long an alert's title and body may be, and what a title may contain. Pure.

Alerts are composed from store strings (an agent's name, a tool's, an error): a title
with a newline or a terminal escape in it would forge a second line in a pager, a mail
subject or a log. So a title is one printable line; a body keeps its lines but no other
control characters. Both are bounded, and a cut is visible: a human reading a truncated
alert must know there was more.
"""

from __future__ import annotations

import unicodedata

MAX_TITLE_CHARS = 300
MAX_BODY_CHARS = 4000
TITLE_MARKER = " …[truncated]"
BODY_MARKER = "\n…[truncated: the full text is in the store]"


def _printable(ch: str, keep: str) -> str:
    if ch in keep:
        return ch
    # Cc (controls, newlines), Cf (bidi overrides, zero-width), Cs/Co/Cn: never shown as is.
    return " " if unicodedata.category(ch).startswith(("C", "Z")) and ch != " " else ch


def bound(text: str, max_chars: int, marker: str) -> str:
    if len(text) <= max_chars:
        return text
    return text[: max_chars - len(marker)].rstrip() + marker  # rstrip: bounding twice changes nothing


def alert_title(title: object) -> str:
    """One printable line of at most MAX_TITLE_CHARS (idempotent: a bounded title is unchanged)."""
    text = "".join(_printable(ch, "") for ch in str(title))
    return bound(" ".join(text.split()), MAX_TITLE_CHARS, TITLE_MARKER)


def alert_body(body: object) -> str:
    """Lines of printable text, at most MAX_BODY_CHARS (idempotent)."""
    text = str(body).replace("\r\n", "\n")
    text = "".join(_printable(ch, "\n\t") for ch in text)
    return bound(text, MAX_BODY_CHARS, BODY_MARKER)
