"""The typed spellings of the budget registry stay in step with it (watchdog.core.budgets).

`Budgets` (a profile) and `RunBudgets` (what `wd.run(...)` and `run.child(...)` accept) are
spelled out so that mypy checks every limit and every budget keyword; a budget added to
BUDGETS or SETTINGS without its typed field would be a keyword no type checker knows.
"""

import dataclasses
import inspect
import typing

from watchdog.core import budgets as bud
from watchdog.sdk.client import Watchdog
from watchdog.sdk.run import Run


def test_budgets_has_one_field_per_profile_key_in_order():
    assert tuple(f.name for f in dataclasses.fields(bud.Budgets)) == bud.PROFILE_KEYS


def test_budgets_defaults_are_the_registry_s():
    profile = bud.Budgets()
    for b in bud.BUDGETS:
        assert getattr(profile, b.key) == b.default, b.key
        assert type(getattr(profile, b.key)) is (int if b.integer else float), b.key
    for s in bud.SETTINGS:
        assert getattr(profile, s.key) == s.default, s.key


def test_budget_fields_are_typed_by_the_registry():
    hints = typing.get_type_hints(bud.Budgets)
    for b in bud.BUDGETS:
        assert hints[b.key] is (int if b.integer else float), b.key


def test_run_budgets_are_exactly_the_run_budgets_of_the_registry():
    hints = typing.get_type_hints(bud.RunBudgets)
    assert tuple(hints) == bud.RUN_BUDGET_KEYS
    assert not bud.RunBudgets.__required_keys__  # each may be left out: the profile's then
    for b in bud.RUN_BUDGETS:
        assert hints[b.key] == ((int if b.integer else float) | None), b.key


def test_the_sdk_takes_its_budget_keywords_from_run_budgets():
    # wd.run(**budgets) and run.child(**budgets) are typed by RunBudgets (Unpack), so the
    # TypedDict above is what mypy checks their keywords against.
    for fn in (Watchdog.run, Run.child):
        kwargs = inspect.signature(fn).parameters["budgets"]
        assert kwargs.kind is inspect.Parameter.VAR_KEYWORD
        assert kwargs.annotation == "Unpack[bud.RunBudgets]", fn.__qualname__
