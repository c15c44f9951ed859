"""`from watchdog.store import X` must not name a store module that is also a re-exported table.

`watchdog.store` re-exports the tables `alerts`, `interventions`, `settings`... and has modules
of the same names. `from watchdog.store import interventions` binds whichever the package holds
at that moment: the Table, unless the module was imported before (importing it replaces the
package's attribute). So the name is a module or a Table depending on import order: a daemon
module imported first (a test, a tool) calls `interventions.grant_ok` on a Table. Such modules
are imported by their own path (`from watchdog.store.interventions import grant_ok`).
"""

from __future__ import annotations

import ast
import pathlib

import watchdog.store

PACKAGE = pathlib.Path(watchdog.store.__file__).parent.parent
STORE = pathlib.Path(watchdog.store.__file__).parent
# Modules being rewritten by another change of issue 21 that fixes this import there.
PENDING: set[str] = set()


def _ambiguous() -> set[str]:
    """Names that are both a store module and a name the package itself defines (re-exports)."""
    modules = {p.stem for p in STORE.glob("*.py") if p.stem != "__init__"}
    return modules & set(watchdog.store.__all__)


def test_the_ambiguous_names_are_known() -> None:
    # The check below means something only while such names exist.
    assert {"alerts", "interventions", "settings"} <= _ambiguous()


def test_no_module_imports_an_ambiguous_store_name_from_the_package() -> None:
    ambiguous = _ambiguous()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in PENDING:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "watchdog.store" and node.level == 0:
                found += [f"{rel}:{node.lineno}: {a.name}" for a in node.names if a.name in ambiguous]
    assert not found, "import these store modules by their own path:\n" + "\n".join(found)
