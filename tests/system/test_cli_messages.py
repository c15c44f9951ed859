"""Messages that say the fix, and output that does not mislead (issue 16, points 4 and 6).

The real console script in a subprocess (what a user types), on real SQLite files and
PostgreSQL databases: a missing or unmigrated store for every command, a row another
program wrote badly, unknown users, click's own errors, and the output glitches found
by reading the CLI as a newcomer.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import click
import pytest
from sqlalchemy import create_engine, insert, text

from alertsinks import closed_port
from daemon_support import daemon_toml
from pg_support import PG_ADMIN_URL
from watchdog import ToolUnavailable, Watchdog
from watchdog.cli import main
from watchdog.store import access
from watchdog.store.engine import make_engine
from watchdog.store.schema import runs, tool_circuits, utcnow

CLI = str(Path(sys.executable).with_name("agent-watchdog"))
PREFIX = "agent-watchdog: error: "

# Every command that needs a store, with the arguments it takes.
STORE_COMMANDS = [
    ["runs"], ["runs", "--all"], ["show", "abcd1234"], ["top", "--once"], ["postmortem", "abcd1234"],
    ["circuits"], ["circuits", "close", "verify_iban"], ["kill", "abcd1234"], ["run", "--once"],
    ["db", "downgrade", "base"],
]


def cli(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})},
                          stdin=subprocess.DEVNULL)


def one_error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode != 0, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0][len(PREFIX):]


# --- a missing or unmigrated store -----------------------------------------------------------


@pytest.mark.parametrize("args", STORE_COMMANDS, ids=" ".join)
def test_a_missing_sqlite_store_names_the_fix_and_no_file_is_created(tmp_path, args):
    url = f"sqlite:///{tmp_path / 'typo.db'}"
    msg = one_error_line(cli("--db", url, *args))
    assert msg == (f"no store at {tmp_path / 'typo.db'}: create it with `agent-watchdog db upgrade --db {url}`, "
                   "or check --db / $AGENT_WATCHDOG_DB / [store] url")
    assert list(tmp_path.iterdir()) == []  # not even an empty file for a read


@pytest.mark.parametrize("args", STORE_COMMANDS, ids=" ".join)
def test_an_unmigrated_sqlite_store_says_run_db_upgrade_first(tmp_path, args):
    db = tmp_path / "empty.db"
    sqlite3.connect(db).close()
    url = f"sqlite:///{db}"
    res = cli("--db", url, *args)
    if args == ["db", "downgrade", "base"]:  # nothing to undo is not an error
        assert res.returncode == 0 and "base (no tables)" in res.stdout, res.stderr
        return
    assert one_error_line(res) == f"the store at {url} has no tables: run `agent-watchdog db upgrade --db {url}` first"
    assert db.stat().st_size == 0  # a read changed nothing


@pytest.fixture
def empty_pg_database():
    name = f"aw_empty_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("args", [["runs"], ["show", "abcd1234"], ["kill", "abcd1234"], ["run", "--once"]], ids=" ".join)
def test_an_unmigrated_postgresql_store_says_run_db_upgrade_first(empty_pg_database, args, tmp_path):
    url = empty_pg_database
    if args[0] == "run":  # a daemon run as root must name its allowed users first (tests run as root)
        (tmp_path / "c.toml").write_text(daemon_toml())
        args = ["--config", str(tmp_path / "c.toml"), *args]
    assert one_error_line(cli("--db", url, *args)) == (
        f"the store at {url} has no tables: run `agent-watchdog db upgrade --db {url}` first")


def test_a_store_older_than_the_code_says_run_db_upgrade_first(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    access.upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.execute(insert(runs).values(id="ab" * 16, agent="a", status="running", kill_mode="cooperative",
                                         host="h", pid=1, started_at=utcnow(), last_seen_at=utcnow()))
    engine.dispose()
    head = access.head()
    assert head != "0001"
    (tmp_path / "c.toml").write_text(daemon_toml())
    assert one_error_line(cli("--db", url, "--config", str(tmp_path / "c.toml"), "run", "--once")) == (
        f"the store is at revision 0001, this agent-watchdog needs {head}: "
        f"run `agent-watchdog db upgrade --db {url}` first")
    msg = one_error_line(cli("--db", url, "show", "abababab"))  # reads the events' new column
    assert msg.startswith(f"the store at {url} lacks tables or columns this agent-watchdog needs (")
    assert msg.endswith(f"): run `agent-watchdog db upgrade --db {url}` first")


def test_reads_open_sqlite_read_only(sqlite_url):
    engine = make_engine(sqlite_url, read_only=True)
    try:
        with pytest.raises(Exception, match="readonly database"):
            with engine.begin() as conn:
                conn.execute(text("DELETE FROM runs"))
    finally:
        engine.dispose()


# --- a bad row in a listing --------------------------------------------------------------------


def test_a_bad_row_is_named_and_the_others_are_listed(sqlite_url):
    wd = Watchdog(sqlite_url)
    with wd.run(agent="healthy") as good:
        good.step(cost_eur=0.01)
    wd.close()
    bad_id = "bad0" + "0" * 28
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:  # another language's writer
        conn.execute("PRAGMA ignore_check_constraints = ON")  # a row from before the store's checks (0007)
        conn.execute("INSERT INTO runs (id, agent, status, kill_mode, host, pid, started_at, last_seen_at) "
                     "VALUES (?, 'other', 'running', 'cooperative', 'h', 1, 'yesterday', 'yesterday')", (bad_id,))
    for args in (["runs", "--all"], ["runs", "--all", "--json"], ["runs"]):
        res = cli("--db", sqlite_url, *args)
        assert res.returncode == 0, res.stderr
        warning, banner = res.stderr.strip().splitlines()  # and no daemon watches this store (issue 36)
        assert warning == (f"agent-watchdog: warning: run bad00000: unreadable row, left out "
                           f"(Invalid isoformat string: 'yesterday')"), res.stderr
        assert banner.startswith("agent-watchdog: no live daemon ever"), res.stderr
        if "--json" in args:
            assert [r["id"] for r in json.loads(res.stdout)] == [good.id]
        elif "--all" in args:
            assert good.id[:8] in res.stdout and "bad00000" not in res.stdout
    assert one_error_line(cli("--db", sqlite_url, "show", "bad00000")) == (
        "run bad00000: unreadable row (Invalid isoformat string: 'yesterday')")


# --- the config and what it needs from the host --------------------------------------------------


def test_an_unknown_user_in_allowed_users_is_a_config_error(tmp_path, sqlite_url):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[daemon]\nallowed_users = ["root", "nosuchuser"]\n')
    expected = (f"{cfg}: daemon.allowed_users: no user 'nosuchuser' on this host "
                "(create it, or name the user the agents run as)")
    for args in (["check-config", str(cfg)], ["--config", str(cfg), "--db", sqlite_url, "run", "--once"]):
        res = cli(*args)
        assert res.returncode == 2
        assert one_error_line(res) == expected
    cfg.write_text('[daemon]\nallowed_users = ["root"]\n')
    assert cli("check-config", str(cfg)).returncode == 0


# --- one error style -------------------------------------------------------------------------------


@pytest.mark.parametrize("args,expected", [
    (["runs", "--bogus"], "No such option '--bogus' (see `agent-watchdog runs --help`)"),
    (["nosuchcommand"], "No such command 'nosuchcommand' (see `agent-watchdog --help`)"),
    (["show"], "Missing argument 'RUN_ID' (see `agent-watchdog show --help`)"),
    (["runs", "--limit", "0"], "Invalid value for '--limit': 0 is not in the range 1<=x<=100000 "
                               "(see `agent-watchdog runs --help`)"),
    (["test-alert"], "no alert URLs: set [alerts] urls or urls_file in the config (--config or $AGENT_WATCHDOG_CONFIG)"),
])
def test_every_error_has_the_same_style(args, expected):
    res = cli(*args)
    assert "Error:" not in res.stderr
    assert one_error_line(res) == expected


def _options(command: click.Command, path: str):
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "help":
            yield f"{path} {param.opts[0]}", param
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _options(sub, f"{path} {name}")


def test_every_option_has_help_text():
    missing = [name for name, opt in _options(main, "agent-watchdog") if not (opt.help or "").strip()]
    assert missing == []
    assert len(list(_options(main, "agent-watchdog"))) > 40  # the walk saw every command


# --- output glitches ----------------------------------------------------------------------------------


def test_show_puts_the_unit_before_the_over_mark_and_never_doubles_an_error_class(sqlite_url):
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:  # a circuit the daemon opened: the SDK fails the call fast
        conn.execute(insert(tool_circuits).values(tool="verify_iban", state="open", errors_in_window=5,
                                                  open_until=utcnow() + dt.timedelta(hours=1), last_error="HTTP 500",
                                                  updated_at=utcnow()))
    wd = Watchdog(sqlite_url)
    run = wd.run(agent="old")
    run.start()
    with pytest.raises(ToolUnavailable):
        run.tool_call("verify_iban", {"iban": "IT60"}, lambda iban: "valid")
    with engine.begin() as conn:  # started two days ago: far over the 300 s wall clock
        conn.execute(text("UPDATE runs SET started_at = :t WHERE id = :id"),
                     {"t": (utcnow() - dt.timedelta(days=2)).replace(tzinfo=None).isoformat(sep=" "), "id": run.id})
    engine.dispose()
    res = cli("--db", sqlite_url, "show", run.id[:8])
    wd.close()
    assert res.returncode == 0, res.stderr
    (duration,) = [line for line in res.stdout.splitlines() if line.strip().startswith("duration")]
    assert re.fullmatch(r"  duration\s+1728\d\d/300 s  ← OVER", duration), duration
    (event,) = [line for line in res.stdout.splitlines() if "tool verify_iban" in line]
    assert "ERR ToolUnavailable: verify_iban is unavailable until" in event
    assert event.count("ToolUnavailable") == 1, event


def test_runs_marks_what_it_cuts(sqlite_url):
    wd = Watchdog(sqlite_url)
    with wd.run(agent="an-agent-with-a-rather-long-name") as r:
        r.step(cost_eur=0.01)
    wd.close()
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:  # a reason another writer invented
        conn.execute("UPDATE runs SET status = 'killed', stop_reason = 'budget_exhausted_upstream' WHERE id = ?",
                     (r.id,))
    res = cli("--db", sqlite_url, "runs", "--all")
    assert res.returncode == 0, res.stderr
    row = res.stdout.splitlines()[1]
    assert "an-agent-with…" in row and "budget_exhausted… " in row, row


def test_circuits_never_shows_an_open_until_time_that_has_passed(sqlite_url):
    now = utcnow()
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        for tool, until in (("expired_tool", now - dt.timedelta(minutes=5)), ("open_tool", now + dt.timedelta(hours=1))):
            conn.execute(insert(tool_circuits).values(tool=tool, state="open", errors_in_window=5, open_until=until,
                                                      last_error="HTTP 500", updated_at=now))
    engine.dispose()
    res = cli("--db", sqlite_url, "circuits")
    assert res.returncode == 0, res.stderr
    expired, still_open = res.stdout.splitlines()
    past = (now - dt.timedelta(minutes=5)).strftime("%H:%M:%S")
    assert expired.startswith("expired_tool") and "open until" not in expired
    assert f"open, expired {past} UTC (the next call is the probe)" in expired
    assert f"open until {(now + dt.timedelta(hours=1)).strftime('%H:%M:%S')} UTC" in still_open


def test_postmortem_names_no_cause_its_own_table_denies(sqlite_url):
    wd = Watchdog(sqlite_url)
    run = wd.run(agent="spreader", guards=False)
    run.start()
    run.step(cost_eur=0.01)
    for i in range(5):  # every call different, none failing: no row of the table matches
        run.record_tool("search", {"q": i}, ok=True)
    wd.close()
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET status = 'killed', stop_reason = 'max_tool_calls', ended_at = last_seen_at "
                          "WHERE id = :id"), {"id": run.id})
    engine.dispose()
    res = cli("--db", sqlite_url, "postmortem", run.id[:8])
    assert res.returncode == 0, res.stderr
    assert "| steps growing, no convergence | no |" in res.stdout
    assert "without convergence" not in res.stdout.split("## Probable cause")[1].split("|")[0]
    assert "no loop signature of the table below" in res.stdout


def test_test_alert_says_why_a_delivery_failed_and_shows_the_url_as_written(tmp_path):
    held, port = closed_port()
    try:
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[alerts]\nurls = ["json://127.0.0.1:{port}/hook"]\n')
        res = cli("--config", str(cfg), "test-alert")
    finally:
        held.close()
    assert res.returncode == 1
    assert res.stdout.strip() == (f"FAILED json://127.0.0.1:{port}/hook  — A Connection error occurred sending JSON "
                                  "notification to 127.0.0.1 (Connection refused)")


def test_run_verbose_is_about_the_watchdog_not_urllib3(tmp_path, sqlite_url, http):
    cfg = tmp_path / "c.toml"
    cfg.write_text(daemon_toml() + f'[defaults]\nmax_steps = 1\n[alerts]\nurls = ["{http.url()}"]\n')
    wd = Watchdog(sqlite_url)
    run = wd.run(agent="runaway", guards=False)
    run.start()
    for _ in range(3):
        run.step(cost_eur=0.001)
    wd.close()
    res = cli("--config", str(cfg), "--db", sqlite_url, "run", "--once", "-v")
    assert res.returncode == 0, res.stderr
    assert http.wait_for(1, timeout_s=10), res.stderr  # an alert went out over HTTP...
    assert re.search(r"DEBUG\s+watchdog\.", res.stderr), res.stderr  # -v shows the watchdog's debug lines
    assert "urllib3" not in res.stderr and "Starting new HTTP connection" not in res.stderr  # ...not urllib3's


@pytest.mark.slow
def test_a_skipped_job_is_logged_once(tmp_path, sqlite_url):
    """A delivery slower than the tick: each overrun is one line of ours ("skipped N time(s)"),
    never a line per missed interval. (The first pass waits out its budget on the silent target;
    later ones find its lane busy and return at once, so one overrun is what there is to see.)"""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts the handshake, never answers: each delivery waits for its timeout
    try:
        cfg = tmp_path / "c.toml"
        cfg.write_text(daemon_toml(tick_s=0.2) + '[defaults]\nmax_steps = 1\n'
                       f'[alerts]\nurls = ["json://127.0.0.1:{silent.getsockname()[1]}/hook"]\n')
        wd = Watchdog(sqlite_url)
        run = wd.run(agent="runaway", guards=False)
        run.start()
        for _ in range(3):
            run.step(cost_eur=0.001)
        wd.close()
        proc = subprocess.Popen([CLI, "--config", str(cfg), "--db", sqlite_url, "run"], stderr=subprocess.PIPE,
                                text=True, env={k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG")})
        lines: list[str] = []
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and sum("deliver job skipped" in line for line in lines) < 1:
                line = proc.stderr.readline()
                if not line:
                    break
                lines.append(line)
        finally:
            proc.terminate()
            rest = proc.communicate(timeout=60)[1]
        lines += rest.splitlines()
    finally:
        silent.close()
    log = "".join(lines)
    skips = [line for line in lines if "deliver job skipped" in line]
    assert skips and all(re.search(r"skipped \d+ time\(s\)", line) for line in skips), log
    assert "maximum number of running instances" not in log and "apscheduler" not in log, log


def test_the_circuit_example_leaves_no_temporary_folder(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}
    env["TMPDIR"] = str(tmp_path)
    example = Path(__file__).resolve().parents[2] / "examples" / "circuit_recovery.py"
    res = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=180, env=env,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_the_sdk_on_an_unmigrated_store_says_run_db_upgrade_first(tmp_path):
    """A store never migrated is the developer's to fix: the first run raises, quietly until then."""
    from watchdog.errors import StoreMisconfigured

    db = tmp_path / "new.db"
    sqlite3.connect(db).close()
    url = f"sqlite:///{db}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "unreachable" warning: it is not an outage
        wd = Watchdog(url)  # it reads the published budgets at once
        with pytest.raises(StoreMisconfigured) as caught:
            wd.run(agent="a")
    assert str(caught.value) == (f"agent-watchdog: the store at {url} has no tables: "
                                 f"run `agent-watchdog db upgrade --db {url}` first")
    assert wd.buffered == 0
    wd.close()
