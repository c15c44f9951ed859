"""Review (hostile): a writer's text in the postmortem cannot become a link through GFM's extended
autolinks, which need neither `<>` nor a scheme (GitHub Flavored Markdown spec, 6.9): `www.`
followed by a domain, and an email address (also after `mailto:` / `xmpp:`). `md_text` defanged
schemes and the top-level domains it knows, so `www.evil.ninja/login` and `ops@evil.ninja` were
left as they are: clickable where the report is rendered (GitHub, GitLab, most viewers)."""

from __future__ import annotations

import re

import pytest

from watchdog.core.text import md_text

# The spec's two scheme-less triggers, as a renderer scans the text (escapes removed first).
GFM_WWW = re.compile(r"(?:^|[\s*_~(])www\.[\w-]+(?:\.[\w-]+)*", re.I)
GFM_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


def _as_rendered(md: str) -> str:
    return re.sub(r"\\(.)", r"\1", md)  # a backslash escape reads as the character itself


@pytest.mark.parametrize("text", ["go to www.evil.ninja/login now", "WWW.Evil.Ninja", "(www.x-y.example)",
                                  "write to ops@evil.ninja", "mailto:ops@evil.ninja", "xmpp:bot@chat.evil.ninja"])
def test_a_writers_text_is_no_gfm_autolink(text):
    shown = _as_rendered(md_text(text))
    assert not GFM_WWW.search(shown) and not GFM_EMAIL.search(shown), shown
    assert "evil" in shown.lower() or "x-y" in shown  # still readable


def test_a_tools_dotted_name_reads_as_it_is():
    assert md_text("search.read") == "search.read"


@pytest.mark.parametrize("text", ["www.evil.ninja", "evil.ninja/login", "a.b.evil.ninja/reset?u=1"])
def test_an_alerts_marked_field_links_no_host_a_chat_app_would_link(text: str) -> None:
    """Chat apps (Slack, Teams) link a `www.` word or a dotted host before a path, known TLD or not."""
    from watchdog.core.text import marked

    out = marked(text)
    assert "www." not in out and "evil.ninja" not in out and "b.evil" not in out, out


def test_a_tools_dotted_name_and_a_number_stay_as_they_are() -> None:
    from watchdog.core.text import marked

    assert marked("fs.read_file") == "«fs.read_file»" and marked("1.5/2") == "«1.5/2»"
