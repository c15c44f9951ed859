"""The real coding CLIs (Claude Code, Codex CLI, Gemini CLI from npm, pinned by
tests/clis/package-lock.json) run non-interactively against a fake model API on 127.0.0.1 that
answers every turn with a shell tool call (a runaway), with `agent-watchdog hook` installed by
`agent-watchdog hook install`, and one real daemon for the file (it publishes the profiles the
hooks judge by, and alerts the stops).

Hermetic: each CLI's HOME, XDG dirs and CODEX_HOME are temp dirs; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clis"))

from daemon_support import alerts_of, daemon_toml  # noqa: E402
from otlp_support import free_port  # noqa: E402
from fake_model import FakeModel  # noqa: E402
from watchdog.core.config import parse  # noqa: E402
from watchdog.store import access  # noqa: E402
from watchdog.store.engine import make_engine  # noqa: E402
from watchdog.store.hooks import judged_by  # noqa: E402
from watchdog.store.schema import runs  # noqa: E402

CLIS = Path(__file__).resolve().parents[1] / "clis"
BIN = CLIS / "node_modules" / ".bin"
AW = str(Path(sys.executable).with_name("agent-watchdog"))
OTLP_TOKEN = "coding-cli-otlp-token-7d1e9b20c4"
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/nothing_listens_here"

OTLP: list[str] = []  # the daemon's OTLP/HTTP receiver, once the `store` fixture started it
PROFILES = {"cc-otel": 40, "cc-tmux": 3, "cc-max": 3, "cc-resident": 3, "cc-loop": 20, "cc-hostile": 40, "cc-kill": 40, "codex-max": 3, "codex-otel": 8, "gemini-max": 3, "gemini-loop": 20, "codex-loop": 20, "gemini-otel": 4}

pytestmark = pytest.mark.skipif(not (BIN / "claude").exists(),
                                reason="the coding CLIs are not installed: cd tests/clis && npm ci")


def wait_for(fn: Callable, timeout_s: float = 30.0, every_s: float = 0.1):
    end = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got or time.monotonic() > end:
            return got
        time.sleep(every_s)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(store URL, config path, engine) with one real `agent-watchdog run` daemon on it."""
    folder = tmp_path_factory.mktemp("coding-clis")
    url = f"sqlite:///{folder / 'runs.db'}"
    engine = make_engine(url)
    access.upgrade(engine)
    cfg = folder / "watchdog.toml"
    port = free_port()
    tokens = folder / "otlp-tokens"  # the receiver refuses senders without a token (allow_anonymous = false)
    tokens.write_text(f"{OTLP_TOKEN} agent=cc-otel,cc-cost,cc-claim,cc-steps,claude-code,codex-otel,gemini-otel owner=tests\n")
    tokens.chmod(0o600)
    cfg.write_text(daemon_toml(tick_s=0.25) + f'[otlp]\nlisten = "127.0.0.1:{port}"\ntokens_file = "{tokens}"\n' + "".join(
        f"[agents.{name}]\nmax_tool_calls = {n}\n" for name, n in PROFILES.items())
        + '[agents.cc-pause]\nmax_tool_calls = 2\non_breach = "pause"\n'
        + "[agents.cc-cost]\nmax_tool_calls = 40\nmax_cost_eur = 0.002\n"
        + "[agents.cc-steps]\nmax_tool_calls = 40\nmax_steps = 3\n"
        + "[agents.cc-claim]\nmax_tool_calls = 40\nmax_cost_eur = 0.002\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_WATCHDOG")}
    log = open(folder / "daemon.log", "w")
    daemon = subprocess.Popen([AW, "--config", str(cfg), "--db", url, "run"], env=env, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        # The hooks judge by what the daemon published: wait for it.
        published = wait_for(lambda: judged_by(engine, parse({})).profile("cc-max").max_tool_calls == 3, 30)
        assert published, (folder / "daemon.log").read_text()[-2000:]
        OTLP[:] = [f"http://127.0.0.1:{port}"]
        yield url, cfg, engine
    finally:
        daemon.terminate()
        assert daemon.wait(30) == 0, (folder / "daemon.log").read_text()[-2000:]
        log.close()
        engine.dispose()


@pytest.fixture(scope="module")
def runtime():
    """A short XDG_RUNTIME_DIR for the hooks' resident helpers (a socket path has 107 bytes at
    most); each helper started is stopped at the end by the pid it wrote there."""
    folder = tempfile.mkdtemp(prefix="awhk")
    try:
        yield folder
    finally:
        for pid_file in Path(folder).rglob("*.sock.pid"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        shutil.rmtree(folder, ignore_errors=True)


def hook_run(engine, agent: str):
    with engine.connect() as conn:
        # source hook (log events never make the hook's run; a session with no hook would be otlp)
        rows = conn.execute(select(runs).where(runs.c.agent == agent, runs.c.source.in_(("hook", "otlp")))).all()
    return rows[0] if len(rows) == 1 else None


RUNTIME: list[str] = []  # the module's runtime dir, set by the `cli_env` fixture


@pytest.fixture(autouse=True)
def cli_env(runtime):
    RUNTIME[:] = [runtime]


def home_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    home = tmp_path / "home"
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(home), "TERM": "dumb",
           "XDG_RUNTIME_DIR": RUNTIME[0], "AGENT_WATCHDOG_HOOK_IDLE_S": "60"}
    for key, sub in (("XDG_CONFIG_HOME", ".config"), ("XDG_DATA_HOME", ".local/share"),
                     ("XDG_CACHE_HOME", ".cache"), ("XDG_STATE_HOME", ".local/state")):
        env[key] = str(home / sub)
        (home / sub).mkdir(parents=True, exist_ok=True)
    env.update(extra)
    return env


def install(cli: str, where: list[str], env: dict[str, str], *args: str) -> str:
    done = subprocess.run([AW, "hook", "install", cli, *where, "--exe", AW, *args], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def claude(tmp_path: Path, model: FakeModel, *, db: str, agent: str, max_turns: int, fail_closed: bool = False,
           otlp: str | None = None, model_name: str | None = None):
    proj = tmp_path / "proj"
    proj.mkdir(parents=True)
    env = home_env(tmp_path, ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="sk-fake", DISABLE_TELEMETRY="1",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1")
    out = install("claude-code", ["--project", str(proj)], env, "--agent", agent, "--hook-db", db,
                  *(["--fail-closed"] if fail_closed else []),
                  *(["--otlp", otlp, "--otlp-token", OTLP_TOKEN] if otlp else []))
    env["OTEL_LOGS_EXPORT_INTERVAL"] = "200"  # ms: the events of a short session arrive before it ends
    assert "+ hooks.PreToolUse" in out
    done = subprocess.run([str(BIN / "claude"), "-p", "touch the markers", "--allowedTools", "Bash",
                           "--output-format", "json", "--max-turns", str(max_turns),
                           *(["--model", model_name] if model_name else [])], cwd=proj, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    return proj, done


def markers(proj: Path) -> set[int]:
    return {int(p.name.split("-")[1]) for p in proj.glob("marker-*")}


def stopped_alert(engine, run_id: str, tool: str) -> bool:
    found = [a for a in alerts_of(engine, run_id) if tool in a.body]
    return len(found) == 1 and len(alerts_of(engine, run_id)) == 1


# --- Claude Code --------------------------------------------------------------------------------

def test_claude_code_is_refused_at_max_tool_calls_and_alerted(store, tmp_path):
    url, _, engine = store
    with FakeModel(lambda n: f"touch marker-{n}") as model:
        proj, done = claude(tmp_path, model, db=url, agent="cc-max", max_turns=6)
    assert markers(proj) == {1, 2, 3}, done.stdout[-2000:]  # the 4th call never ran
    run = hook_run(engine, "cc-max")
    assert run is not None and (run.status, run.stop_reason, run.tool_calls) == ("killed", "max_tool_calls", 3)
    told = model.texts()  # the refusal is what the model read as the tool's result
    assert "agent-watchdog: run " in told and "max_tool_calls" in told
    result = json.loads(done.stdout)
    assert result["permission_denials"] and result["permission_denials"][0]["tool_input"]["command"] == "touch marker-4"
    # Once the model read the refusal, the session ended (PostToolBatch's continue: false), not
    # at --max-turns: the 5th call, refused again, was the last.
    assert model.calls == 5 and result.get("terminal_reason") == "hook_stopped", done.stdout[-2000:]
    assert [d["tool_input"]["command"] for d in result["permission_denials"]] == ["touch marker-4", "touch marker-5"]
    assert wait_for(lambda: stopped_alert(engine, run.id, "Bash"), 30)


def test_claude_code_logs_and_hooks_are_one_run_each_call_counted_once(store, tmp_path):
    """`hook install --otlp` turns Claude Code's log export on: its api_request events are the
    run's steps (tokens, model) and its tool_result events the same calls the hook counted."""
    url, _, engine = store
    with FakeModel(lambda n: f"touch marker-{n}") as model:
        proj, done = claude(tmp_path, model, db=url, agent="cc-otel", max_turns=3, otlp=OTLP[0])
    assert markers(proj) == {1, 2, 3}, done.stdout[-2000:]
    run = wait_for(lambda: (r := hook_run(engine, "cc-otel")) is not None and r.steps >= 3 and r, 30)
    assert run, hook_run(engine, "cc-otel")
    assert (run.steps, run.tool_calls, run.tokens_in, run.tokens_out) == (3, 3, 300, 60)
    assert wait_for(lambda: (r := hook_run(engine, "cc-otel")) is not None and r.cost_eur > 0, 30)  # priced by model
    assert [p for p, _ in model.requests if p == "/v1/logs"] == []  # they went to the daemon, not the model


def test_claude_code_over_max_cost_from_its_own_log_events_is_stopped(store, tmp_path):
    """The cost is the daemon's, from the api_request events Claude Code exported (each step
    ~0.0009 EUR as priced from its model): over max_cost_eur the daemon stops the run and the
    hook refuses the session's next call naming max_cost."""
    url, _, engine = store

    def slow(n: int) -> str:
        time.sleep(0.6)  # a model that takes its time: the tick prices and judges between turns
        return f"touch marker-{n}"

    with FakeModel(slow) as model:
        proj, done = claude(tmp_path, model, db=url, agent="cc-cost", max_turns=12, otlp=OTLP[0])
    run = hook_run(engine, "cc-cost")
    assert run is not None and run.stop_reason == "max_cost", (run, done.stdout[-1500:])
    ran = markers(proj)
    assert 3 <= len(ran) < 12 and ran == set(range(1, len(ran) + 1)), ran
    assert "agent-watchdog: run " in model.texts() and "max_cost" in model.texts()


def test_claude_code_claimed_cost_counts_for_a_model_no_price_table_knows(store, tmp_path):
    """A model genai-prices and [prices] do not know: its tokens were unpriced and max_cost_eur
    never fired. Claude Code's api_request events claim their cost (`cost_usd`): for such a model
    that claim is the run's cost (in EUR at [pricing] eur_per_usd), so the daemon stops the run
    over max_cost_eur and the hook refuses the session's next call naming max_cost."""
    url, cfg, engine = store

    def slow(n: int) -> str:
        time.sleep(0.6)  # the tick judges between turns
        return f"touch marker-{n}"

    with FakeModel(slow) as model:
        proj, done = claude(tmp_path, model, db=url, agent="cc-claim", max_turns=12, otlp=OTLP[0],
                            model_name="claude-unpriced-test-model-7")
    (run,) = runs_json(url, cfg, "cc-claim")
    assert (run["source"], run["stop_reason"]) == ("hook", "max_cost"), (run, done.stdout[-1500:])
    assert run["cost_eur"] > 0 and run["cost_unpriced_tokens"] == 0, run
    ran = markers(proj)
    assert 1 <= len(ran) < 12, ran
    assert "max_cost" in model.texts()


def test_claude_code_over_max_steps_from_its_log_events_is_stopped_and_its_session_ends(store, tmp_path):
    """Steps are what only the log events tell (each api_request): past max_steps the daemon stops
    the run, the hook refuses the next call naming max_steps, and the session then ends."""
    url, cfg, engine = store

    def slow(n: int) -> str:
        time.sleep(0.6)  # the tick judges between turns
        return f"touch marker-{n}"

    with FakeModel(slow) as model:
        proj, done = claude(tmp_path, model, db=url, agent="cc-steps", max_turns=12, otlp=OTLP[0])
    (run,) = runs_json(url, cfg, "cc-steps")
    assert (run["source"], run["stop_reason"]) == ("hook", "max_steps"), (run, done.stdout[-1500:])
    ran = markers(proj)
    assert 3 <= len(ran) < 11 and ran == set(range(1, len(ran) + 1)), ran
    assert "agent-watchdog: run " in model.texts() and "max_steps" in model.texts()
    assert json.loads(done.stdout).get("terminal_reason") == "hook_stopped", done.stdout[-1500:]
    assert wait_for(lambda: stopped_alert(engine, run["id"], "Bash"), 30)


def test_an_interactive_claude_code_session_under_tmux_is_stopped_the_same_way(store, tmp_path):
    url, _, engine = store
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    proj = tmp_path / "proj"
    proj.mkdir()
    key = "sk-fake-key-for-the-interactive-test-0123456789"
    env = home_env(tmp_path, ANTHROPIC_API_KEY=key, DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                   DISABLE_AUTOUPDATER="1", TERM="xterm-256color")
    # What a returning user has answered once: onboarding done, this folder trusted, this key approved.
    (tmp_path / "home" / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True, "theme": "dark",
        "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
        "projects": {str(proj): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}}}))
    install("claude-code", ["--project", str(proj)], env, "--agent", "cc-tmux", "--hook-db", url)
    tmux = ["tmux", "-L", f"aw-{os.getpid()}", "-f", "/dev/null"]  # a server of the test's own
    with FakeModel(lambda n: f"touch marker-{n}") as model:
        env["ANTHROPIC_BASE_URL"] = model.url
        argv = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), str(BIN / "claude"), "--allowedTools", "Bash"]
        subprocess.run([*tmux, "new-session", "-d", "-s", "cc", "-x", "200", "-y", "50", "-c", str(proj),
                        " ".join(shlex.quote(a) for a in argv)], check=True, timeout=30)
        try:
            def screen() -> str:
                return subprocess.run([*tmux, "capture-pane", "-p", "-t", "cc"], capture_output=True, text=True,
                                      timeout=10).stdout

            assert wait_for(lambda: "❯" in screen(), 60), screen()
            subprocess.run([*tmux, "send-keys", "-t", "cc", "touch the markers", "Enter"], check=True, timeout=10)
            shown = wait_for(lambda: "agent-watchdog: run " in screen() and "max_tool_calls" in screen(), 60)
            assert shown, screen()
            subprocess.run([*tmux, "send-keys", "-t", "cc", "Escape"], timeout=10)
        finally:
            subprocess.run([*tmux, "kill-server"], timeout=10)
    assert len(markers(proj)) == 3, markers(proj)
    run = hook_run(engine, "cc-tmux")
    assert run is not None and (run.status, run.stop_reason, run.tool_calls) == ("killed", "max_tool_calls", 3)


def runs_json(url: str, cfg: Path, agent: str) -> list[dict]:
    """`agent-watchdog runs --all --json --agent NAME`: what a user reads."""
    done = subprocess.run([AW, "--db", url, "--config", str(cfg), "runs", "--all", "--json", "--agent", agent],
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_claude_code_looping_on_one_failing_call_is_stopped_and_its_session_ends(store, tmp_path):
    url, cfg, engine = store
    with FakeModel(lambda n: "echo ran >> calls.log; exit 3") as model:
        proj, done = claude(tmp_path, model, db=url, agent="cc-loop", max_turns=8)
    assert (proj / "calls.log").read_text().splitlines() == ["ran", "ran"], done.stdout[-2000:]
    (run,) = runs_json(url, cfg, "cc-loop")
    assert (run["source"], run["status"], run["stop_reason"]) == ("hook", "killed", "loop_detected"), run
    assert (run["tool_calls"], run["tool_errors"]) == (2, 2), run  # PostToolUseFailure: each failure once
    # The hook writes a call's event before it runs; its failure, heard after, is appended as its
    # result: an error of its tool, once (PostToolUseFailure's tool_use_id), in runs and the alert.
    assert run["top_tool"] == {"name": "Bash", "calls": 2, "errors": 2}, run
    assert "agent-watchdog: run " in model.texts() and "loop_detected" in model.texts()
    # The model read the refusal once; the next refused batch ended the session (not --max-turns).
    assert model.calls == 4 and json.loads(done.stdout).get("terminal_reason") == "hook_stopped", done.stdout[-2000:]
    assert wait_for(lambda: stopped_alert(engine, run["id"], "Bash"), 30)
    assert "×2 (100%), 2 errors" in alerts_of(engine, run["id"])[0].body


def test_claude_code_killed_mid_session_is_refused_naming_manual(store, tmp_path):
    url, cfg, engine = store

    def command(n: int) -> str:
        if n == 3:  # between the CLI's 2nd and 3rd tool call, an operator kills the run
            run = hook_run(engine, "cc-kill")
            subprocess.run([AW, "--db", url, "--config", str(cfg), "kill", run.id], check=True,
                           capture_output=True, timeout=30)
        return f"touch marker-{n}"

    with FakeModel(command) as model:
        proj, done = claude(tmp_path, model, db=url, agent="cc-kill", max_turns=4)
    assert markers(proj) == {1, 2}, done.stdout[-2000:]
    assert "manual" in model.texts() and "agent-watchdog: run " in model.texts()
    run = hook_run(engine, "cc-kill")
    assert run is not None and run.stop_reason == "manual"


def test_claude_code_paused_then_resumed_with_five_more_calls(store, tmp_path):
    url, cfg, engine = store
    resumed = []

    def command(n: int) -> str:
        if n == 4:  # the 3rd call was refused and the run paused: a human lets it do 5 more
            run = wait_for(lambda: (r := hook_run(engine, "cc-pause")) is not None and r.status == "paused" and r, 30)
            assert run, "the run was not paused"
            done = subprocess.run([AW, "--db", url, "--config", str(cfg), "resume", run.id, "--add-tool-calls", "5"],
                                  capture_output=True, text=True, timeout=30)
            resumed.append(done)
        return f"touch marker-{n}"

    with FakeModel(command) as model:
        proj, done = claude(tmp_path, model, db=url, agent="cc-pause", max_turns=10)
    assert resumed and resumed[0].returncode == 0, resumed and resumed[0].stderr
    assert markers(proj) == {1, 2, 4, 5, 6, 7, 8}, done.stdout[-2000:]  # 3 and 9 were held
    assert "paused: waiting for approval" in model.texts()
    run = hook_run(engine, "cc-pause")
    assert run is not None and (run.status, run.tool_calls) == ("paused", 7)


def test_claude_code_with_the_store_unreachable_fails_open_unless_fail_closed(tmp_path):
    with FakeModel(lambda n: f"touch marker-{n}") as model:
        proj, done = claude(tmp_path / "open", model, db=UNREACHABLE, agent="cc-open", max_turns=3)
    assert markers(proj) == {1, 2, 3}, done.stdout[-2000:]
    with FakeModel(lambda n: f"touch marker-{n}") as model:
        proj, done = claude(tmp_path / "closed", model, db=UNREACHABLE, agent="cc-closed", max_turns=3,
                            fail_closed=True)
    assert markers(proj) == set(), done.stdout[-2000:]
    assert "agent-watchdog: refused (--fail-closed)" in model.texts()
    # What the CLI hides in print mode: the fail-open is one line on stderr, exit 0, no answer.
    event = json.dumps({"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash",
                        "tool_input": {"command": "true"}, "tool_use_id": "t1"})
    direct = subprocess.run([AW, "hook", "claude-code", "--db", UNREACHABLE], input=event, capture_output=True,
                            text=True, timeout=60, env=home_env(tmp_path / "direct"))
    assert (direct.returncode, direct.stdout) == (0, "")
    assert len(direct.stderr.splitlines()) == 1 and direct.stderr.startswith("agent-watchdog: hook:")


# --- Codex CLI ----------------------------------------------------------------------------------

def test_codex_is_refused_at_max_tool_calls(store, tmp_path):
    url, _, engine = store
    proj = tmp_path / "proj"
    proj.mkdir()
    codex_home = tmp_path / "home" / ".codex"
    codex_home.mkdir(parents=True)
    with FakeModel(lambda n: f"touch marker-{n}") as model:
        # A model provider of its own: Codex talks the Responses API to the fake on 127.0.0.1.
        (codex_home / "config.toml").write_text(
            'model = "gpt-5"\nmodel_provider = "fake"\n\n[model_providers.fake]\nname = "fake"\n'
            f'base_url = "{model.url}/v1"\nwire_api = "responses"\nenv_key = "FAKE_MODEL_KEY"\n')
        env = home_env(tmp_path, CODEX_HOME=str(codex_home), FAKE_MODEL_KEY="sk-fake")
        out = install("codex", ["--user"], env, "--agent", "codex-max", "--hook-db", url)
        assert "+ hooks.PreToolUse" in out and "[model_providers.fake]" in (codex_home / "config.toml").read_text()
        # Hooks run only once trusted: this is the non-interactive way Codex offers.
        cli = subprocess.Popen([str(BIN / "codex"), "exec", "--skip-git-repo-check",
                                "--dangerously-bypass-approvals-and-sandbox", "--dangerously-bypass-hook-trust",
                                "touch the markers"], cwd=proj, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            # Codex has no turn cap: it goes on asking; each further call is refused the same way.
            told = wait_for(lambda: "max_tool_calls" in model.texts() and model.calls >= 6, 60)
        finally:
            cli.terminate()
            output = cli.communicate(timeout=30)[0]
    assert told, output[-3000:]
    assert markers(proj) == {1, 2, 3}, output[-3000:]
    assert "agent-watchdog: run " in model.texts()
    run = hook_run(engine, "codex-max")
    assert run is not None and (run.status, run.stop_reason, run.tool_calls) == ("killed", "max_tool_calls", 3)
    assert wait_for(lambda: stopped_alert(engine, run.id, "Bash"), 30)  # Codex names its shell tool Bash


def test_codex_looping_on_one_failing_call_is_refused_as_a_loop(store, tmp_path):
    url, cfg, engine = store
    proj = tmp_path / "proj"
    proj.mkdir()
    codex_home = tmp_path / "home" / ".codex"
    codex_home.mkdir(parents=True)
    with FakeModel(lambda n: "echo ran >> calls.log; exit 3") as model:
        (codex_home / "config.toml").write_text(
            'model = "gpt-5"\nmodel_provider = "fake"\n\n[model_providers.fake]\nname = "fake"\n'
            f'base_url = "{model.url}/v1"\nwire_api = "responses"\nenv_key = "FAKE_MODEL_KEY"\n')
        env = home_env(tmp_path, CODEX_HOME=str(codex_home), FAKE_MODEL_KEY="sk-fake")
        install("codex", ["--user"], env, "--agent", "codex-loop", "--hook-db", url)
        cli = subprocess.Popen([str(BIN / "codex"), "exec", "--skip-git-repo-check",
                                "--dangerously-bypass-approvals-and-sandbox", "--dangerously-bypass-hook-trust",
                                "touch the markers"], cwd=proj, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            told = wait_for(lambda: "loop_detected" in model.texts() and "agent-watchdog: run " in model.texts(), 60)
        finally:
            cli.terminate()
            output = cli.communicate(timeout=30)[0]
    assert told, output[-3000:]
    assert (proj / "calls.log").read_text().splitlines() == ["ran", "ran"], output[-3000:]
    (run,) = runs_json(url, cfg, "codex-loop")
    assert (run["source"], run["status"], run["stop_reason"], run["tool_calls"]) == ("hook", "killed", "loop_detected", 2)
    assert wait_for(lambda: stopped_alert(engine, run["id"], "Bash"), 30)


def test_codex_log_events_and_hooks_are_one_run_each_call_counted_once(store, tmp_path):
    """The real Codex with `hook install --otlp --otlp-token`: its log events (the tokens of each
    completed response, its tool results) reach the receiver with the token and count on the
    hook's run, each tool call once (Codex's call_id is the hook's tool_use_id)."""
    url, _, engine = store
    proj = tmp_path / "proj"
    proj.mkdir()
    codex_home = tmp_path / "home" / ".codex"
    codex_home.mkdir(parents=True)
    def slow(n: int) -> str:
        time.sleep(0.5)  # a turn takes a while: the session runs across several log exports
        return f"touch marker-{n}"

    with FakeModel(slow) as model:
        (codex_home / "config.toml").write_text(
            'model = "gpt-5"\nmodel_provider = "fake"\n\n[model_providers.fake]\nname = "fake"\n'
            f'base_url = "{model.url}/v1"\nwire_api = "responses"\nenv_key = "FAKE_MODEL_KEY"\n')
        env = home_env(tmp_path, CODEX_HOME=str(codex_home), FAKE_MODEL_KEY="sk-fake")
        out = install("codex", ["--user"], env, "--agent", "codex-otel", "--hook-db", url,
                      "--otlp", OTLP[0], "--otlp-token", OTLP_TOKEN)
        assert "otel.exporter.otlp-http.endpoint" in out and OTLP_TOKEN not in out, out
        assert (codex_home / "config.toml").stat().st_mode & 0o777 == 0o600
        cli = subprocess.Popen([str(BIN / "codex"), "exec", "--skip-git-repo-check",
                                "--dangerously-bypass-approvals-and-sandbox", "--dangerously-bypass-hook-trust",
                                "touch the markers"], cwd=proj, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            # Codex goes on asking after the refusal: its log export goes on too (every few seconds).
            counted = wait_for(lambda: (r := hook_run(engine, "codex-otel")) is not None and r.steps >= 3
                               and r.stop_reason is not None, 90)
        finally:
            cli.terminate()
            output = cli.communicate(timeout=30)[0]
    assert counted, output[-3000:]
    run = hook_run(engine, "codex-otel")
    assert run.source == "hook" and (run.stop_reason, run.tool_calls) == ("max_tool_calls", 8), run
    assert run.tokens_in >= 300 and run.tokens_out >= 60, run
    with engine.connect() as conn:
        from watchdog.store.schema import events

        tools = conn.execute(select(events.c.call_id, events.c.source).where(
            events.c.run_id == run.id, events.c.kind == "tool")).all()
    assert len(tools) == 8 and {t.source for t in tools} == {"hook"}, tools  # the log's results: the same calls


# --- Gemini CLI ---------------------------------------------------------------------------------

def gemini(tmp_path: Path, model: FakeModel, *, db: str, agent: str,
           otlp: str | None = None) -> tuple[Path, subprocess.CompletedProcess]:
    proj = tmp_path / "proj"
    proj.mkdir()
    gemini_dir = tmp_path / "home" / ".gemini"
    gemini_dir.mkdir(parents=True)
    # An API key auth (no Google login), and the project trusted (else its settings' hooks are ignored).
    (gemini_dir / "settings.json").write_text(json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
    (gemini_dir / "trustedFolders.json").write_text(json.dumps({str(proj): "TRUST_FOLDER"}))
    env = home_env(tmp_path, GEMINI_API_KEY="fake", GOOGLE_GEMINI_BASE_URL=model.url)
    install("gemini", ["--project", str(proj)], env, "--agent", agent, "--hook-db", db,
            *(["--otlp", otlp, "--otlp-token", OTLP_TOKEN] if otlp else []))
    return proj, subprocess.run([str(BIN / "gemini"), "-p", "touch the markers", "--yolo", "--output-format", "json"],
                                cwd=proj, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_gemini_looping_on_one_failing_call_is_stopped_and_the_session_ends(store, tmp_path):
    """The same failing shell command again and again: the third is refused as a loop (before
    Gemini CLI's own loop detection, which waits for more), the session ends naming it, and the
    failures (Gemini reports none: `Exit Code: 3` in the result) count on the run."""
    url, cfg, engine = store
    with FakeModel(lambda n: "echo ran >> calls.log; exit 3") as model:
        proj, done = gemini(tmp_path, model, db=url, agent="gemini-loop")
    assert (proj / "calls.log").read_text().splitlines() == ["ran", "ran"], done.stderr[-3000:]
    assert model.calls == 3 and "stopped by hook: agent-watchdog: run " in done.stderr, done.stderr[-3000:]
    assert "loop_detected" in done.stderr
    (run,) = runs_json(url, cfg, "gemini-loop")
    assert (run["source"], run["status"], run["stop_reason"]) == ("hook", "killed", "loop_detected"), run
    assert (run["tool_calls"], run["tool_errors"]) == (2, 2), run
    # No call id in Gemini's hook input: each failure is matched to its call (same tool and args).
    assert run["top_tool"] == {"name": "run_shell_command", "calls": 2, "errors": 2}, run
    assert wait_for(lambda: stopped_alert(engine, run["id"], "run_shell_command"), 30)
    assert "×2 (100%), 2 errors" in alerts_of(engine, run["id"])[0].body


def test_gemini_log_events_and_hooks_are_one_run_each_call_counted_once(store, tmp_path):
    """Gemini CLI's hook input names no call id, so its log events' tool calls (gemini_cli.tool_call)
    matched none of the hook's: they counted again on the hook's run (3 calls ran, the 4th was
    refused as the 5th). On a hook run the logs' tool calls are the hook's, counted once."""
    url, cfg, engine = store
    with FakeModel(lambda n: f"touch marker-{n}") as model:
        proj, done = gemini(tmp_path, model, db=url, agent="gemini-otel", otlp=OTLP[0])
    assert markers(proj) == {1, 2, 3, 4}, done.stderr[-3000:]
    assert "stopped by hook: agent-watchdog: run " in done.stderr and "max_tool_calls" in done.stderr
    (shown,) = runs_json(url, cfg, "gemini-otel")
    assert (shown["source"], shown["stop_reason"], shown["tool_calls"]) == ("hook", "max_tool_calls", 4), shown


def test_gemini_is_refused_at_max_tool_calls_and_the_session_ends(store, tmp_path):
    url, _, engine = store
    with FakeModel(lambda n: f"touch marker-{n}") as model:
        proj, done = gemini(tmp_path, model, db=url, agent="gemini-max")
    assert markers(proj) == {1, 2, 3}, done.stderr[-3000:]
    # continue: false ends Gemini's session: it exits by itself, naming our reason.
    assert done.returncode == 0 and model.calls == 4, done.stderr[-3000:]
    assert "stopped by hook: agent-watchdog: run " in done.stderr and "max_tool_calls" in done.stderr
    run = hook_run(engine, "gemini-max")
    assert run is not None and (run.status, run.stop_reason, run.tool_calls) == ("killed", "max_tool_calls", 3)
    assert wait_for(lambda: stopped_alert(engine, run.id, "run_shell_command"), 30)


class _Recorder:
    """An OTLP/HTTP endpoint that records each request's path and Authorization header (200, empty
    answer): what the CLI's own exporter sends, before any receiver judges it."""

    def __init__(self):
        import http.server
        import threading

        seen = self.seen = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append((self.path, self.headers.get("Authorization")))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_gemini_hook_install_makes_geminis_log_export_send_the_token(store, tmp_path):
    """Gemini CLI 0.61.0's settings take no exporter headers; `hook install --otlp-token` puts the
    token in .gemini/.env (0600, never printed), which Gemini loads: its log export carries it."""
    url, _, _engine = store
    proj = tmp_path / "proj"
    proj.mkdir()
    gemini_dir = tmp_path / "home" / ".gemini"
    gemini_dir.mkdir(parents=True)
    (gemini_dir / "settings.json").write_text(json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
    (gemini_dir / "trustedFolders.json").write_text(json.dumps({str(proj): "TRUST_FOLDER"}))
    recorder = _Recorder()
    try:
        with FakeModel(lambda n: f"touch marker-{n}") as model:
            env = home_env(tmp_path, GEMINI_API_KEY="fake", GOOGLE_GEMINI_BASE_URL=model.url)
            out = install("gemini", ["--project", str(proj)], env, "--agent", "gemini-max", "--hook-db", url,
                          "--otlp", recorder.url, "--otlp-token", OTLP_TOKEN)
            assert OTLP_TOKEN not in out and "OTEL_EXPORTER_OTLP_LOGS_HEADERS" in out, out
            dotenv = proj / ".gemini" / ".env"
            assert (dotenv.stat().st_mode & 0o777) == 0o600
            done = subprocess.run([str(BIN / "gemini"), "-p", "touch the markers", "--yolo", "--output-format", "json"],
                                  cwd=proj, env=env, capture_output=True, text=True, timeout=120,
                                  stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-3000:]
        logs = wait_for(lambda: [a for p, a in recorder.seen if p == "/v1/logs"], 30)
        assert logs and set(logs) == {f"Bearer {OTLP_TOKEN}"}, recorder.seen
    finally:
        recorder.close()


# --- hostile input -------------------------------------------------------------------------------

def test_hostile_hook_input_never_crashes_the_hook_nor_lets_a_session_slip_through(store, tmp_path):
    """What the CLI (or a model through it) may put on the hook's stdin, through the resident
    helper as the CLIs call it: unreadable input fails open with one stderr line (refused with
    --fail-closed), never a traceback; a session id or tool input with control characters or
    JSON's lone surrogates is still one run, every call counted."""
    url, cfg, engine = store
    env = home_env(tmp_path)

    def hook(stdin: bytes, *extra: str, cli: str = "claude-code") -> subprocess.CompletedProcess:
        return subprocess.run([AW, "hook", cli, "--agent", "cc-hostile", "--db", url, *extra], input=stdin,
                              capture_output=True, timeout=60, env=env)

    unreadable = [b"\xff\xfe not json", b"[]", b"null", b"{", b"[" * 200_000 + b"]" * 200_000,
                  b'{"tool_input": "' + b"x" * (9 << 20) + b'"}']  # past the 8 MiB the hook reads
    for raw in unreadable:
        for cli in ("claude-code", "gemini"):
            done = hook(raw, cli=cli)
            err = done.stderr.decode()
            assert (done.returncode, done.stdout) == (0, b""), (raw[:40], done)
            assert len(err.splitlines()) == 1 and err.startswith("agent-watchdog: hook:"), (raw[:40], err)
            closed = hook(raw, "--fail-closed", cli=cli)
            answer = json.loads(closed.stdout)
            reason = answer["reason"] if cli == "gemini" else answer["hookSpecificOutput"]["permissionDecisionReason"]
            assert closed.returncode == 0 and reason.startswith("agent-watchdog: refused (--fail-closed)"), closed
    session = r"evil\u0000\u001b[31m\ud800\n\r\u2028" + "s" * 300  # JSON escapes; cut to 200 chars
    for n, raw_input in enumerate(['{"command": "ls \\ud800"}', '{"file_path": "/' + "y" * (3 << 20) + '"}']):
        event = ('{"session_id": "%s", "hook_event_name": "PreToolUse", "tool_name": "Bash\\u0007", '
                 '"tool_input": %s, "tool_use_id": "toolu_\\u0000%d"}' % (session, raw_input, n))
        done = hook(event.encode())
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b""), done.stderr[-500:]
    (run,) = runs_json(url, cfg, "cc-hostile")
    assert (run["source"], run["tool_calls"], run["status"]) == ("hook", 2, "running"), run


# --- the resident helper ------------------------------------------------------------------------

def test_the_resident_helper_answers_after_the_first_call_and_each_call_counts_once(store, tmp_path):
    url, _, engine = store
    env = home_env(tmp_path)

    def call(n: int) -> subprocess.CompletedProcess:
        event = json.dumps({"session_id": "resident", "hook_event_name": "PreToolUse", "tool_name": "Read",
                            "tool_input": {"file_path": f"/f{n}"}, "tool_use_id": f"toolu_{n}"})
        return subprocess.run([AW, "hook", "claude-code", "--agent", "cc-resident", "--db", url], input=event,
                              capture_output=True, text=True, timeout=60, env=env)

    first = call(1)  # no helper yet: answered in-process, the helper started for the next calls
    assert (first.returncode, first.stdout, first.stderr) == (0, "", "")
    pid_files = wait_for(lambda: list(Path(RUNTIME[0]).rglob("*.sock.pid")), 30)
    assert pid_files
    answers = [call(n) for n in (2, 3, 4)]
    assert [a.stdout for a in answers[:2]] == ["", ""]
    refused = json.loads(answers[2].stdout)["hookSpecificOutput"]["permissionDecisionReason"]
    assert refused.startswith("agent-watchdog: run ") and "max_tool_calls" in refused
    with engine.connect() as conn:
        rows = conn.execute(select(runs).where(runs.c.labels.is_not(None), runs.c.source == "hook")).all()
    (run,) = [r for r in rows if (r.labels or {}).get("session") == "resident"]
    assert (run.tool_calls, run.stop_reason) == (3, "max_tool_calls")


def test_another_users_process_gets_no_answer_from_this_users_helper(store, tmp_path):
    """The helper's directory is this user's alone (0700), and should it be opened, the helper
    still answers only its own Unix user (SO_PEERCRED): another user's call is never judged
    (nor counted) as this user's."""
    from attest_support import LocalUsers, foreign_python, run_as

    url, _, engine = store
    env = home_env(tmp_path)
    event = json.dumps({"session_id": "theirs", "hook_event_name": "PreToolUse", "tool_name": "Read",
                        "tool_input": {}, "tool_use_id": "x1"})
    subprocess.run([AW, "hook", "claude-code", "--agent", "cc-resident", "--db", url], input=event, env=env,
                   capture_output=True, text=True, timeout=60, check=True)
    from watchdog.gateways.hooks.fastpath import socket_path

    name = os.path.basename(socket_path(["claude-code", "--agent", "cc-resident", "--db", url], {}, env))
    sock = os.path.join(RUNTIME[0], f"agent-watchdog-hook-{os.getuid()}", name)
    assert wait_for(lambda: os.path.exists(sock + ".pid"), 30)
    probe = ("import json, socket, struct, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    print('denied'); sys.exit()\n"
             f"req = json.dumps({{'argv': ['claude-code', '--db', {url!r}], 'stdin': {json.dumps(event)!r}}}).encode()\n"
             "try:\n    s.sendall(struct.pack('!I', len(req)) + req); s.shutdown(socket.SHUT_WR)\n"
             "except BrokenPipeError:\n    pass  # the helper closed first: refused before reading\n"
             "try:\n    got = s.recv(65536)\nexcept ConnectionResetError:\n    got = b''\n"
             "print('answer:' + got.decode())\n")
    python, their_env = foreign_python()
    users = LocalUsers()
    try:
        other = users.add("hook")
        assert run_as(other, [python, "-c", probe, sock], env=their_env).stdout.strip() == "denied"
        # As if the directories were opened to others: the helper itself refuses them.
        opened = [RUNTIME[0], os.path.dirname(sock)]
        for d in opened:
            os.chmod(d, 0o755)
        os.chmod(sock, 0o777)
        try:
            done = run_as(other, [python, "-c", probe, sock], env=their_env)
        finally:
            for d in opened:
                os.chmod(d, 0o700)
        assert done.stdout.strip() == "answer:", done.stdout + done.stderr
    finally:
        users.close()
    with engine.connect() as conn:
        theirs = [r for r in conn.execute(select(runs).where(runs.c.source == "hook"))
                  if (r.labels or {}).get("session") == "theirs"]
    assert [r.tool_calls for r in theirs] == [1]  # only this user's own call
