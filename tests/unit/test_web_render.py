"""The pure pieces of the views: the SVG timeline (watchdog.core.timeline_svg) and the postmortem's
Markdown as HTML (watchdog.web.markdown). Hostile names stay text; the chart stays bounded."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET

from watchdog.core.timeline_svg import MAX_LANES, MAX_MARKS, OTHER, Call, Spend, render, repeat_runs
from watchdog.web.html import bar, closeness_colour
from watchdog.web.markdown import to_html

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
NS = "{http://www.w3.org/2000/svg}"
HOSTILE = '"><script>alert(1)</script><img src=x onerror=alert(2)>'


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def test_identical_calls_in_a_row_are_found_and_banded():
    calls = [Call(at(i), "verify_iban", True, "h1" if i < 3 else f"h{i}") for i in range(6)]
    assert repeat_runs(calls) == [(0, 2)]
    assert repeat_runs([Call(at(0), "a", True, None), Call(at(1), "a", True, None)]) == []  # no hash: unknown
    svg = ET.fromstring(render(calls, [], T0, at(10)))
    assert len(svg.findall(f".//{NS}rect[@class='repeat']")) == 1
    assert len(svg.findall(f".//{NS}circle[@class='call']")) == 6
    # The same arguments again with other calls between: ringed, not banded.
    apart = [Call(at(0), "t", True, "x"), Call(at(1), "t", True, "y"), Call(at(2), "t", False, "x")]
    svg = ET.fromstring(render(apart, [], T0, at(3)))
    (ring,) = svg.findall(f".//{NS}circle[@class='again']")
    assert ring.find(f"{NS}title").text == "same arguments as call 1" and not svg.findall(f".//{NS}rect[@class='repeat']")


def test_errors_cost_and_an_empty_run():
    calls = [Call(at(1), "t", False, "a"), Call(at(2), "t", True, "b")]
    svg = ET.fromstring(render(calls, [Spend(at(1), 0.5), Spend(at(2), 0.25)], T0, at(3)))
    assert len(svg.findall(f".//{NS}path[@class='error']")) == 1
    assert "0.7500 EUR" in ET.tostring(svg, encoding="unicode")
    many = render([], [Spend(at(i / 1000), 0.001) for i in range(20_000)], T0, at(20))
    assert many.count(",") < 3000  # one point per pixel column, not per step
    empty = render([], [], T0, T0)
    assert "no tool calls" in empty and ET.fromstring(empty) is not None


def test_hostile_tool_names_are_text_in_the_svg():
    svg = render([Call(at(1), HOSTILE, True, "a")], [], T0, at(2), title=HOSTILE)
    assert "<script" not in svg and "<img" not in svg
    root = ET.fromstring(svg)
    assert HOSTILE in "".join(root.itertext())  # the parsed document holds the name as text
    assert not root.findall(f".//{NS}script") and not root.findall(".//script")


def test_many_tools_share_a_lane_and_huge_runs_are_cut():
    calls = [Call(at(i), f"tool{i % 30}", True, str(i)) for i in range(MAX_MARKS + 50)]
    svg = render(calls, [], T0, at(MAX_MARKS + 60))
    lanes = [t for t in ET.fromstring(svg).iter(f"{NS}title")]
    assert any(t.text == OTHER for t in lanes)
    assert len([t for t in lanes if t.text and t.text[4:].isdigit()]) == MAX_LANES - 1
    assert f"(first {MAX_MARKS} shown)" in svg and svg.count('class="call"') == MAX_MARKS


def test_markdown_is_escaped_before_it_is_marked_up():
    html = to_html(f"# Postmortem: {HOSTILE}\n\n- **bold** `code` {HOSTILE}\n\n| a | b |\n|---|---|\n| {HOSTILE} | x |\n\n"
                   f"```python\nx = '{HOSTILE}'\n```\n\n![chart](t.svg)\n", image_src="/runs/r/timeline.svg")
    assert "<script" not in html and "<img src=x" not in html
    assert "<strong>bold</strong>" in html and "<code>code</code>" in html and "<table>" in html
    assert '<img src="/runs/r/timeline.svg" alt="chart">' in html and "<pre><code>x = " in html


def test_budget_bars_colour_by_closeness():
    assert closeness_colour(0.1) == "#43a047" and closeness_colour(0.7) == "#fb8c00"
    assert closeness_colour(0.9) == "#e53935" and closeness_colour(1.5) == "#b71c1c"
    assert 'width="90.0"' in bar(20, 10) and "20/10" in bar(20, 10)
    assert "2,000,000" in bar(5, 2_000_000) and "<svg" not in bar(5, None)
