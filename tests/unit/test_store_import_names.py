"""`watchdog.store` re-exports no name that is also one of its modules.

It used to re-export the tables `alerts`, `interventions`, `settings`... beside modules of the same
names, so `from watchdog.store import interventions` bound the Table or the module depending on
which had been imported first: a daemon module imported on its own called `interventions.grant_ok`
on a Table. The tables are no longer re-exported (only the store imports `store.schema`); this
keeps any new re-export from shadowing a module again.
"""

from __future__ import annotations

import importlib
import pathlib

import watchdog.store

STORE = pathlib.Path(watchdog.store.__file__).parent


def test_no_re_export_shadows_a_store_module() -> None:
    modules = {p.stem for p in STORE.glob("*.py") if p.stem != "__init__"}
    assert modules, "the store's modules were not found"
    assert not modules & set(watchdog.store.__all__)
    assert not modules & {name for name in vars(watchdog.store) if not name.startswith("_")
                          and not isinstance(getattr(watchdog.store, name), type(watchdog))}


def test_the_package_names_a_module_the_same_way_in_any_import_order() -> None:
    # What went wrong: the name was a Table until the module itself had been imported.
    alerts = importlib.import_module("watchdog.store.alerts")
    from watchdog.store import alerts as via_package
    assert via_package is alerts and callable(alerts.enqueue_alert)


def test_the_design_map_names_every_store_module_and_no_other() -> None:
    # docs/explanation/design.md draws the store by what it stores (issue 34): the map follows the tree.
    design = (STORE.parents[1] / "docs" / "explanation" / "design.md").read_text()
    figure = design.split("\nwatchdog/store/\n", 1)[1].split("```", 1)[0]
    named = {word for line in figure.splitlines() for word in line[:38].split()}
    assert named == {p.stem for p in STORE.glob("*.py") if p.stem != "__init__"}
