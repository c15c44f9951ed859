"""The wall clock, always timezone-aware UTC: every side takes `now` from here (or is given it)."""

from __future__ import annotations

import datetime as dt


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)
