"""The docs pages product code names (in messages people read, help texts, docstrings) exist.

The docs moved from one README into docs/ (index, quickstart, howto/, reference/, explanation/):
a message that sends an operator to `docs/install.md` or "README: Operator setup" sends them
nowhere. Pure: reads the package's source and the docs tree only.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "watchdog"
# `docs/howto/systemd.md`, optionally followed by the section it means: `, "Operator setup"`
DOC_REF = re.compile(r'(docs/[\w./-]+\.md)(?:, \\?"([^"\\]+)\\?")?')


def _references() -> list[tuple[str, int, str, str | None]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in DOC_REF.finditer(line):
                found.append((str(path.relative_to(ROOT)), lineno, m.group(1), m.group(2)))
    return found


def _headings(page: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in page.read_text(encoding="utf-8").splitlines()
            if line.startswith("#")]


def test_product_code_names_docs_pages():
    assert _references(), "no docs/ reference found: the pattern no longer matches how the code names pages"


def test_every_docs_page_named_in_product_code_exists():
    missing = [f"{where}:{lineno}: {page}" for where, lineno, page, _ in _references() if not (ROOT / page).is_file()]
    assert not missing, "pages named but not in docs/:\n" + "\n".join(missing)


def test_every_section_named_with_its_page_is_a_heading_of_it():
    wrong = []
    for where, lineno, page, section in _references():
        if section is None or not (ROOT / page).is_file():
            continue
        if not any(h.startswith(section) for h in _headings(ROOT / page)):
            wrong.append(f"{where}:{lineno}: {page} has no heading {section!r}")
    assert not wrong, "\n".join(wrong)


def test_no_message_sends_people_to_a_readme_section():
    # The README is a short overview now: what it used to explain lives in docs/.
    stale = [f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"README[:,] [A-Z]", line)]
    assert not stale, "\n".join(stale)
