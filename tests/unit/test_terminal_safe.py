"""A writer's names never carry an escape sequence to the operator's terminal (review of issue 32
item 8): `runs`, `show`, `top`, `budgets` and `postmortem` print names any store writer chose."""

from __future__ import annotations

from watchdog.cli import render
from watchdog.core.text import terminal_safe

EVIL = "bot\x1b[2J\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\\u202etxt\nStopped by operator"


def test_terminal_safe_keeps_lines_and_drops_escapes_and_bidi():
    out = terminal_safe(f"line one\n\t{EVIL}")
    assert "\x1b" not in out and "\u202e" not in out
    assert out.startswith("line one\n\t") and "click" in out


def test_a_record_is_one_line_per_name_before_it_is_laid_out():
    rec = render.clean({"agent": EVIL, "labels": {"k": EVIL}, "tools": [EVIL], "steps": 3})
    assert isinstance(rec, dict) and rec["steps"] == 3
    for text in (rec["agent"], rec["labels"]["k"], rec["tools"][0]):
        assert "\x1b" not in text and "\n" not in text and "\u202e" not in text
