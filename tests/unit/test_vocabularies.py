"""The intervention actions and alert kinds are enums (watchdog.core.interventions,
watchdog.core.outcomes): every word the code writes is one of them, each kind's key builder
gives the key its urgency is read from, and the stored words never change spelling."""

from __future__ import annotations

import pathlib
import re

import pytest

from watchdog.core.outcomes import AlertKind, Urgency, notify_kind
from watchdog.core.interventions import ACTIONS, STOP_ACTIONS, Action

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "watchdog"
SOURCES = {p: p.read_text() for p in PACKAGE.rglob("*.py")}


def test_every_action_literal_written_is_an_action():
    written = set()
    for text in SOURCES.values():
        written |= set(re.findall(r"""action=["']([a-z_]+)["']""", text))
        written |= set(re.findall(r"""\.action == ["']([a-z_]+)["']""", text))
    assert written <= {a.value for a in Action}, written - {a.value for a in Action}


def test_the_schemas_list_of_actions_is_the_enum():
    schema = (PACKAGE / "store" / "schema.py").read_text()
    block = schema[schema.index('"interventions",'):schema.index('Column("action"')]
    comments = " ".join(line.split("#", 1)[1] for line in block.splitlines() if "#" in line)
    listed = set(re.findall(r"[a-z][a-z_]+", comments)) - {"these", "three", "with", "no", "run"}
    assert listed <= set(ACTIONS), listed - set(ACTIONS)


def test_every_alert_key_prefix_written_is_a_kind():
    words = set()
    for path, text in SOURCES.items():
        if "enqueue_alert(" not in text and "queued(" not in text:
            continue
        words |= set(re.findall(r"""key = f["']([a-z_-]+):""", text))
        words |= set(re.findall(r"""(?:enqueue_alert|queued)\(conn, f["']([a-z_-]+):""", text))
    assert words <= {k.value for k in AlertKind}, words - {k.value for k in AlertKind}


def test_the_stored_words_keep_their_spelling():
    assert Action.STOP_REQUESTED == "stop_requested" and f"{Action.SIGKILL}" == "sigkill"
    assert Action.budget("closed") is Action.BUDGET_CLOSED and Action.budget("warning") is Action.BUDGET_WARNING
    assert STOP_ACTIONS == {"stop_requested", "guard_stop"}
    assert AlertKind.NO_DAEMON == "nodaemon" and AlertKind.PAUSE_DENIED == "pause-denied"
    assert str(AlertKind.STOP) == "stop" and f"{AlertKind.FORGED_ALERTS}" == "forged-alerts"


@pytest.mark.parametrize("kind", list(AlertKind))
def test_a_kinds_key_names_its_kind_and_urgency(kind):
    key = kind.key("r" * 32, 7)
    assert key == f"{kind.value}:{'r' * 32}:7"
    assert AlertKind.of_key(key) is kind
    assert notify_kind(key) is kind.urgency


# The table of watchdog.core.notify_kind, which this replaces: the same urgency for every word.
OLD_FAILURE = {"escalate", "lost", "nodaemon", "forged", "forged-alerts", "unconfirmed"}
OLD_INFO = {"circuit_closed", "resume", "test"}


@pytest.mark.parametrize("key", ["escalate:r", "lost:r", "nodaemon:h:never", "forged:r:x", "forged-alerts:h:1",
                                 "unconfirmed:r", "circuit_closed:t:1", "resume:r:1", "test", "stop:r",
                                 "pause:r:1.0", "rate:r:1", "budget-closed:a:day:1", "nosuchword:r", "", "stop"])
def test_urgency_is_the_old_notify_kinds(key):
    word = key.split(":", 1)[0]
    want = "failure" if word in OLD_FAILURE else "info" if word in OLD_INFO else "warning"
    assert notify_kind(key) == want


def test_a_key_that_is_not_text_is_a_warning():
    assert notify_kind(None) is Urgency.WARNING and AlertKind.of_key(3) is None


@pytest.mark.parametrize("kind", list(AlertKind))
def test_each_kind_says_what_it_tells_and_its_keys_shape(kind):
    assert kind.meaning.startswith(kind.value)


def test_only_announce_queues_an_alert():
    """Issue 34: one verb announces an outcome (watchdog/store/alerts.py); no other module
    calls the outbox's enqueue, so every alert is worded from the one table of outcomes."""
    import ast

    callers = set()
    for path, text in SOURCES.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if name == "enqueue_alert":
                    callers.add(str(path))
    assert callers and all(c.endswith("store/alerts.py") for c in callers), callers
