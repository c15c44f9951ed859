"""tools/merge_modules.py (issue 34) on small modules of a made-up package: what one merge writes and
how it rewrites a caller, and the collisions it refuses. Pure: strings in, strings out (the tool's
git steps and self-check are not run here; the last commit of its branch is their proof)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "tools" / "merge_modules.py"
_SPEC = importlib.util.spec_from_file_location("merge_modules", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
mm = importlib.util.module_from_spec(_SPEC)
sys.modules["merge_modules"] = mm
_SPEC.loader.exec_module(mm)

PKG = "fakepkg.wing"
QUEUE = '''"""The queue: soonest first."""

from __future__ import annotations

import heapq
import logging
from typing import TYPE_CHECKING

from fakepkg.wing import clockwork

if TYPE_CHECKING:
    from fakepkg.other import Ctx

log = logging.getLogger("fake.queue")
_SIZE = 3


def push(q: list[int], x: int, ctx: Ctx) -> None:
    heapq.heappush(q, clockwork.now() + x + _SIZE)
'''
CLOCKWORK = '''"""The clock of the queue."""

from __future__ import annotations

import logging

log = logging.getLogger("fake.clock")
_SIZE = 9


def now() -> int:
    from fakepkg.wing.queue import push  # a late import of a sibling: dropped, the name is local now
    return _SIZE if push else 0
'''
CALLER = '''"""Uses both."""

from fakepkg.wing import clockwork, queue
from fakepkg.wing.clockwork import now as clock_now

# fakepkg/wing/clockwork.py and wing.clockwork.now are named in text too
X = queue.push, clockwork.now(), clock_now, "fakepkg.wing.clockwork:now"


def f(clockwork_param: int) -> object:
    return {"mod": clockwork}
'''


def _merge(first: str = QUEUE, second: str = CLOCKWORK) -> tuple[str, dict[tuple[str, str], str]]:
    sib = {"queue", "clockwork"}
    parts = [mm.read_part(PKG, "queue", sib, first), mm.read_part(PKG, "clockwork", sib, second)]
    return mm.merge_group(mm.Group(PKG, "queue", "The queue and its clock.", ["queue", "clockwork"]), parts)


def test_a_merge_orders_the_parts_drops_sibling_imports_and_renames_what_collides() -> None:
    text, renamed = _merge()
    assert text.startswith('"""The queue and its clock.\n\nThe clock of the queue.\n\nThe queue: soonest first.')
    assert text.index("def now()") < text.index("def push(")  # queue imports clockwork: the clock first
    assert "fakepkg.wing import" not in text and "fakepkg.wing.queue import" not in text
    assert "clockwork.now()" not in text and "now() + x" in text
    assert text.count("from __future__ import annotations") == 1 and text.count("import logging") == 1
    assert "if TYPE_CHECKING:\n    from fakepkg.other import Ctx\n" in text
    # two log channels kept apart, a private name renamed in its own part only (the later one's, by GROUPS)
    assert renamed == {(f"{PKG}.clockwork", "log"): "_clockwork_log", (f"{PKG}.clockwork", "_SIZE"): "_clockwork_SIZE"}
    assert 'log = logging.getLogger("fake.queue")' in text
    assert '_clockwork_log = logging.getLogger("fake.clock")' in text
    assert "now() + x + _SIZE" in text and "return _clockwork_SIZE if push else 0" in text
    compile(text, "merged.py", "exec")


def test_a_caller_is_rewritten_imports_uses_and_mentions() -> None:
    moved = {f"{PKG}.clockwork": f"{PKG}.queue"}
    out = mm.rewrite_python(Path("/elsewhere/caller.py"), CALLER, moved, {})
    assert "from fakepkg.wing import queue\n" in out
    assert "from fakepkg.wing.queue import now as clock_now" in out
    assert "X = queue.push, queue.now(), clock_now" in out
    assert '"fakepkg.wing.queue:now"' in out and "# fakepkg/wing/queue.py and wing.queue.now" in out
    assert 'return {"mod": queue}' in out  # the module as a value follows it too


def test_two_imports_the_renames_made_of_one_module_are_joined() -> None:
    moved = {f"{PKG}.clockwork": f"{PKG}.queue"}
    src = ("from fakepkg.wing import clockwork\nfrom fakepkg.wing import queue, other\n"
           "from fakepkg.wing.queue import push\nfrom fakepkg.wing.clockwork import now  # why\n\n"
           "X = clockwork.now, queue, other, push, now\n")
    out = mm.rewrite_python(Path("/elsewhere/caller.py"), src, moved, {})
    assert out == ("from fakepkg.wing import queue, other\nfrom fakepkg.wing.queue import push\n"
                   "from fakepkg.wing.queue import now  # why\n\nX = queue.now, queue, other, push, now\n")


def test_a_caller_that_binds_the_new_name_keeps_the_old_one_as_an_alias() -> None:
    moved = {f"{PKG}.clockwork": f"{PKG}.queue"}
    src = "from fakepkg.wing import clockwork\n\n\ndef g(queue):\n    return clockwork.now(), queue.pop()\n"
    out = mm.rewrite_python(Path("/elsewhere/caller.py"), src, moved, {})
    assert "from fakepkg.wing import queue as clockwork\n" in out
    assert "return clockwork.now(), queue.pop()" in out


def test_two_public_names_or_an_import_against_a_definition_stop_the_merge() -> None:
    with pytest.raises(SystemExit, match="collides with .*RENAMES"):
        _merge(second=CLOCKWORK.replace("def now()", "def push()"))
    with pytest.raises(SystemExit, match="imports 'push', which"):
        _merge(second=CLOCKWORK.replace("import logging\n", "import logging\nfrom elsewhere import push\n"))
    with pytest.raises(SystemExit, match="binds 'heapq'"):
        _merge(second=CLOCKWORK.replace("import logging\n", "import logging\nfrom elsewhere import heapq\n"))


def test_the_lists_of_pyproject_lose_the_duplicates_the_renames_made() -> None:
    src = 'module = ["a.x", "a.y",\n          "a.x", "a.z"]\nother = ["a.x"]\n'
    assert mm._dedupe_toml_lists(src) == 'module = ["a.x", "a.y",\n          "a.z"]\nother = ["a.x"]\n'


def test_the_store_map_of_the_design_page_follows_the_merge() -> None:
    page = ("x\n\nfakepkg/shelf/\n  run_rows  stops  ladder  pause      runs; stops\n"
            "  scan  changes  isolated  trace      reads\n```\n")
    moved = {"fakepkg.shelf.stops": "fakepkg.shelf.run_rows", "fakepkg.shelf.isolated": "fakepkg.shelf.scan"}
    out = mm._figures(page, moved, {"fakepkg/shelf/": "fakepkg.shelf"})
    assert "  run_rows  ladder  pause             runs; stops\n" in out
    assert "  scan  changes  trace                reads\n" in out
