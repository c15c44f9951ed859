"""The systemd unit and the example config shipped in systemd/.

(a) `systemd-analyze verify` prints nothing for the unit;
(b) `systemd-analyze security --offline=true` stays at or below the score
    stated in the unit's header comment;
(c) the example config is valid TOML, names every public key, and (when the
    package is importable) the daemon's own parser accepts it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

import scratch_root

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD_DIR / "agent-watchdog.service"
EXAMPLE = SYSTEMD_DIR / "config.example.toml"

INSTALLED_EXEC = "/opt/agent-watchdog/venv/bin/agent-watchdog"

# The lowest exposure reached (systemd 252). `--threshold` takes an integer on
# the 0..100 scale that `security` prints divided by ten: 16 means "1.6".
SECURITY_SCORE = "1.6"
SECURITY_THRESHOLD = 16

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (package systemd)"
)


def _systemd_version() -> int:
    out = subprocess.run(
        [SYSTEMD_ANALYZE, "--version"], capture_output=True, text=True, check=True
    ).stdout
    m = re.match(r"systemd (\d+)", out)
    assert m, f"unexpected `systemd-analyze --version` output: {out!r}"
    return int(m.group(1))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        # Log to our captured stderr, never to the journal or /dev/kmsg where
        # a finding would be lost and the test would pass by accident.
        SYSTEMD_LOG_TARGET="console",
        # info, not debug: a caller's SYSTEMD_LOG_LEVEL=debug must not turn the
        # manager's chatter into a failure; every finding is logged at
        # warning or error level, so nothing is hidden.
        SYSTEMD_LOG_LEVEL="info",
        SYSTEMD_LOG_COLOR="0",
        SYSTEMD_COLORS="0",
        SYSTEMD_URLIFY="0",
        SYSTEMD_PAGER="cat",
        PAGER="cat",
    )
    # Not running under systemd: nothing may try to notify a manager.
    env.pop("NOTIFY_SOCKET", None)
    return env


def _real_executable() -> str:
    script = Path(sys.executable).with_name("agent-watchdog")
    if script.is_file() and os.access(script, os.X_OK):
        return str(script)
    return sys.executable


def _staged_unit(tmp_path: Path, extra: str = "") -> Path:
    """A copy of the unit whose ExecStart binary exists on this machine.

    `verify` checks that ExecStart's command is an executable file and says
    "Command ... is not executable" otherwise. The unit names the installed
    path /opt/agent-watchdog/venv/bin/agent-watchdog, which does not exist on
    a test machine, so the copy points ExecStart at a real executable: the
    `agent-watchdog` console script of this interpreter's environment if it is
    installed, else the interpreter itself. Everything else is byte-for-byte
    the shipped unit, and the file keeps its name (verify derives the unit
    name and type from it).
    """
    text = UNIT.read_text(encoding="utf-8")
    assert text.count(f"ExecStart={INSTALLED_EXEC} ") == 1, "ExecStart no longer names the installed path"
    text = text.replace(f"ExecStart={INSTALLED_EXEC} ", f"ExecStart={_real_executable()} ")
    if extra:
        text = text.replace("[Service]\n", f"[Service]\n{extra}\n", 1)
    staged = tmp_path / "unit" / UNIT.name
    staged.parent.mkdir()
    staged.write_text(text, encoding="utf-8")
    return staged


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SYSTEMD_ANALYZE, *args],
        capture_output=True,
        text=True,
        errors="replace",
        env=_env(),
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def _verify(unit: Path) -> subprocess.CompletedProcess:
    # --man=no: the unit has no man: Documentation= and containers ship no man
    # pages. Generators are off by default for verify.
    return _run("verify", "--man=no", str(unit))


# --- (a) verify ---------------------------------------------------------------


@needs_analyze
def test_verify_prints_nothing(tmp_path):
    result = _verify(_staged_unit(tmp_path))
    output = result.stdout + result.stderr
    assert output == "", f"systemd-analyze verify said:\n{output}"
    assert result.returncode == 0


@needs_analyze
def test_verify_output_is_captured(tmp_path):
    # Negative control: a broken copy must produce output here, so the test
    # above cannot pass just because the messages went somewhere else.
    result = _verify(_staged_unit(tmp_path, extra="NoSuchDirective=yes"))
    assert "NoSuchDirective" in result.stdout + result.stderr


# --- (b) security -------------------------------------------------------------


@needs_analyze
def test_security_score(tmp_path):
    version = _systemd_version()
    if version < 252:
        pytest.skip(f"systemd-analyze security --offline needs systemd >= 252, this is {version}")
    unit = _staged_unit(tmp_path)
    result = _run("security", "--no-pager", "--offline=true", f"--threshold={SECURITY_THRESHOLD}", str(unit))
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", result.stdout)
    assert m, f"no overall exposure in:\n{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, (
        f"exposure {m.group(1)} is over {SECURITY_THRESHOLD / 10}:\n{result.stdout}\n{result.stderr}"
    )
    assert float(m.group(1)) <= SECURITY_THRESHOLD / 10


def test_unit_header_states_the_score():
    assert SECURITY_THRESHOLD == round(float(SECURITY_SCORE) * 10)
    header = UNIT.read_text(encoding="utf-8").split("[Unit]")[0]
    prose = " ".join(line.lstrip("#").strip() for line in header.splitlines())
    assert f"rates this unit {SECURITY_SCORE} (OK)" in prose
    assert f"--threshold={SECURITY_THRESHOLD} " in prose


def _directives(path: Path) -> dict[tuple[str, str], list[str]]:
    section, out = "", {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault((section, key.strip()), []).append(value.strip())
    return out


def test_unit_keeps_what_the_job_needs():
    """Hardening must not break the job: guard the directives that matter."""
    d = _directives(UNIT)
    svc = {k: v for (s, k), v in d.items() if s == "Service"}
    assert svc["Type"] == ["notify"]
    assert svc["NotifyAccess"] == ["main"]
    assert svc["WatchdogSec"] == ["60"]
    assert svc["ExecStart"] == [f"{INSTALLED_EXEC} run --config /etc/agent-watchdog/config.toml"]
    assert svc["Environment"] == ["AGENT_WATCHDOG_CONFIG=/etc/agent-watchdog/config.toml"]
    assert svc["User"] == svc["Group"] == ["agent-watchdog"]
    # Signalling agents of other users: CAP_KILL and only CAP_KILL.
    assert svc["AmbientCapabilities"] == ["CAP_KILL"]
    assert svc["CapabilityBoundingSet"] == ["CAP_KILL"]
    # Seeing the agents' processes and /proc/stat (btime), signalling across users.
    for forbidden in ("ProtectProc", "ProcSubset", "PrivateUsers", "DynamicUser", "PrivateNetwork"):
        assert forbidden not in svc, f"{forbidden}= would break the daemon (see the unit's comments)"
    assert svc["StateDirectory"] == ["agent-watchdog"]
    # The state directory is the daemon's (its sealing key); agents only traverse it to store/.
    assert svc["StateDirectoryMode"] == ["0711"]
    # Two groups: the daemon's own reads the config, the store's is shared with the agents.
    assert svc["SupplementaryGroups"] == ["agent-watchdog-store"]
    # The alert URLs reach the daemon as a credential, never through a file an agent can read.
    assert svc["LoadCredential"] == ["alert-urls:/etc/agent-watchdog/alert-urls"]
    # The attestation socket's directory.
    assert (svc["RuntimeDirectory"], svc["RuntimeDirectoryMode"]) == (["agent-watchdog"], ["0755"])
    assert svc["SystemCallFilter"][0] == "@system-service"


# --- (c) example config ---------------------------------------------------------

PUBLIC_KEYS = {
    "store": {"url", "record_args", "record_errors", "keep_days"},
    "daemon": {"tick_s", "cancel_grace_s", "term_grace_s", "allowed_users", "alert_retry_s", "alert_expire_s", "socket",
               "key_file", "state_dir"},
    "defaults": {
        "max_wall_s",
        "max_steps",
        "max_tool_calls",
        "max_cost_eur",
        "max_identical_calls",
        "heartbeat_timeout_s",
        "max_tool_calls_per_min",
        "on_rate",
        "on_breach",
        "approval_timeout_s",
        "dedupe_window_s",
        "runs_may_raise",
        "owners",
        "max_tokens",
        "max_cost_eur_per_day",
        "max_cost_eur_per_month",
        "warn_at",
    },
    "circuit": {"errors", "window_s", "open_s", "max_calls_per_min"},
    "otlp": {"listen", "kill_mode", "max_request_bytes", "tokens_file", "allow_anonymous", "max_new_runs_per_min"},
    "alerts": {"urls", "urls_file"},
    "metrics": {"listen"},
    "pricing": {"eur_per_usd", "budget_tz"},
    "drift": {"window_s", "baseline_days", "factor", "min_runs"},
}
PRICE_KEYS = {"input_eur_per_mtok", "output_eur_per_mtok"}


def _example() -> dict:
    with EXAMPLE.open("rb") as f:
        return tomllib.load(f)


def test_example_passes_check_config_where_its_users_exist():
    """The real `check-config` (TOML, keys, values, alert URLs, and what the file needs from the
    host) refuses the example on a host without the user its allowed_users names, and accepts
    it once that user exists: in a scratch root (tests/scratch_root.py), where useradd writes a
    copy of /etc."""
    why = scratch_root.available()
    if why:
        pytest.skip(f"a scratch root {why}")
    cli = Path(sys.executable).with_name("agent-watchdog")
    base = Path(tempfile.mkdtemp(prefix="aw-example-root-", dir="/tmp"))
    try:
        script = ("set +e\nuserdel agents >/dev/null 2>&1\n"  # in the copy of /etc: whatever this host has
                  f'"{cli}" check-config "{EXAMPLE}"; echo "exit=$?"\n'
                  "useradd --system --shell /usr/sbin/nologin agents\n"
                  f'"{cli}" check-config "{EXAMPLE}"; echo "exit=$?"\n')
        done = scratch_root.ScratchRoot(base).run(base, [script], timeout_s=120)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"agent-watchdog: error: {EXAMPLE}: daemon.allowed_users: no user 'agents' on this host "
        "(create it, or name the user the agents run as)"]
    exits = [line for line in done.stdout.splitlines() if line.startswith("exit=")]
    assert exits == ["exit=2", "exit=0"], done.stdout
    assert f"config {EXAMPLE}: OK" in done.stdout
    assert "allowed users agents" in done.stdout


def _commented_examples() -> dict:
    """The example tables, commented out in the file (issue 36: installed as is, the example
    turns on no profile, price or budget): each `# [header]` and the `# key = value` lines after it."""
    key = re.compile(r"[A-Za-z_][\w-]*\s*=")
    found, inside = [], False
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        body = line[2:] if line.startswith("# ") else None
        if body is not None and body.startswith("["):
            inside = True
            found.append(body)
        elif inside and body is not None and key.match(body):
            found.append(body)
        else:
            inside = False
    return tomllib.loads("\n".join(found))


def test_example_turns_on_no_example_table_and_its_commented_ones_parse():
    from watchdog.core import config

    raw = _example()
    assert not {"agents", "prices", "budgets"} & set(raw) and "tools" not in raw["circuit"]
    examples = _commented_examples()
    merged = {**raw, **{k: v for k, v in examples.items() if k != "circuit"}}
    merged["circuit"] = {**raw["circuit"], **examples["circuit"]}
    parsed = config.parse(merged, str(EXAMPLE))
    assert parsed.agents["support-bot"].max_steps == 8 and "gpt-x" in parsed.prices and parsed.budgets


def test_example_names_every_public_key():
    raw = _example()
    assert set(raw) == set(PUBLIC_KEYS)
    for section, keys in PUBLIC_KEYS.items():
        have = {k for k, v in raw[section].items() if not isinstance(v, dict)}
        assert have == keys, f"[{section}]: missing {keys - have}, unknown {have - keys}"
    raw = {**raw, **_commented_examples(), "circuit": {**raw["circuit"], **_commented_examples()["circuit"]}}
    # [agents.NAME]: a profile with keys of [defaults].
    assert raw["agents"], "no example [agents.NAME] profile"
    for name, profile in raw["agents"].items():
        assert profile and set(profile) <= PUBLIC_KEYS["defaults"], name
    # [circuit.tools.NAME]: per-tool overrides.
    tools = raw["circuit"]["tools"]
    assert tools, "no example [circuit.tools.NAME]"
    for name, policy in tools.items():
        assert policy and set(policy) <= PUBLIC_KEYS["circuit"], name
    # [prices."MODEL"]
    assert raw["prices"], 'no example [prices."MODEL"]'
    for model, price in raw["prices"].items():
        assert set(price) == PRICE_KEYS, model
    # [[budgets]]: label-scoped period budgets.
    assert raw["budgets"] and all(set(b) <= {"labels", "max_cost_eur_per_day", "max_cost_eur_per_month", "warn_at"}
                                  and b["labels"] for b in raw["budgets"])


def test_example_documented_values():
    raw = _example()
    assert raw["store"] == {"url": "sqlite:////var/lib/agent-watchdog/store/runs.db", "record_args": False,
                            "record_errors": "scrubbed", "keep_days": 30}
    assert raw["daemon"] == {
        "tick_s": 5,
        "cancel_grace_s": 10,
        "term_grace_s": 5,
        "allowed_users": ["agents"],
        "alert_retry_s": 30,
        "alert_expire_s": 86400,
        "socket": "/run/agent-watchdog/attest.sock",
        "key_file": "/var/lib/agent-watchdog/attest.key",
        "state_dir": "/var/lib/agent-watchdog",
    }
    assert raw["alerts"] == {"urls": [], "urls_file": "alert-urls"}
    assert raw["defaults"] == {
        "max_wall_s": 300,
        "max_steps": 12,
        "max_tool_calls": 40,
        "max_cost_eur": 2.0,
        "max_identical_calls": 3,
        "heartbeat_timeout_s": 120,
        "max_tool_calls_per_min": 15,
        "on_rate": "alert",
        "dedupe_window_s": 0,
        "runs_may_raise": False,
        "owners": [],
        "max_tokens": 2_000_000,
        "max_cost_eur_per_day": 50.0,
        "max_cost_eur_per_month": 500.0,
        "warn_at": 0.8,
        "on_breach": "stop",
        "approval_timeout_s": 900,
    }
    assert raw["pricing"] == {"eur_per_usd": 0.86, "budget_tz": "UTC"}
    assert raw["drift"] == {"window_s": 3600, "baseline_days": 7, "factor": 3.0, "min_runs": 10}
    assert {k: raw["circuit"][k] for k in PUBLIC_KEYS["circuit"]} == {"errors": 5, "window_s": 60, "open_s": 120, "max_calls_per_min": 120}
    assert raw["metrics"] == {"listen": ""}
    assert raw["otlp"] == {"listen": "", "kill_mode": "cooperative", "max_request_bytes": 4194304, "tokens_file": "",
                           "allow_anonymous": False, "max_new_runs_per_min": 120}


def test_example_every_key_is_annotated():
    """Every block of keys follows a comment (meaning and default). Keys in one
    block share it ([circuit] errors / window_s / open_s); an example table
    ([agents.X], [circuit.tools.X], [prices."X"]) is covered by the comment
    above its header."""
    key = re.compile(r"[A-Za-z_][\w-]*\s*=")
    section = ""
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("["):
            section = line.strip("[]")
            assert lines[i - 1].startswith("#") or not section.startswith(("agents.", "circuit.tools.", "prices.")), (
                f"line {i + 1}: example table without a comment above it"
            )
            continue
        if not key.match(line):
            continue
        prev = lines[i - 1].strip()
        example_table = section.startswith(("agents.", "circuit.tools.", "prices."))
        ok = prev.startswith("#") or key.match(prev) or (example_table and prev.startswith("["))
        assert ok, f"line {i + 1} has no comment: {line!r}"


def test_example_accepted_by_the_daemon_parser():
    from watchdog.core import config

    parsed = config.parse(_example(), str(EXAMPLE))
    # The example states the built-in defaults; catch drift between the two.
    assert parsed.defaults == config.Budgets()
    assert parsed.circuit.default == config.CircuitPolicy()
    assert parsed.store == config.StoreConfig(url=parsed.store.url, record_args=False)
    assert (parsed.daemon.socket, parsed.daemon.key_file) == (d_socket := config.DEFAULT_SOCKET, config.DEFAULT_KEY_FILE)
    # The shipped credential template (systemd/alert-urls) is read next to the config, and holds no URL.
    assert config.alert_urls(parsed) == () and d_socket.startswith("/run/agent-watchdog/")
    d = config.DaemonConfig()
    assert (parsed.daemon.tick_s, parsed.daemon.cancel_grace_s, parsed.daemon.term_grace_s, parsed.daemon.alert_retry_s,
            parsed.daemon.alert_expire_s) == (
        d.tick_s,
        d.cancel_grace_s,
        d.term_grace_s,
        d.alert_retry_s,
        d.alert_expire_s,
    )
    assert parsed.metrics_listen == ""
    assert parsed.pricing == config.PricingConfig() and parsed.drift == config.DriftConfig()
