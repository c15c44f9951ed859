"""The per-record Python work of the SDK, made cheaper without changing what it produces: the
arguments' canonical JSON (a prebuilt encoder) and the tool names already found valid."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math

import pytest

from watchdog.core.lifecycle import TOOL_MAX_CHARS, _CANONICAL, canonical_json, hash_args
from watchdog.sdk import run as sdk_run

VALUES = [
    {"q": 1}, {"b": [1, 2.5, None, True, False], "a": {"z": 1, "y": "x"}}, "text", 7, -0.0, None, [], {},
    {"k": 1e300, "é": "ü\u2028\x00", "emoji": "\U0001f600"}, [[[[{"deep": [1]}]]]],
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_the_fast_canonical_json_is_the_checking_encoders_text(value):
    assert canonical_json(value) == _CANONICAL.encode(value)
    reference = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert canonical_json(value) == reference
    assert hash_args(value) == hashlib.sha256(reference.encode("utf-8")).hexdigest()


@pytest.mark.parametrize("bad, message", [
    ({"x": math.nan}, "Out of range float values are not JSON compliant"),
    ({"x": object()}, "Object of type object is not JSON serializable"),
    ({1: 2, "1": 3}, "'<' not supported between instances of 'str' and 'int'"),
])
def test_what_cannot_be_hashed_is_refused_with_the_same_message(bad, message):
    with pytest.raises(ValueError) as caught:
        hash_args(bad, tool="search")
    assert str(caught.value) == f"args of tool 'search': expected JSON-serialisable values ({message})"


def test_circular_arguments_are_still_a_value_error_not_a_recursion_error():
    looped: list[object] = []
    looped.append(looped)
    with pytest.raises(ValueError, match=r"Circular reference detected"):
        hash_args({"a": looped}, tool="search")


def test_a_valid_tool_name_is_checked_once_and_an_invalid_one_every_time():
    name = "search-unit-test-name"
    sdk_run._VALID_TOOLS.discard(name)
    sdk_run._valid_tool(name)
    assert name in sdk_run._VALID_TOOLS
    for bad in ("two\nlines", "", " ", "x" * (TOOL_MAX_CHARS + 1), 42, None):
        with pytest.raises(ValueError):
            sdk_run._valid_tool(bad)
        assert bad not in sdk_run._VALID_TOOLS


def test_a_str_subclass_is_validated_but_never_remembered():
    class Sneaky(str):
        pass

    sdk_run._valid_tool(Sneaky("sneaky-subclass"))
    assert "sneaky-subclass" not in sdk_run._VALID_TOOLS


@pytest.mark.parametrize("epoch_ns", [
    0, 999_999, 1_000_000_000, 1_764_806_399_999_999_999, 1_764_806_400_000_000_000, 1_764_806_400_000_001_000,
    951_782_400_123_456_789,  # 2000-02-29
    4_102_444_799_999_999_000,  # the last microsecond of 2099
])
def test_the_sqlite_time_of_a_record_is_the_table_contracts_text(epoch_ns):
    from watchdog.store.dialects import for_name

    d = for_name("sqlite")
    expected = d.ts(dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=epoch_ns // 1000))
    assert d.ts_of_ns(epoch_ns) == expected
    assert d.ts_of_ns(epoch_ns) == expected  # again, from the cached second


def test_the_sqlite_time_now_falls_between_two_readings_of_the_clock():
    from watchdog.store.dialects import for_name

    d = for_name("sqlite")
    before = d.ts(dt.datetime.now(dt.timezone.utc))
    now = d.seen_now()
    after = d.ts(dt.datetime.now(dt.timezone.utc))
    assert before <= now <= after and len(now) == 26
