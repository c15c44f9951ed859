"""TOML config → frozen dataclasses; one-line ConfigErrors; `agent-watchdog check-config` in process
(its console script as a real process: tests/system/test_config_console.py)."""
from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from watchdog.cli import main
from watchdog.core.config import (
    Budgets,
    CircuitPolicy,
    Config,
    DaemonConfig,
    Price,
    StoreConfig,
    load,
    parse,
    resolve_db_url,
)
from watchdog.daemon.alerts.notify import url_error
from watchdog.errors import ConfigError


FULL = """
[store]
url = "sqlite:////var/lib/agent-watchdog/runs.db"
record_args = true

[daemon]
tick_s = 2
cancel_grace_s = 0
term_grace_s = 3.5
allowed_users = ["agents", "batch"]
alert_retry_s = 45
alert_expire_s = 3600

[defaults]
max_wall_s = 600
max_steps = 10
max_tool_calls = 30
max_cost_eur = 1.5
max_identical_calls = 4
heartbeat_timeout_s = 90
max_tool_calls_per_min = 20
on_rate = "stop"
dedupe_window_s = 0
runs_may_raise = false

[agents.support-bot]
max_steps = 8

[agents."batch.summariser"]
max_wall_s = 3600
max_cost_eur = 5
runs_may_raise = true
on_rate = "alert"

[circuit]
errors = 3
window_s = 30
open_s = 60

[circuit.tools.verify_iban]
errors = 10

[alerts]
urls = ["slack://T000/B000/XXXX/#oncall", "mailtos://user:pass@example.org?to=oncall@example.org"]

[prices."gpt-x"]
input_eur_per_mtok = 2.0
output_eur_per_mtok = 12

[prices."free-model"]
input_eur_per_mtok = 0
output_eur_per_mtok = 0

[metrics]
listen = "127.0.0.1:9464"
"""


def write(tmp_path, body: str, name="watchdog.toml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("AGENT_WATCHDOG_DB", "AGENT_WATCHDOG_CONFIG"):
        monkeypatch.delenv(var, raising=False)


# --- parsing ------------------------------------------------------------------------


def test_every_section_is_parsed(tmp_path):
    path = write(tmp_path, FULL)
    cfg = load(path)
    assert cfg.path == str(path)
    assert cfg.store == StoreConfig(url="sqlite:////var/lib/agent-watchdog/runs.db", record_args=True)
    assert cfg.daemon == DaemonConfig(tick_s=2.0, cancel_grace_s=0.0, term_grace_s=3.5,
                                      allowed_users=("agents", "batch"), alert_retry_s=45.0,
                                      alert_expire_s=3600.0)
    assert cfg.defaults == Budgets(max_wall_s=600.0, max_steps=10, max_tool_calls=30, max_cost_eur=1.5,
                                   max_identical_calls=4, heartbeat_timeout_s=90.0, max_tool_calls_per_min=20,
                                   on_rate="stop", dedupe_window_s=0.0, runs_may_raise=False)
    # A profile starts from [defaults] and overrides only what it names.
    assert cfg.agents["support-bot"] == dataclasses.replace(cfg.defaults, max_steps=8)
    assert cfg.agents["batch.summariser"] == dataclasses.replace(
        cfg.defaults, max_wall_s=3600.0, max_cost_eur=5.0, runs_may_raise=True, on_rate="alert")
    assert cfg.profile("support-bot").max_steps == 8
    assert cfg.profile("unknown-agent") == cfg.defaults
    assert cfg.circuit.default == CircuitPolicy(errors=3, window_s=30.0, open_s=60.0)
    assert cfg.circuit.for_tool("verify_iban") == CircuitPolicy(errors=10, window_s=30.0, open_s=60.0)
    assert cfg.circuit.for_tool("search") == cfg.circuit.default
    assert cfg.alert_urls == ("slack://T000/B000/XXXX/#oncall",
                              "mailtos://user:pass@example.org?to=oncall@example.org")
    assert cfg.prices == {"gpt-x": Price(2.0, 12.0), "free-model": Price(0.0, 0.0)}
    assert cfg.prices["gpt-x"].cost_eur(1000, 500) == pytest.approx(0.008)
    assert cfg.metrics_listen == "127.0.0.1:9464"
    assert isinstance(cfg.defaults.max_steps, int) and isinstance(cfg.defaults.max_wall_s, float)


def test_an_empty_file_gives_the_documented_defaults(tmp_path):
    cfg = load(write(tmp_path, ""))
    assert cfg.defaults == Budgets()
    b = cfg.defaults
    assert (b.max_wall_s, b.max_steps, b.max_tool_calls, b.max_cost_eur, b.max_identical_calls,
            b.heartbeat_timeout_s, b.max_tool_calls_per_min, b.on_rate) == (300, 12, 40, 2.0, 3, 120, 15, "alert")
    assert (cfg.circuit.default.errors, cfg.circuit.default.window_s, cfg.circuit.default.open_s) == (5, 60, 120)
    assert cfg.daemon.tick_s == 5 and cfg.store.record_args is False
    assert cfg.agents == {} and cfg.alert_urls == () and cfg.prices == {}


def test_config_is_frozen(tmp_path):
    cfg = load(write(tmp_path, "[defaults]\nmax_steps = 9\n"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.defaults.max_steps = 100
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.store = StoreConfig()


def test_published_settings_carry_prices_and_profiles_never_what_agents_record():
    cfg = parse(tomllib.loads(_without_alerts(FULL)))  # alert URLs need apprise: not under test here
    pub = cfg.published()
    json.dumps(pub)  # it is stored as JSON
    assert pub["prices"]["gpt-x"] == {"input_eur_per_mtok": 2.0, "output_eur_per_mtok": 12.0}
    assert pub["agents"]["support-bot"]["max_steps"] == 8
    assert pub["agents"]["support-bot"]["max_tool_calls"] == 30  # merged with defaults
    assert pub["defaults"]["on_rate"] == "stop"
    # record_args / record_errors are each agent's own choice: a settings row must not carry them.
    assert cfg.store.record_args is True
    assert "record_args" not in pub and "record_errors" not in pub and "store" not in pub


def _without_alerts(text: str) -> str:
    out, skip = [], False
    for line in text.splitlines():
        if line.startswith("["):
            skip = line.strip() == "[alerts]"
        if not skip:
            out.append(line)
    return "\n".join(out)


def test_load_uses_the_environment_variable(tmp_path, monkeypatch):
    path = write(tmp_path, "[defaults]\nmax_steps = 7\n")
    monkeypatch.setenv("AGENT_WATCHDOG_CONFIG", str(path))
    assert load().defaults.max_steps == 7
    assert load(None).path == str(path)
    monkeypatch.delenv("AGENT_WATCHDOG_CONFIG")
    assert load() == Config()


def test_store_url_precedence(monkeypatch):
    cfg = parse({"store": {"url": "sqlite:///from-config.db"}})
    assert resolve_db_url(None, cfg) == "sqlite:///from-config.db"
    monkeypatch.setenv("AGENT_WATCHDOG_DB", "sqlite:///from-env.db")
    assert resolve_db_url(None, cfg) == "sqlite:///from-env.db"
    assert resolve_db_url("sqlite:///from-flag.db", cfg) == "sqlite:///from-flag.db"


# --- errors: one line, naming the file and the key -------------------------------------------

BAD = [
    ("[stor]\nurl = 'x'\n", "stor"),
    ("[defaults]\nmax_stepz = 3\n", "defaults.max_stepz"),
    ("[defaults]\nmax_steps = \"8\"\n", "defaults.max_steps"),
    ("[defaults]\nmax_steps = 8.5\n", "defaults.max_steps"),
    ("[defaults]\nmax_steps = true\n", "defaults.max_steps"),
    ("[defaults]\nmax_steps = 0\n", "defaults.max_steps"),
    ("[defaults]\nmax_cost_eur = -1\n", "defaults.max_cost_eur"),
    ("[defaults]\nmax_wall_s = 0\n", "defaults.max_wall_s"),
    ("[defaults]\nmax_cost_eur = nan\n", "defaults.max_cost_eur"),
    ("[defaults]\nmax_wall_s = inf\n", "defaults.max_wall_s"),
    ("[daemon]\ntick_s = nan\n", "daemon.tick_s"),
    ("[defaults]\nheartbeat_timeout_s = -5\n", "defaults.heartbeat_timeout_s"),
    ("[defaults]\non_rate = \"kill\"\n", "defaults.on_rate"),
    ("[defaults]\nruns_may_raise = \"yes\"\n", "defaults.runs_may_raise"),
    ("[agents.support-bot]\nmax_tool_calls = 0\n", "agents.support-bot.max_tool_calls"),
    ("[agents.support-bot]\nmax_tokenz = 10\n", "agents.support-bot.max_tokenz"),
    ("[defaults]\nmax_tokens = 0\n", "defaults.max_tokens"),
    ("[defaults]\nmax_tokens = 1.5\n", "defaults.max_tokens"),
    ("[agents.support-bot]\non_rate = 1\n", "agents.support-bot.on_rate"),
    ("agents = 3\n", "agents"),
    ("[daemon]\ntick_s = 0\n", "daemon.tick_s"),
    ("[daemon]\nterm_grace_s = -1\n", "daemon.term_grace_s"),
    ("[daemon]\nallowed_users = \"agents\"\n", "daemon.allowed_users"),
    ("[daemon]\npoll = 1\n", "daemon.poll"),
    ("[store]\nurl = 5\n", "store.url"),
    ("[store]\nrecord_args = 1\n", "store.record_args"),
    ("[circuit]\nerrors = 0\n", "circuit.errors"),
    ("[circuit]\nerrors = 2.5\n", "circuit.errors"),
    ("[circuit.tools.search]\nopen_s = -1\n", "circuit.tools.search.open_s"),
    ("[alerts]\nurls = \"slack://T/B/X\"\n", "alerts.urls"),
    ("[alerts]\nurl = []\n", "alerts.url"),
    ("[prices.\"gpt-x\"]\ninput_eur_per_mtok = 1\n", "output_eur_per_mtok"),
    ("[prices.\"gpt-x\"]\ninput_eur_per_mtok = -1\noutput_eur_per_mtok = 1\n", "input_eur_per_mtok"),
    ("[prices.\"gpt-x\"]\ninput_eur_per_mtok = 1\noutput_eur_per_mtok = 1\ncached = 1\n", "cached"),
    ("[metrics]\nlisten = \"nowhere\"\n", "metrics.listen"),
    ("[store]\nrecord_errors = \"full\"\n", "store.record_errors"),
    ("[daemon]\nsocket = \"attest.sock\"\n", "daemon.socket"),
    ("[daemon]\nkey_file = 3\n", "daemon.key_file"),
    ("[alerts]\nurls_file = 3\n", "alerts.urls_file"),
    ("[pricing]\neur_per_usd = 0\n", "pricing.eur_per_usd"),
    ("[pricing]\nbudget_tz = \"Mars/Olympus\"\n", "pricing.budget_tz"),
    ("[pricing]\nrate = 1\n", "pricing.rate"),
    ("[drift]\nwindow_s = 60\n", "drift.window_s"),
    ("[drift]\nmin_runs = 0\n", "drift.min_runs"),
    ("[drift]\nfactor = -1\n", "drift.factor"),
    ("[[budgets]]\nmax_cost_eur_per_day = 1.0\n", "budgets[0].labels"),
    ("[[budgets]]\nlabels = { tenant = \"a\" }\n", "budgets[0]"),
    ("[[budgets]]\nlabels = { tenant = 3 }\nmax_cost_eur_per_day = 1.0\n", "budgets[0].labels"),
    ("[[budgets]]\nlabels = { tenant = \"a\" }\nmax_cost_eur_per_day = 1.0\nwarn_at = 2\n", "budgets[0].warn_at"),
    ("budgets = 3\n", "[[budgets]]"),
    ("[defaults]\nwarn_at = 1.5\n", "defaults.warn_at"),
    ("[defaults]\nmax_cost_eur_per_day = -1\n", "defaults.max_cost_eur_per_day"),
    ("[prices.\"m\"]\ninput_eur_per_mtok = 1\noutput_eur_per_mtok = 1\ncached_input_eur_per_mtok = -1\n",
     'prices."m".cached_input_eur_per_mtok'),
    ("[daemon]\nalert_expire_s = 0\n", "daemon.alert_expire_s"),
    ("[daemon]\nalert_expire_s = \"1d\"\n", "daemon.alert_expire_s"),
    # Expiring before the first retry would dead-letter an alert a target missed once.
    ("[daemon]\nalert_retry_s = 60\nalert_expire_s = 60\n", "daemon.alert_expire_s"),
]


def _assert_one_line_naming(err: ConfigError, path: Path, key: str):
    msg = str(err)
    assert "\n" not in msg, msg
    assert msg.startswith(str(path)), msg
    assert key in msg, msg
    assert "expected" in msg or "did you mean" in msg, msg


@pytest.mark.parametrize("body,key", BAD, ids=[k + f"-{i}" for i, (_, k) in enumerate(BAD)])
def test_bad_values_raise_one_line_config_errors(tmp_path, body, key):
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load(path)
    _assert_one_line_naming(err.value, path, key)


@pytest.mark.parametrize("url", ["slack://", "nonsense", "slack://T000/B000"])
def test_unparsable_alert_urls_are_config_errors_that_do_not_echo_secrets(tmp_path, url):
    path = write(tmp_path, f'[alerts]\nurls = ["json://localhost/hook", "{url}"]\n')
    with pytest.raises(ConfigError) as err:
        load(path, url_error=url_error)
    _assert_one_line_naming(err.value, path, "alerts.urls[1]")
    if "/" in url.split("://", 1)[-1]:
        assert url.split("://", 1)[1] not in str(err.value)


def test_bad_toml_names_the_file_and_the_line(tmp_path):
    path = write(tmp_path, "[defaults]\nmax_steps = \n")
    with pytest.raises(ConfigError) as err:
        load(path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(path))
    assert "TOML" in msg and "line 2" in msg


def test_a_missing_or_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load(tmp_path / "absent.toml")
    with pytest.raises(ConfigError) as err:
        load(tmp_path)  # a directory
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value)


def test_a_config_that_is_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes("[defaults]\n# d\xe9faut\nmax_steps = 3\n".encode("latin-1"))
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


# --- check-config ---------------------------------------------------------------------------

PROFILES = """
[defaults]
max_steps = 10
max_cost_eur = 1.5

[agents.support-bot]
max_tool_calls = 20

[agents.researcher]
max_steps = 25
max_wall_s = 900
"""


def test_check_config_prints_every_agents_effective_profile(tmp_path):
    path = write(tmp_path, PROFILES)
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert str(path) in out and "OK" in out
    # One line per profile: [defaults] in full (wrapped at 100 columns), each agent's own values.
    assert max(len(line) for line in out.splitlines() if line.startswith(("  [", "      "))) <= 100
    defaults = " ".join(ln.strip() for ln in out.splitlines() if ln.startswith(("  [defaults]", "      ")))
    assert "max_steps=10" in defaults and "max_tool_calls=40" in defaults and "max_cost_eur=1.5" in defaults
    (bot,) = [ln for ln in out.splitlines() if ln.startswith("  [agents.support-bot]")]
    assert bot == "  [agents.support-bot] max_tool_calls=20; the rest as [defaults]"
    (researcher,) = [ln for ln in out.splitlines() if ln.startswith("  [agents.researcher]")]
    assert researcher == "  [agents.researcher] max_steps=25 max_wall_s=900.0; the rest as [defaults]"


def test_check_config_never_prints_the_store_password(tmp_path):
    path = write(tmp_path, '[store]\nurl = "postgresql+psycopg://watchdog:s3cr3t-pw@db.internal:5432/runs"\n')
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert result.exit_code == 0, result.output
    assert "s3cr3t-pw" not in result.output
    assert "watchdog:***@db.internal" in result.stdout


def test_check_config_json_has_the_merged_profiles(tmp_path):
    path = write(tmp_path, PROFILES)
    result = CliRunner().invoke(main, ["check-config", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["agents"]["support-bot"] == {**data["defaults"], "max_tool_calls": 20}
    assert data["agents"]["researcher"]["max_cost_eur"] == 1.5


def test_check_config_takes_the_file_from_the_option_or_the_environment(tmp_path):
    path = write(tmp_path, PROFILES)
    by_option = CliRunner().invoke(main, ["--config", str(path), "check-config"])
    by_env = CliRunner().invoke(main, ["check-config"], env={"AGENT_WATCHDOG_CONFIG": str(path)})
    for result in (by_option, by_env):
        assert result.exit_code == 0, result.output
        assert "[agents.researcher]" in result.stdout


@pytest.mark.parametrize("body,key", [BAD[1], BAD[5], BAD[9], ("[defaults\nmax_steps = 3\n", "TOML")])
def test_check_config_error_is_one_line_exit_2_no_traceback(tmp_path, body, key):
    path = write(tmp_path, body)
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0] and key in lines[0]
    assert "Traceback" not in result.output


def test_alert_urls_file_is_read_from_the_credentials_directory_when_alerts_are_sent(tmp_path, monkeypatch):
    from watchdog.core.config import alert_urls

    cfg_path = tmp_path / "etc" / "config.toml"
    cfg_path.parent.mkdir()
    cfg_path.write_text('[alerts]\nurls = ["json://a.example.org/x"]\nurls_file = "alert-urls"\n')
    cfg = load(cfg_path)  # loading reads no secret: an operator without the credential can still load it
    assert cfg.alert_urls == ("json://a.example.org/x",) and cfg.alert_urls_file == "alert-urls"
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(ConfigError, match=r"alerts.urls_file: cannot read .*/etc/alert-urls \(No such file"):
        alert_urls(cfg)
    # issue 36: the daemon started by hand with the unit's credential name still runs (one error line)
    from watchdog.daemon.alerts.notify import daemon_alert_urls

    assert daemon_alert_urls(cfg) == ("json://a.example.org/x",)
    assert parse(tomllib.loads("[alerts]\nurls_file = \"\"\n")).alert_urls_file is None  # "" = none, as absent
    (tmp_path / "etc" / "alert-urls").write_text("# next to the config\njson://b.example.org/y\n")
    assert alert_urls(cfg) == ("json://a.example.org/x", "json://b.example.org/y")
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "alert-urls").write_text("mailtos://u:secret@mail.example.org?to=o@example.org\n\n# comment\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))  # under systemd's LoadCredential=
    assert alert_urls(cfg) == ("json://a.example.org/x", "mailtos://u:secret@mail.example.org?to=o@example.org")
    (creds / "alert-urls").write_text("no scheme here secret\n")
    with pytest.raises(ConfigError, match="line 1: expected an apprise URL") as bad:
        alert_urls(cfg)
    assert "secret" not in str(bad.value)


def test_daemon_socket_and_key_file_default_to_the_units_directories(tmp_path, monkeypatch):
    for var in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY"):  # tests/conftest.py sets them: as root, no unit
        monkeypatch.delenv(var, raising=False)
    cfg = parse({})
    assert (cfg.daemon.socket, cfg.daemon.key_file) == ("/run/agent-watchdog/attest.sock",
                                                        "/var/lib/agent-watchdog/attest.key")
    cfg = parse({"daemon": {"socket": "/tmp/x/s.sock", "key_file": "/tmp/x/k"}, "store": {"record_errors": "class"}})
    assert (cfg.daemon.socket, cfg.daemon.key_file, cfg.store.record_errors) == ("/tmp/x/s.sock", "/tmp/x/k", "class")


@pytest.mark.parametrize("body,key,meant", [
    ("[defaults]\nmax_step = 3\n", "defaults.max_step", "max_steps"),
    ("[daemon]\ntick = 1\n", "daemon.tick", "tick_s"),
    ("[stor]\nurl = \"sqlite:///x.db\"\n", "stor", "store"),
    ("[agents.support-bot]\nmax_tool_call = 3\n", "agents.support-bot.max_tool_call", "max_tool_calls"),
    ("[circuit]\nerror = 3\n", "circuit.error", "errors"),
])
def test_a_typo_names_the_key_that_was_meant(tmp_path, body, key, meant):
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value) == f"{path}: {key}: unknown key; did you mean {meant!r}?"


def test_a_key_like_no_other_lists_the_known_ones(tmp_path):
    path = write(tmp_path, "[daemon]\nzzz = 1\n")
    with pytest.raises(ConfigError) as err:
        load(path)
    assert "expected one of the known keys (alert_expire_s, alert_retry_s, allowed_users" in str(err.value)


def test_money_keys_parse_and_publish(tmp_path):
    from watchdog.core.periods import LabelBudget

    path = write(tmp_path, '[pricing]\neur_per_usd = 0.9\nbudget_tz = "Europe/Paris"\n\n'
                           '[defaults]\nmax_cost_eur_per_day = 10.0\nwarn_at = 0.5\n\n'
                           '[agents.free]\nmax_cost_eur_per_day = 0\n\n'
                           '[[budgets]]\nlabels = { tenant = "acme" }\nmax_cost_eur_per_month = 100.0\n\n'
                           '[drift]\nwindow_s = 1800\nfactor = 0\n\n'
                           '[prices."m"]\ninput_eur_per_mtok = 1\noutput_eur_per_mtok = 4\ncached_input_eur_per_mtok = 0.1\n')
    cfg = load(path)
    assert (cfg.pricing.eur_per_usd, cfg.pricing.budget_tz) == (0.9, "Europe/Paris")
    assert (cfg.profile("x").max_cost_eur_per_day, cfg.profile("x").warn_at) == (10.0, 0.5)
    assert cfg.profile("free").max_cost_eur_per_day == 0  # 0 = no daily budget
    assert cfg.budgets == (LabelBudget({"tenant": "acme"}, max_cost_eur_per_month=100.0),)
    assert (cfg.drift.window_s, cfg.drift.factor, cfg.drift.min_runs) == (1800, 0, 10)
    assert cfg.prices["m"].cost_eur(1_000_000, 0, 500_000) == pytest.approx(0.55)
    # What the daemon publishes, read back as the SDK and the CLI read it.
    back = load(None).with_published(cfg.published())
    assert back.pricing == cfg.pricing and back.budgets == cfg.budgets and back.prices == cfg.prices
    assert back.profile("free").max_cost_eur_per_day == 0

