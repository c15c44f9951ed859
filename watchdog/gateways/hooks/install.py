"""`agent-watchdog hook install claude-code|codex|gemini [--project DIR | --user] [--dry-run]`.

Merges the hook entries (and the CLI's OpenTelemetry log exporter, when an OTLP endpoint is
given) into the CLI's own settings file, never clobbering what is there: a key the user set is
kept (and reported as kept), an entry already installed is not added twice, so running it again
changes nothing. Pure merges (`merge_json`, `merge_toml_text`) are what the unit tests check.

Files: Claude Code `.claude/settings.json` (project) or `~/.claude/settings.json`; Codex
`.codex/config.toml` (project) or `$CODEX_HOME/config.toml` (default `~/.codex`); Gemini
`.gemini/settings.json` (project) or `~/.gemini/settings.json`.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Each CLI's tool-call events, as its settings name them.
# Claude Code's PostToolBatch (after each batch of calls, a refused one included) and Stop are
# where a stopped run ends its session (watchdog.gateways.hooks.protocols).
EVENTS = {"claude-code": ("PreToolUse", "PostToolUse", "PostToolUseFailure", "PostToolBatch", "Stop"),
          "codex": ("PreToolUse", "PostToolUse"),
          "gemini": ("BeforeTool", "AfterTool")}
MATCH_ALL = {"claude-code": "*", "codex": "*", "gemini": ".*"}
HOOK_TIMEOUT_S = 30  # the CLI kills a hook after this; ours answers in well under a second


@dataclass
class Plan:
    path: Path
    before: str | None  # the file's text, None if it does not exist
    after: str
    changes: list[str] = field(default_factory=list)  # what was added, one line each
    kept: list[str] = field(default_factory=list)  # what was there and is left as it was
    secret: bool = False  # the file holds a bearer token: written 0600

    @property
    def changed(self) -> bool:
        return self.before != self.after


def hook_command(cli: str, *, agent: str | None = None, fail_closed: bool = False, db: str | None = None,
                 exe: str = "agent-watchdog") -> str:
    parts = [exe, "hook", cli]
    if agent:
        parts += ["--agent", agent]
    if fail_closed:
        parts.append("--fail-closed")
    if db:
        parts += ["--db", db]
    return " ".join(shlex.quote(p) for p in parts)


def settings_path(cli: str, *, project: str | None, user: bool, home: str | None = None) -> Path:
    home_dir = Path(home or os.path.expanduser("~"))
    if cli == "codex":
        if project and not user:
            return Path(project) / ".codex" / "config.toml"
        return Path(os.environ.get("CODEX_HOME") or home_dir / ".codex") / "config.toml"
    sub = ".claude" if cli == "claude-code" else ".gemini"
    if project and not user:
        return Path(project) / sub / "settings.json"
    return home_dir / sub / "settings.json"


# --- JSON settings (Claude Code, Gemini) ----------------------------------------

def _has_command(groups: Any, command: str) -> bool:
    return isinstance(groups, list) and any(
        isinstance(g, dict) and any(isinstance(h, dict) and h.get("command") == command for h in g.get("hooks") or [])
        for g in groups)


def bearer_header(token: str) -> str:
    """The exporter's header line (OTEL_EXPORTER_OTLP_*_HEADERS form) for the receiver's token."""
    return f"Authorization=Bearer {token}"


def _otel_json(cli: str, otlp: str, agent: str | None, token: str | None = None) -> dict[str, Any]:
    if cli == "claude-code":
        env = {"CLAUDE_CODE_ENABLE_TELEMETRY": "1", "OTEL_LOGS_EXPORTER": "otlp",
               "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "http/protobuf",
               "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": otlp.rstrip("/") + "/v1/logs"}
        if token:  # the receiver refuses senders without one (401) unless [otlp] allow_anonymous
            env["OTEL_EXPORTER_OTLP_LOGS_HEADERS"] = bearer_header(token)
        if agent:  # the session's log events name the agent the hook records it under
            env["OTEL_RESOURCE_ATTRIBUTES"] = f"agent_watchdog.agent={agent}"
        return {"env": env}
    return {"telemetry": {"enabled": True, "target": "local", "otlpProtocol": "http",
                          "otlpEndpoint": otlp.rstrip("/")}}


def _shown(key: str, value: Any) -> str:
    """A settings value as printed: headers (which carry tokens, ours or the user's) masked."""
    if key.upper().endswith("_HEADERS") or "token" in key.lower() or "authorization" in key.lower():
        return '"***" (masked: it may hold a token)'
    return json.dumps(value)


def merge_json(cli: str, settings: dict[str, Any], command: str, otlp: str | None = None,
               agent: str | None = None, token: str | None = None) -> tuple[dict[str, Any], list[str], list[str]]:
    """(new settings, changes, kept): `settings` with our hook on each tool event, and the OTel
    exporter keys that are not set yet. Never removes or rewrites a key that is there."""
    out = copy.deepcopy(settings)
    changes: list[str] = []
    kept: list[str] = []
    hooks = out.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise ValueError("the settings' `hooks` is not an object: not touching it")
    for event in EVENTS[cli]:
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise ValueError(f"the settings' hooks.{event} is not a list: not touching it")
        if _has_command(groups, command):
            kept.append(f"hooks.{event}: {command} (already installed)")
            continue
        entry: dict[str, Any] = {"type": "command", "command": command, "timeout": HOOK_TIMEOUT_S}
        if cli == "gemini":
            entry["name"] = "agent-watchdog"
            entry["timeout"] = HOOK_TIMEOUT_S * 1000  # Gemini's hook timeout is in milliseconds
        groups.append({"matcher": MATCH_ALL[cli], "hooks": [entry]})
        changes.append(f"hooks.{event}: + {command}")
    if otlp:
        for section, values in _otel_json(cli, otlp, agent, token).items():
            target = out.setdefault(section, {})
            if not isinstance(target, dict):
                kept.append(f"{section} (not an object: left alone)")
                continue
            for key, value in values.items():
                if key in target:
                    if target[key] != value:
                        kept.append(f"{section}.{key} = {_shown(key, target[key])} (yours, kept)")
                    continue
                target[key] = value
                changes.append(f"{section}.{key} = {_shown(key, value)}")
    return out, changes, kept


# --- TOML (Codex) -----------------------------------------------------------------

def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def merge_toml_text(text: str, command: str, otlp: str | None = None,
                    token: str | None = None) -> tuple[str, list[str], list[str]]:
    """Codex's config.toml with our `[[hooks.<event>]]` blocks (and `[otel]`) appended where they
    are missing; the user's text is kept byte for byte (tomllib only reads it)."""
    data = tomllib.loads(text) if text.strip() else {}
    changes: list[str] = []
    kept: list[str] = []
    blocks: list[str] = []
    found = data.get("hooks")
    hooks: dict[str, Any] = found if isinstance(found, dict) else {}
    for event in EVENTS["codex"]:
        if _has_command(hooks.get(event), command):
            kept.append(f"hooks.{event}: {command} (already installed)")
            continue
        blocks.append(f'[[hooks.{event}]]\nmatcher = "*"\n\n[[hooks.{event}.hooks]]\ntype = "command"\n'
                      f"command = {_toml_str(command)}\ntimeout = {HOOK_TIMEOUT_S}\n")
        changes.append(f"hooks.{event}: + {command}")
    if otlp:
        if "otel" in data:
            kept.append("[otel] (yours, kept)")
        else:
            endpoint = otlp.rstrip("/") + "/v1/logs"
            headers = f'headers = {{ "Authorization" = {_toml_str("Bearer " + token)} }}\n' if token else ""
            blocks.append(f'[otel]\nlog_user_prompt = false\n\n[otel.exporter."otlp-http"]\n'
                          f'endpoint = {_toml_str(endpoint)}\nprotocol = "binary"\n{headers}')
            changes.append(f"otel.exporter.otlp-http.endpoint = {endpoint}")
    if not blocks:
        return text, changes, kept
    head = text if not text or text.endswith("\n") else text + "\n"
    sep = "\n" if head else ""
    new = head + sep + "# agent-watchdog hook install\n" + "\n".join(blocks)
    tomllib.loads(new)  # what we write must parse (it always should: say so loudly if not)
    return new, changes, kept


def plan(cli: str, *, project: str | None, user: bool, command: str, otlp: str | None = None,
         home: str | None = None, agent: str | None = None, token: str | None = None) -> Plan:
    path = settings_path(cli, project=project, user=user, home=home)
    before = path.read_text(encoding="utf-8") if path.exists() else None
    if cli == "codex":
        after, changes, kept = merge_toml_text(before or "", command, otlp, token)
    else:
        current = json.loads(before) if before and before.strip() else {}
        if not isinstance(current, dict):
            raise ValueError(f"{path}: not a JSON object: not touching it")
        merged, changes, kept = merge_json(cli, current, command, otlp, agent, token)
        after = before if not changes and before is not None else json.dumps(merged, indent=2) + "\n"
    return Plan(path, before, after, changes, kept, secret=token is not None and token in after)


SECRET_MODE = 0o600  # a settings file that holds a bearer token: its user's alone
DEFAULT_MODE = 0o644


ENV_FILE = ".env"  # Gemini CLI loads <project>/.gemini/.env (trusted folders), else ~/.gemini/.env
GEMINI_HEADERS = "OTEL_EXPORTER_OTLP_LOGS_HEADERS"


def env_plan(cli: str, *, project: str | None, user: bool, token: str | None, home: str | None = None) -> Plan | None:
    """Gemini CLI's settings have no exporter headers (0.61.0 builds its OTLP exporters from
    `telemetry.otlpEndpoint` alone; the OTel JS exporter takes headers from the environment):
    the token goes to the `.env` file Gemini loads beside its settings, 0600, unless it sets the
    variable already. None for the other CLIs or without a token."""
    if cli != "gemini" or not token:
        return None
    path = settings_path(cli, project=project, user=user, home=home).with_name(ENV_FILE)
    before = path.read_text(encoding="utf-8") if path.exists() else None
    text = before or ""
    names = {line.split("=", 1)[0].strip().removeprefix("export ").strip() for line in text.splitlines() if "=" in line}
    if GEMINI_HEADERS in names:
        return Plan(path, before, text, [], [f"{GEMINI_HEADERS} = {_shown(GEMINI_HEADERS, '')} (yours, kept)"])
    head = text if not text or text.endswith("\n") else text + "\n"
    after = head + f"# agent-watchdog hook install: the log export's token\n{GEMINI_HEADERS}={_toml_str(bearer_header(token))}\n"
    return Plan(path, before, after, [f"{GEMINI_HEADERS} = {_shown(GEMINI_HEADERS, '')}"], [], secret=True)


def apply(p: Plan) -> None:
    """Write the plan atomically (a half-written settings file would break the CLI): a new file
    made by mkstemp in the same directory (O_EXCL: never a name someone put a symlink at), then
    os.replace. Its mode is the old file's, else 0644; 0600 when it holds a token."""
    if not p.changed:
        return
    p.path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = p.path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = DEFAULT_MODE
    if p.secret:
        mode = SECRET_MODE
    fd, tmp = tempfile.mkstemp(dir=p.path.parent, prefix=f".{p.path.name}.", suffix=".agent-watchdog.tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(p.after)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, p.path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
