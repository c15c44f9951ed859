"""`agent-watchdog hook install`'s merges (pure: the settings as data or text, and temp files) and
the hook protocols' parsing and answers, as each CLI's version takes them."""

from __future__ import annotations

import json
import tomllib

import pytest

from watchdog.gateways.hooks import install, protocols
from watchdog.gateways.hooks.main import answer, parse_args

CMD = "agent-watchdog hook claude-code --agent dev"


def test_claude_settings_keep_every_key_and_hook_of_the_user():
    mine = {"model": "opus", "permissions": {"allow": ["Bash(ls)"]},
            "env": {"OTEL_LOGS_EXPORTER": "console"},
            "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "lint.sh"}]}],
                      "Stop": [{"hooks": [{"type": "command", "command": "notify.sh"}]}]}}
    merged, changes, kept = install.merge_json("claude-code", mine, CMD, otlp="http://127.0.0.1:4318")
    assert merged["model"] == "opus" and merged["permissions"] == mine["permissions"]
    assert merged["hooks"]["Stop"][0] == mine["hooks"]["Stop"][0] and merged["hooks"]["Stop"][1]["hooks"][0]["command"] == CMD
    pre = merged["hooks"]["PreToolUse"]
    assert pre[0] == mine["hooks"]["PreToolUse"][0] and pre[1]["hooks"][0]["command"] == CMD
    assert set(merged["hooks"]) == {"PreToolUse", "PostToolUse", "PostToolUseFailure", "PostToolBatch", "Stop"}
    # The user's own exporter choice is kept (and said so); the keys they did not set are added.
    assert merged["env"]["OTEL_LOGS_EXPORTER"] == "console" and any("OTEL_LOGS_EXPORTER" in k for k in kept)
    assert merged["env"]["OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"] == "http://127.0.0.1:4318/v1/logs"
    assert len(changes) == 5 + 3  # five hook events, three env keys
    assert mine["hooks"]["PreToolUse"] == [{"matcher": "Bash", "hooks": [{"type": "command", "command": "lint.sh"}]}]


@pytest.mark.parametrize("cli", ["claude-code", "gemini"])
def test_json_merge_is_idempotent(cli):
    once, changes, _ = install.merge_json(cli, {}, CMD, otlp="http://127.0.0.1:4318")
    twice, again, kept = install.merge_json(cli, once, CMD, otlp="http://127.0.0.1:4318")
    assert changes and twice == once and again == [] and kept


def test_gemini_events_and_telemetry():
    merged, _, _ = install.merge_json("gemini", {"telemetry": {"enabled": False}}, CMD, otlp="http://h:4318/")
    assert set(merged["hooks"]) == {"BeforeTool", "AfterTool"}
    assert merged["hooks"]["BeforeTool"][0]["hooks"][0]["timeout"] == install.HOOK_TIMEOUT_S * 1000  # ms
    assert merged["telemetry"] == {"enabled": False, "target": "local", "otlpProtocol": "http",
                                   "otlpEndpoint": "http://h:4318"}  # the user's `enabled` kept


def test_a_hooks_value_we_do_not_understand_is_left_alone():
    with pytest.raises(ValueError):
        install.merge_json("claude-code", {"hooks": ["odd"]}, CMD)


def test_codex_toml_text_is_kept_byte_for_byte_and_the_merge_is_idempotent():
    mine = '# my codex\nmodel = "o3"\n\n[[hooks.PreToolUse]]\nmatcher = "^Bash$"\n\n' \
           '[[hooks.PreToolUse.hooks]]\ntype = "command"\ncommand = "policy.py"\n'
    text, changes, _ = install.merge_toml_text(mine, CMD, otlp="http://127.0.0.1:4318")
    assert text.startswith(mine) and len(changes) == 3
    data = tomllib.loads(text)
    assert [h["hooks"][0]["command"] for h in data["hooks"]["PreToolUse"]] == ["policy.py", CMD]
    assert data["otel"]["exporter"]["otlp-http"]["endpoint"] == "http://127.0.0.1:4318/v1/logs"
    again, more, kept = install.merge_toml_text(text, CMD, otlp="http://127.0.0.1:4318")
    assert again == text and more == [] and len(kept) == 3


def test_plan_and_apply_on_files(tmp_path):
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"theme": "dark"}))
    p = install.plan("claude-code", project=str(tmp_path), user=False, command=CMD)
    assert p.path == settings and p.changed and json.loads(settings.read_text()) == {"theme": "dark"}  # not yet
    install.apply(p)
    assert json.loads(settings.read_text())["theme"] == "dark"
    assert not install.plan("claude-code", project=str(tmp_path), user=False, command=CMD).changed
    codex = install.plan("codex", project=None, user=True, command=CMD, home=str(tmp_path))
    assert codex.path == tmp_path / ".codex" / "config.toml" and codex.before is None


def test_hook_events_parse_for_each_cli():
    pre = protocols.parse(json.dumps({"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash",
                                      "tool_input": {"command": "ls"}, "tool_use_id": "toolu_1"}))
    assert (pre.phase, pre.tool, pre.call_id, pre.failed) == (protocols.PRE, "Bash", "toolu_1", False)
    failed = protocols.parse(json.dumps({"session_id": "s", "hook_event_name": "PostToolUseFailure",
                                         "tool_name": "Bash", "tool_input": {}}))
    assert (failed.phase, failed.failed) == (protocols.POST, True)
    after = protocols.parse(json.dumps({"session_id": "s", "hook_event_name": "AfterTool",
                                        "tool_name": "run_shell_command", "tool_response": {"error": "boom"}}))
    assert (after.phase, after.failed) == (protocols.POST, True)
    with pytest.raises(ValueError):
        protocols.parse("[1]")


def test_refusals_in_each_protocol():
    claude = json.loads(protocols.deny("claude-code", "PreToolUse", "agent-watchdog: x", end_session=True).stdout)
    assert claude["hookSpecificOutput"]["permissionDecision"] == "deny" and claude["continue"] is False
    codex = json.loads(protocols.deny("codex", "PreToolUse", "agent-watchdog: x", end_session=True).stdout)
    assert "continue" not in codex and "stopReason" not in codex  # Codex 0.171 fails such an answer open
    gemini = json.loads(protocols.deny("gemini", "BeforeTool", "agent-watchdog: x", end_session=True).stdout)
    assert (gemini["decision"], gemini["continue"], gemini["stopReason"]) == ("deny", False, "agent-watchdog: x")


def test_bad_input_fails_open_unless_fail_closed():
    opts = parse_args(["claude-code"])
    assert opts["agent"] == "claude-code"
    open_ = answer(opts, "not json")
    assert (open_.exit_code, open_.stdout) == (0, "") and open_.stderr.count("\n") == 1
    closed = answer(parse_args(["claude-code", "--fail-closed"]), "not json")
    assert "agent-watchdog: refused (--fail-closed)" in json.loads(closed.stdout)["hookSpecificOutput"][
        "permissionDecisionReason"]
    with pytest.raises(ValueError):
        parse_args(["cursor"])
    # A session event the hook does not judge passes without touching any store.
    assert answer(opts, json.dumps({"hook_event_name": "SessionStart", "session_id": "s"})).stdout == ""


def test_claude_codes_recorded_log_events_map_to_steps_and_the_hooks_call_ids():
    """tests/clis/recorded/: what Claude Code 2.1.197 exported for a session of three Bash calls."""
    from pathlib import Path

    from watchdog.daemon.otlp import logs

    body = (Path(__file__).resolve().parents[1] / "clis" / "recorded" / "claude-code-2.1.197-logs.json").read_bytes()
    records, dropped = logs.decode_logs(body, "application/json", 1000)
    assert dropped == 0 and {name for _, name, _ in records} >= {"claude_code.api_request", "claude_code.tool_result"}
    (session,) = logs.sessions(records)
    assert (session.cli, session.agent) == ("claude-code", "claude-code")
    steps = [c for c in session.calls if c.kind == "step"]
    tools = [c for c in session.calls if c.kind == "tool"]
    assert [(s.model, s.tokens_in, s.tokens_out) for s in steps] == [("claude-opus-4-8", 100, 20)] * 3
    assert [(t.tool, t.ok, t.call_id) for t in tools] == [
        ("Bash", True, f"hook:claude-code:toolu_000{n}") for n in (1, 2, 3)]


def test_codexs_recorded_log_events_map_to_steps_from_completed_responses():
    """tests/clis/recorded/: Codex 0.171.0 for three exec_command calls (the tokens on
    codex.sse_event response.completed, the tool results keyed by call_id)."""
    from pathlib import Path

    from watchdog.daemon.otlp import logs

    body = (Path(__file__).resolve().parents[1] / "clis" / "recorded" / "codex-0.171.0-logs.json").read_bytes()
    records, _ = logs.decode_logs(body, "application/json", 1000)
    (session,) = logs.sessions(records)
    assert session.cli == "codex" and session.session_id.startswith("01a24f9b")
    steps = [c for c in session.calls if c.kind == "step"]
    tools = [c for c in session.calls if c.kind == "tool"]
    assert [(s.tokens_in, s.tokens_out) for s in steps] == [(100, 20)] * len(steps) and len(steps) >= 3
    assert [t.call_id for t in tools][:3] == [f"hook:codex:call_000{n}" for n in (1, 2, 3)]


def test_install_never_prints_a_token_and_writes_it_0600(tmp_path):
    """A header the user set (their own token) is kept but printed masked; the file that holds
    our token is its user's alone (0600), whatever mode it had."""
    token = "very-secret-token-0123456789"
    mine = {"env": {"OTEL_EXPORTER_OTLP_LOGS_HEADERS": "Authorization=Bearer users-own-secret"}}
    _merged, changes, kept = install.merge_json("claude-code", mine, CMD, otlp="http://127.0.0.1:4318", token=token)
    printed = "\n".join(changes + kept)
    assert "users-own-secret" not in printed and token not in printed and "OTEL_EXPORTER_OTLP_LOGS_HEADERS" in printed
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text("{}\n")
    settings.chmod(0o644)
    p = install.plan("claude-code", project=str(tmp_path), user=False, command=CMD, otlp="http://127.0.0.1:4318",
                     token=token)
    assert p.secret and token not in "\n".join(p.changes + p.kept)
    install.apply(p)
    assert (settings.stat().st_mode & 0o777) == 0o600 and token in settings.read_text()
    codex = install.plan("codex", project=str(tmp_path), user=False, command=CMD, otlp="http://127.0.0.1:4318",
                         token=token)
    install.apply(codex)
    assert codex.secret and (codex.path.stat().st_mode & 0o777) == 0o600


def test_install_writes_through_no_symlink_at_its_temporary_name(tmp_path):
    """The old temporary name (settings.json.agent-watchdog.tmp) pointed elsewhere by someone:
    the file it points at is untouched, and no other file is left behind."""
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    (settings.parent / "settings.json.agent-watchdog.tmp").symlink_to(victim)
    p = install.plan("claude-code", project=str(tmp_path), user=False, command=CMD)
    install.apply(p)
    assert victim.read_text() == "untouched\n"
    assert json.loads(settings.read_text())["hooks"]["PreToolUse"][0]["hooks"][0]["command"] == CMD
    assert (settings.stat().st_mode & 0o777) == 0o644
    assert sorted(x.name for x in settings.parent.iterdir()) == ["settings.json", "settings.json.agent-watchdog.tmp"]


def test_the_resident_helper_is_keyed_by_the_absolute_store_path(tmp_path, monkeypatch):
    """`--db sqlite:///runs.db` from two directories names two stores: two helpers, and the
    helper is sent the absolute path (it serves calls from every directory)."""
    from watchdog.gateways.hooks import fastpath

    argv = ["claude-code", "--db", "sqlite:///runs.db", "--config=watchdog.toml"]
    paths, sent = [], []
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        monkeypatch.chdir(tmp_path / d)
        fixed, env = fastpath.resolved(argv, {"AGENT_WATCHDOG_DB": "sqlite:///other.db"})
        sent.append((fixed, env))
        paths.append(fastpath.socket_path(fixed, env))
    assert paths[0] != paths[1]
    assert sent[0][0] == ["claude-code", "--db", f"sqlite:///{tmp_path}/a/runs.db", f"--config={tmp_path}/a/watchdog.toml"]
    assert sent[1][1] == {"AGENT_WATCHDOG_DB": f"sqlite:///{tmp_path}/b/other.db"}
    absolute = ["claude-code", "--db", "sqlite:////srv/runs.db"]
    assert fastpath.resolved(absolute, {})[0] == absolute
    pg = ["claude-code", "--db", "postgresql://u@h/db"]
    assert fastpath.resolved(pg, {})[0] == pg


def test_hook_install_dry_run_writes_nothing_and_a_second_install_changes_nothing(tmp_path):
    """The command as a user runs it: --dry-run leaves no file (and an existing one byte for
    byte); install keeps the user's keys; installing again leaves the file as it is."""
    from click.testing import CliRunner

    from watchdog.cli import main

    proj = tmp_path / "proj"
    proj.mkdir()
    run = CliRunner().invoke
    dry = run(main, ["hook", "install", "claude-code", "--project", str(proj), "--dry-run"])
    assert dry.exit_code == 0 and "would change" in dry.output and not (proj / ".claude").exists(), dry.output
    settings = proj / ".claude" / "settings.json"
    settings.parent.mkdir()
    mine = '{"model": "opus",\n "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "notify.sh"}]}]}}'
    settings.write_text(mine)
    dry = run(main, ["hook", "install", "claude-code", "--project", str(proj), "--dry-run", "--otlp", "http://127.0.0.1:1"])
    assert dry.exit_code == 0 and settings.read_text() == mine, dry.output
    done = run(main, ["hook", "install", "claude-code", "--project", str(proj), "--agent", "dev"])
    assert done.exit_code == 0, done.output
    after = settings.read_text()
    data = json.loads(after)
    assert data["model"] == "opus" and data["hooks"]["Stop"][0]["hooks"][0]["command"] == "notify.sh"
    assert all(any("hook claude-code --agent dev" in h["command"] for g in data["hooks"][e] for h in g["hooks"])
               for e in ("PreToolUse", "PostToolUse", "PostToolBatch", "Stop"))
    again = run(main, ["hook", "install", "claude-code", "--project", str(proj), "--agent", "dev"])
    assert again.exit_code == 0 and "nothing to change" in again.output and settings.read_text() == after


def test_a_stopped_sessions_batch_ends_it_once_the_model_read_a_refusal(tmp_path):
    from watchdog.gateways.hooks.core import told

    refusal = "agent-watchdog: run 1f2e3d4c stopped: max_tool_calls: tool calls 4 would exceed 3"

    def result(use_id: str, content) -> str:
        return json.dumps({"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use_id, "content": content, "is_error": True}]}})

    transcript = tmp_path / "t.jsonl"
    transcript.write_text(result("toolu_1", "ok") + "\n" + result("toolu_4", refusal) + "\n")
    assert not told(str(transcript), ("toolu_4",))  # this batch's refusal: the model reads it next
    assert told(str(transcript), ("toolu_5",))  # an earlier batch's: it was read
    transcript.write_text(result("toolu_4", [{"type": "text", "text": refusal}]) + "\n")
    assert told(str(transcript), ("toolu_5",))
    transcript.write_text(result("toolu_4", "agent-watchdog: run 1f2e3d4c paused: waiting for approval") + "\n")
    assert not told(str(transcript), ("toolu_5",))  # a pause is no stop
    assert told(str(tmp_path / "missing.jsonl"), ()) and told(None, ())  # unreadable: end now
    import os

    os.mkfifo(tmp_path / "fifo")
    assert told(str(tmp_path / "fifo"), ()) and told(str(tmp_path), ())  # never read (nor waited on)
    ev = protocols.parse(json.dumps({"session_id": "s", "hook_event_name": "PostToolBatch",
                                     "transcript_path": str(transcript), "tool_calls": [
                                         {"tool_name": "Bash", "tool_input": {}, "tool_use_id": "toolu_5"}]}))
    assert (ev.phase, ev.transcript, ev.batch) == (protocols.END, str(transcript), ("toolu_5",))
    assert json.loads(protocols.end("agent-watchdog: x").stdout) == {"continue": False, "stopReason": "agent-watchdog: x"}


def test_gemini_shell_failures_and_lone_surrogates_parse():
    def after(content: str) -> protocols.HookEvent:
        return protocols.parse(json.dumps({"session_id": "s", "hook_event_name": "AfterTool", "tool_name": "run_shell_command",
                                           "tool_response": {"llmContent": content, "returnDisplay": ""}}))

    assert after("Output: nope\nExit Code: 1\nProcess Group PGID: 7").failed
    assert not after("Output: ok\nProcess Group PGID: 7").failed
    assert not after("Output: Exit Code: 1\nExit Code: 0\n").failed  # Gemini's own line is the last
    ev = protocols.parse('{"session_id": "a\\ud800b", "hook_event_name": "BeforeTool", "tool_name": "t\\udfff"}')
    assert ev.session_id == "a\ufffdb" and ev.tool == "t\ufffd"
    ev.session_id.encode("utf-8")
    from watchdog.core.lifecycle import hash_args

    assert hash_args({"command": "\ud800"}) != hash_args({"command": "\ud801"})
    with pytest.raises(ValueError):
        protocols.parse("[" * 100_000 + "]" * 100_000)
