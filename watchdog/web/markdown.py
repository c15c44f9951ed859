"""The postmortem's Markdown as HTML: only the subset watchdog.core.postmortem writes (headings,
lists, tables, one code block, **bold**, `code`, one image). Escaped first, then marked up."""

from __future__ import annotations

import re

from watchdog.web.html import esc

_BOLD = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")
_IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)\s]+)\)$")


def _inline(text: str) -> str:
    out = esc(text)
    out = _CODE.sub(r"<code>\1</code>", out)
    return _BOLD.sub(r"<strong>\1</strong>", out)


def to_html(md: str, *, image_src: str | None = None) -> str:
    """`image_src`: where the page serves the timeline the Markdown links (the file beside it)."""
    out: list[str] = []
    in_list = in_code = False
    table_rows: list[list[str]] = []
    code: list[str] = []

    def flush() -> None:
        nonlocal in_list
        if in_list:
            out.append("</ul>")
            in_list = False
        if table_rows:
            head, *body = table_rows
            out.append("<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
                       + "</tbody></table>")
            table_rows.clear()

    for line in md.splitlines():
        if line.startswith("```"):
            flush()
            if in_code:
                out.append("<pre><code>" + "\n".join(code) + "</code></pre>")
                code.clear()
            in_code = not in_code
            continue
        if in_code:
            code.append(esc(line))
            continue
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= {"-", ":"} for c in cells):
                table_rows.append(cells)
            continue
        if line.startswith("- "):
            if table_rows:
                flush()
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{_inline(line[2:])}</li>")
            continue
        flush()
        m = re.match(r"^(#{1,3}) (.*)$", line)
        img = _IMAGE.match(line)
        if m:
            n = len(m.group(1)) + 1  # the page has its own h1
            out.append(f"<h{n}>{_inline(m.group(2))}</h{n}>")
        elif img and image_src:
            out.append(f'<p><img src="{esc(image_src)}" alt="{esc(img.group(1))}"></p>')
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    flush()
    if in_code:
        out.append("<pre><code>" + "\n".join(code) + "</code></pre>")
    return "\n".join(out)
