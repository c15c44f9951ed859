"""`agent-watchdog db upgrade | runs | show` on both stores, in-process and as the real console script."""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from watchdog import RunKilled, Watchdog
from watchdog.cli import main
from watchdog.store import access

RUN_FIELDS = {"id", "agent", "status", "stop_reason", "steps", "tool_calls", "tool_errors", "cost_eur", "host", "pid",
              "kill_mode", "started_at", "ended_at", "top_tool"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG"):
        monkeypatch.delenv(var, raising=False)


def clean_os_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG_")}


@pytest.fixture
def runs3(db_url, engine):
    """A completed run with tools, a killed run, and a run still going (oldest first)."""
    wd = Watchdog(db_url)
    with wd.run(agent="support-bot", kill_mode="process", labels={"ticket": 7}) as done:
        done.step(model="gpt-x", tokens_in=100, tokens_out=10, cost_eur=0.25)
        for i in range(3):
            done.record_tool("verify_iban", {"i": i}, ok=(i != 2), error=None if i != 2 else "HTTP 502")
        done.tool_call("search", {"q": "refund"}, lambda q: q)
        done.heartbeat("half way")
    with pytest.raises(RunKilled):
        with wd.run(agent="looper") as killed:
            killed.record_tool("search", {"q": 1})
            with engine.begin() as conn:
                conn.execute(text("UPDATE runs SET status = 'stopping', stop_reason = 'loop_detected', "
                                  "stop_detail = 'search 3x' WHERE id = :id"), {"id": killed.id})
            killed.record_tool("search", {"q": 1})
    going = wd.run(agent="researcher", kill_mode="tree")
    going.start()
    going.step(cost_eur=0.5)
    assert wd.buffered == 0 and wd.rejected_events == 0
    yield {"done": done, "killed": killed, "going": going, "url": db_url}
    wd.close()


def invoke(*args, env=None):
    result = CliRunner().invoke(main, list(args), env=env)
    return result


def _aware(value: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(value)
    assert parsed.utcoffset() == dt.timedelta(0), value
    return parsed


def test_runs_lists_only_active_runs_by_default(runs3):
    result = invoke("--db", runs3["url"], "runs")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert runs3["going"].id[:8] in out and "researcher" in out
    assert runs3["done"].id[:8] not in out and runs3["killed"].id[:8] not in out
    as_json = json.loads(invoke("--db", runs3["url"], "runs", "--json").stdout)
    assert [r["id"] for r in as_json] == [runs3["going"].id]


def test_runs_all_json_has_the_public_fields(runs3):
    result = invoke("--db", runs3["url"], "runs", "--all", "--json")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert isinstance(records, list) and len(records) == 3
    for r in records:
        assert RUN_FIELDS <= set(r), RUN_FIELDS - set(r)
        assert isinstance(r["pid"], int) and r["pid"] == os.getpid()
        assert isinstance(r["cost_eur"], (int, float))
        _aware(r["started_at"])
    # Newest first.
    assert [r["id"] for r in records] == [runs3["going"].id, runs3["killed"].id, runs3["done"].id]
    going, killed, done = records
    assert done["agent"] == "support-bot" and done["status"] == "completed" and done["stop_reason"] is None
    assert (done["steps"], done["tool_calls"], done["tool_errors"]) == (1, 4, 1)
    assert done["cost_eur"] == pytest.approx(0.25)
    assert done["kill_mode"] == "process"
    assert done["top_tool"] == {"name": "verify_iban", "calls": 3, "errors": 1}
    assert _aware(done["started_at"]) <= _aware(done["ended_at"])
    assert killed["status"] == "killed" and killed["stop_reason"] == "loop_detected"
    assert killed["top_tool"] == {"name": "search", "calls": 2, "errors": 0}
    assert going["status"] == "running" and going["ended_at"] is None
    assert going["top_tool"] is None
    assert going["kill_mode"] == "tree" and going["cost_eur"] == pytest.approx(0.5)


def test_show_with_an_eight_character_prefix(runs3):
    full = runs3["done"].id
    result = invoke("--db", runs3["url"], "show", full[:8], "--json")
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)
    assert isinstance(r, dict)
    assert RUN_FIELDS <= set(r)
    assert r["id"] == full
    assert r["top_tool"] == {"name": "verify_iban", "calls": 3, "errors": 1}
    assert r["tools"] == [{"name": "verify_iban", "calls": 3, "errors": 1}, {"name": "search", "calls": 1, "errors": 0}]
    assert [e["seq"] for e in r["last_events"]] == [1, 2, 3, 4, 5, 6]
    assert r["last_events"][3]["error_msg"] == "HTTP 502"
    assert r["budgets"]["max_steps"] == 12  # the built-in profile without a config
    # Upper case and the full id work too.
    assert json.loads(invoke("--db", runs3["url"], "show", full.upper()[:10], "--json").stdout)["id"] == full


def test_show_text_names_counters_against_budgets_and_the_top_tools(runs3):
    result = invoke("--db", runs3["url"], "show", runs3["killed"].id[:8])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "killed" in out and "loop_detected" in out and "search 3x" in out
    assert "search" in out and "2 calls" in out
    assert "tool calls  2/40" in out


def test_show_takes_budgets_from_the_config(runs3, tmp_path):
    cfg = tmp_path / "w.toml"
    cfg.write_text("[agents.support-bot]\nmax_steps = 8\n")
    result = invoke("--db", runs3["url"], "--config", str(cfg), "show", runs3["done"].id[:8], "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["budgets"]["max_steps"] == 8


def test_without_a_config_budgets_are_the_ones_the_daemon_published(runs3, engine, tmp_path):
    import tomllib

    from sqlalchemy import insert

    from watchdog.core.config import parse
    from watchdog.store.schema import settings, utcnow

    published = parse(tomllib.loads("[defaults]\nmax_tool_calls = 30\n[agents.support-bot]\nmax_steps = 6\n")).published()
    with engine.begin() as conn:
        conn.execute(insert(settings).values(key="config", value=published, updated_at=utcnow()))
    shown = json.loads(invoke("--db", runs3["url"], "show", runs3["done"].id[:8], "--json").stdout)
    assert (shown["budgets"]["max_steps"], shown["budgets"]["max_tool_calls"]) == (6, 30)
    listed = {r["agent"]: r for r in json.loads(invoke("--db", runs3["url"], "runs", "--all", "--json").stdout)}
    assert listed["looper"]["budgets"]["max_steps"] == 12 and listed["looper"]["budgets"]["max_tool_calls"] == 30
    # An explicit config file still wins.
    cfg = tmp_path / "w.toml"
    cfg.write_text("[agents.support-bot]\nmax_steps = 9\n")
    own = json.loads(invoke("--db", runs3["url"], "--config", str(cfg), "show", runs3["done"].id[:8], "--json").stdout)
    assert own["budgets"]["max_steps"] == 9


def test_kill_without_a_config_judges_by_the_published_profile_on_its_own_connection(sqlite_url, monkeypatch,
                                                                                    tmp_path):
    """`kill` writes in one transaction: reading the published profiles through a second
    connection would wait for the lock its own command holds (30 s of busy timeout, then
    the built-in defaults). With a 50 ms busy timeout such a second connection fails at
    once, and the alert would show the defaults' 12 steps instead of the published 6."""
    import tomllib

    from sqlalchemy import insert, select

    import watchdog.store.engine as engine_mod
    from watchdog.core.config import parse
    from watchdog.store.engine import make_engine
    from watchdog.store.schema import alerts, runs, settings, utcnow

    # Hermetic: not the host's default key_file (root may read a daemon's key there); no profiles.
    cfg = tmp_path / "only-key.toml"
    cfg.write_text(f'[daemon]\nkey_file = "{tmp_path / "no.key"}"\n')
    published = parse(tomllib.loads("[agents.support-bot]\nmax_steps = 6\n")).published()
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(insert(settings).values(key="config", value=published, updated_at=utcnow()))
    wd = Watchdog(sqlite_url)
    going = wd.run(agent="support-bot", guards=False).start()
    for _ in range(3):
        going.step(cost_eur=0.01)
    monkeypatch.setattr(engine_mod, "SQLITE_BUSY_TIMEOUT_MS", 50)
    result = invoke("--db", sqlite_url, "--config", str(cfg), "kill", going.id[:8])
    assert result.exit_code == 0, result.output
    assert f"stop requested for support-bot run {going.id[:8]}" in result.output
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.id)).all() == []  # only the daemon composes alerts
        status = conn.execute(select(runs.c.status, runs.c.stop_reason).where(runs.c.id == going.id)).one()
    assert tuple(status) == ("stopping", "manual")
    # The daemon alerts the stop it did not request, against the profile it publishes.
    from daemon_support import SEALER
    from watchdog.daemon.stops.killer import Killer
    from watchdog.daemon.tick.ticker import Ticker

    monkeypatch.setattr(engine_mod, "SQLITE_BUSY_TIMEOUT_MS", 30_000)
    daemon_cfg = parse(tomllib.loads("[agents.support-bot]\nmax_steps = 6\n"))
    Ticker(engine, daemon_cfg, Killer(), sealer=SEALER).tick(utcnow())
    with engine.connect() as conn:
        body = conn.execute(select(alerts.c.body).where(alerts.c.run_id == going.id)).scalar_one()
    assert "steps 3/6" in body and "steps 3/12" not in body
    wd.close()
    engine.dispose()


def test_unknown_or_ambiguous_run_id_is_one_line_and_non_zero(runs3):
    result = invoke("--db", runs3["url"], "show", "deadbeef")
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "deadbeef" in result.stderr and "no such run" in result.stderr
    assert "Traceback" not in result.output
    too_short = invoke("--db", runs3["url"], "show", "ab")
    assert too_short.exit_code != 0 and too_short.stderr.count("\n") == 1


def test_an_ambiguous_prefix_is_refused(db_url):
    wd = Watchdog(db_url)
    for suffix in ("aaaa", "bbbb"):
        with wd.run(agent="a", run_id="abcd1234" + suffix):
            pass
    wd.close()
    result = invoke("--db", db_url, "show", "abcd1234")
    assert result.exit_code != 0 and "ambiguous" in result.stderr and result.stderr.count("\n") == 1
    ok = invoke("--db", db_url, "show", "abcd1234b", "--json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["id"] == "abcd1234bbbb"


def test_a_prefix_with_like_wildcards_matches_literally(db_url):
    wd = Watchdog(db_url)
    with wd.run(agent="a", run_id="abcd1234aaaa"):
        pass
    wd.close()
    for pattern in ("abcd_234", "abc%", "____1234"):
        result = invoke("--db", db_url, "show", pattern)
        assert result.exit_code != 0, pattern
        assert "no such run" in result.stderr


def test_db_option_before_or_after_the_subcommand_and_from_the_environment(runs3):
    url = runs3["url"]
    variants = [
        invoke("--db", url, "runs", "--all", "--json"),
        invoke("runs", "--all", "--json", "--db", url),
        invoke("runs", "--all", "--json", env={"AGENT_WATCHDOG_DB": url}),
    ]
    ids = [[r["id"] for r in json.loads(v.stdout)] for v in variants]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 3
    show_after = invoke("show", runs3["done"].id[:8], "--json", "--db", url)
    assert show_after.exit_code == 0 and json.loads(show_after.stdout)["id"] == runs3["done"].id
    # --db beats the environment.
    wrong_env = invoke("runs", "--all", "--json", "--db", url, env={"AGENT_WATCHDOG_DB": "sqlite:///nowhere/x.db"})
    assert wrong_env.exit_code == 0 and len(json.loads(wrong_env.stdout)) == 3


def test_store_url_from_the_config_file(runs3, tmp_path):
    cfg = tmp_path / "w.toml"
    cfg.write_text(f'[store]\nurl = "{runs3["url"]}"\n')
    result = invoke("--config", str(cfg), "runs", "--all", "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)) == 3


def test_no_store_configured_is_one_line_error():
    result = invoke("runs")
    assert result.exit_code != 0
    assert result.stderr.count("\n") == 1 and "--db" in result.stderr and "AGENT_WATCHDOG_DB" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("url,message", [
    ("mysql://u@h/db", "store URL 'mysql://u@h/db': only sqlite and postgresql are supported"),
    ("not a url", "store URL '(unparsable URL)': expected a SQLAlchemy URL such as sqlite:///runs.db "
                  "or postgresql+psycopg://user@host/db"),
    ("postgresql+psycopg://postgres@127.0.0.1:1/none",
     'the store at postgresql+psycopg://postgres@127.0.0.1:1/none: connection failed: connection to server at '
     '"127.0.0.1", port 1 failed: Connection refused'),
])
def test_bad_or_unreachable_store_is_one_line_error(url, message):
    for args in (["--db", url, "runs"], ["--db", url, "db", "upgrade"], ["--db", url, "kill", "abcd1234"]):
        result = invoke(*args)
        assert result.exit_code == 1, result.output
        assert result.stderr == f"agent-watchdog: error: {message}\n"
        assert result.stdout == ""


@pytest.mark.postgres
def test_the_store_password_is_never_printed(pg_migrated):
    # Trust authentication accepts any password: the command succeeds with one in the URL.
    with_pw = pg_migrated.replace("postgres@", "postgres:s3cr3t-pw@", 1)
    assert "s3cr3t-pw" in with_pw
    ok = invoke("--db", with_pw, "db", "upgrade")
    assert ok.exit_code == 0, ok.output
    assert f"revision {access.head()}" in ok.stdout and "s3cr3t-pw" not in ok.output
    unreachable = invoke("--db", "postgresql+psycopg://postgres:s3cr3t-pw@127.0.0.1:1/none", "runs")
    assert unreachable.exit_code != 0 and "s3cr3t-pw" not in unreachable.output


def test_runs_on_an_empty_store(db_url):
    result = invoke("--db", db_url, "runs", "--all")
    assert result.exit_code == 0 and result.stdout.strip() == "no runs"
    assert json.loads(invoke("--db", db_url, "runs", "--json").stdout) == []


# --- acceptance: the real console script in a subprocess -----------------------------------


def console_script() -> str:
    found = shutil.which("agent-watchdog", path=os.path.dirname(sys.executable)) or shutil.which("agent-watchdog")
    assert found, "the agent-watchdog console script is not installed"
    return found


def aw(*args, env=None):
    return subprocess.run([console_script(), *args], capture_output=True, text=True, timeout=120, cwd="/",
                          env={**clean_os_env(), **(env or {})})


def test_console_script_runs_show_and_errors(runs3):
    url = runs3["url"]
    listing = aw("runs", "--all", "--json", "--db", url)
    assert listing.returncode == 0, listing.stderr
    records = json.loads(listing.stdout)
    assert {r["status"] for r in records} == {"completed", "killed", "running"}
    shown = aw("show", runs3["killed"].id[:8], "--json", env={"AGENT_WATCHDOG_DB": url})
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert (detail["id"], detail["status"], detail["stop_reason"]) == (runs3["killed"].id, "killed", "loop_detected")
    missing = aw("--db", url, "show", "0000ffff")
    assert missing.returncode != 0
    assert missing.stdout == "" and missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr
    debug = aw("--db", url, "--debug", "show", "0000ffff")
    assert debug.returncode != 0 and "Traceback" in debug.stderr  # --debug shows it


def test_console_script_db_upgrade_from_another_directory(tmp_path):
    url = f"sqlite:///{tmp_path / 'new.db'}"
    for _ in range(2):
        result = aw("db", "upgrade", env={"AGENT_WATCHDOG_DB": url})
        assert result.returncode == 0, result.stderr
        assert f"revision {access.head()}" in result.stdout
    import sqlite3

    conn = sqlite3.connect(tmp_path / "new.db")
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()
    assert {"runs", "events", "interventions", "alerts", "tool_circuits", "settings", "daemons"} <= names
