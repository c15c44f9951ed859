"""A run's writer chooses its run's id, so another run may share its first 8 hex digits, chosen to
(hostile review, low): the command an alert or the CLI names must still find the one run. It names
the whole id (watchdog.core.text.command_id); a listing shows the whole id of runs that collide."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from daemon_support import alerts_of, ticker
from watchdog import RunKilled
from watchdog.cli import main
from watchdog.core import lifecycle as lc
from watchdog.store.schema import utcnow

VICTIM = "1a2b3c4d" + "0" * 24
MIMIC = "1a2b3c4d" + "f" * 24  # its first 8 digits the victim's


def cli(db_url: str, *args: str):
    return CliRunner().invoke(main, ["--db", db_url, *args])


def test_an_alerts_command_finds_its_run_when_another_shares_its_first_8_digits(engine, db_url, wd):
    with wd.run("mimic", run_id=MIMIC) as mimic:
        mimic.step()
    with pytest.raises(RunKilled):
        with wd.run("bot", run_id=VICTIM, kill_mode="process", guards=False) as run:
            for i in range(13):
                run.step(model="gpt-x", tokens_in=10, tokens_out=2)
            assert ticker(engine).tick(utcnow()).stops == [(VICTIM, lc.MAX_STEPS)]
            run.heartbeat()
    (alert,) = alerts_of(engine, VICTIM)
    assert alert.title == "agent-watchdog: stopped run 1a2b3c4d — max_steps"  # a name to read
    command = alert.body.splitlines()[-1]
    assert command == f"agent-watchdog show {VICTIM}"  # a command to paste: the whole id
    shown = cli(db_url, *command.split()[1:])
    assert shown.exit_code == 0 and f"run {VICTIM}  agent bot" in shown.output
    # What the 8-character command it used to name meets:
    assert "ambiguous prefix" in cli(db_url, "show", VICTIM[:8]).output


def test_a_listing_shows_the_whole_ids_of_runs_that_share_their_first_8_digits(db_url, wd):
    for rid in (VICTIM, MIMIC, "9f8e7d6c" + "0" * 24):
        with wd.run("bot", run_id=rid) as run:
            run.step()
    listing = cli(db_url, "runs", "--all").output.splitlines()
    ids = {line.split()[0] for line in listing if re.match(r"[0-9a-f]{8}", line)}  # (not the header, nor a warning)
    assert ids == {VICTIM, MIMIC, "9f8e7d6c"}  # the one run alone there keeps its short form


def test_a_hooked_cli_is_told_the_whole_id_to_resume() -> None:
    from watchdog.gateways.hooks.core import paused

    assert paused(VICTIM, "max_steps").endswith(f"agent-watchdog resume {VICTIM}")


def test_a_whole_id_finds_its_run_when_a_longer_id_begins_with_it(sqlite_url) -> None:
    """SQLite does not enforce String(32): a plain-SQL writer may store an id that starts with the
    victim's whole id, to make the whole id every alert names "ambiguous" too."""
    from sqlalchemy import update

    from watchdog import Watchdog
    from watchdog.store.engine import make_engine
    from watchdog.store.schema import runs

    wd = Watchdog(sqlite_url)
    try:
        with wd.run("bot", run_id=VICTIM) as run:
            run.step()
        with wd.run("mimic", run_id=MIMIC):
            pass
    finally:
        wd.close()
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == MIMIC).values(id=VICTIM + "ff"))
    engine.dispose()
    shown = cli(sqlite_url, "show", VICTIM)
    assert shown.exit_code == 0 and f"run {VICTIM}  agent bot" in shown.output
    assert "ambiguous prefix" in cli(sqlite_url, "show", VICTIM[:8]).output


def test_two_runs_sharing_their_first_8_digits_get_a_postmortem_file_each(db_url, wd, tmp_path) -> None:
    """The reports were named by the first 8 digits: the second report overwrote the first."""
    for rid in (VICTIM, MIMIC):
        with wd.run("bot", run_id=rid) as run:
            run.step()
        assert cli(db_url, "postmortem", rid, "--output", str(tmp_path / "pm")).exit_code == 0
    reports = sorted(p.name for p in (tmp_path / "pm").glob("*.md"))
    assert reports == [f"postmortem-{VICTIM}.md", f"postmortem-{MIMIC}.md"]
    assert VICTIM in (tmp_path / "pm" / f"postmortem-{VICTIM}.md").read_text()
