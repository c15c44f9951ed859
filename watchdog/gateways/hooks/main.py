"""`agent-watchdog hook claude-code|codex|gemini [--agent NAME] [--fail-closed]`: one hook call.

Run by the CLI before and after each tool call, so it starts an interpreter every time: it parses
its few options by hand (no click) and imports the store only once it has an event to judge.
It never fails the CLI by accident: bad input or a store it cannot reach lets the call through
with one line on stderr (exit 0), unless --fail-closed, which refuses it instead.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

from watchdog.gateways.hooks import protocols
from watchdog.gateways.hooks.protocols import CLIS, PRE, Answer

USAGE = ("usage: agent-watchdog hook claude-code|codex|gemini [--agent NAME] [--fail-closed] "
         "[--db URL] [--config PATH]")
DEFAULT_AGENTS = {"claude-code": "claude-code", "codex": "codex", "gemini": "gemini"}
PG_CONNECT_TIMEOUT_S = 3  # a hook must answer within the CLI's hook timeout (Claude Code: 60 s)


def parse_args(argv: Sequence[str]) -> dict[str, Any]:
    """{cli, agent, fail_closed, db, config}; ValueError with the usage on anything else."""
    args = list(argv)
    if not args or args[0] not in CLIS:
        raise ValueError(USAGE)
    out: dict[str, Any] = {"cli": args[0], "agent": None, "fail_closed": False, "db": None, "config": None}
    rest = args[1:]
    while rest:
        opt = rest.pop(0)
        key, _, val = opt.partition("=")
        if key == "--fail-closed" and not val:
            out["fail_closed"] = True
        elif key in ("--agent", "--db", "--config"):
            if not val:
                if not rest:
                    raise ValueError(f"{key} needs a value\n{USAGE}")
                val = rest.pop(0)
            out[key[2:]] = val
        else:
            raise ValueError(f"unknown option {opt!r}\n{USAGE}")
    out["agent"] = out["agent"] or DEFAULT_AGENTS[out["cli"]]
    return out


def _engine(db: str | None, config: Any) -> Any:
    from watchdog.core.config import resolve_db_url
    from watchdog.store.engine import make_engine

    url = resolve_db_url(db, config)
    if not url:
        raise LookupError("no store: pass --db URL, set AGENT_WATCHDOG_DB or [store] url")
    kw: dict[str, Any] = {}
    if not url.startswith("sqlite"):
        kw["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
    return make_engine(url, create=False, **kw)


def answer(opts: dict[str, Any], raw: str, engines: dict[str, Any] | None = None) -> Answer:
    """The answer to one hook call (never raises). `engines`: the resident helper's engines by
    store URL, kept between calls (without it the engine is this call's alone)."""
    cli = opts["cli"]
    try:
        ev = protocols.parse(raw)
    except ValueError as exc:
        return _outage(opts, None, f"unreadable hook input ({exc})")
    if ev.phase == protocols.OTHER:
        return protocols.allow()  # an event the hook does not judge (SessionStart, ...)
    engine = None
    try:
        from watchdog.core.config import load
        from watchdog.gateways.hooks.core import decide

        config = load(opts["config"])
        if engines is None:
            engine = _engine(opts["db"], config)
        else:
            key = f"{opts['db']}\x00{opts['config']}"
            if key not in engines:
                engines[key] = _engine(opts["db"], config)
            engine = engines[key]
        verdict = decide(engine, config, cli=cli, agent=opts["agent"], ev=ev)
    except Exception as exc:  # noqa: BLE001 — the hook never breaks the CLI by accident
        from watchdog.gateways.hooks.sessionkey import KeyFileError

        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        what = "its session key failed" if isinstance(exc, KeyFileError) else "the store failed"
        return _outage(opts, ev, f"{what} ({type(exc).__name__}: {first})")
    finally:
        if engine is not None and engines is None:
            engine.dispose()
    if verdict.allowed:
        return protocols.allow()
    if ev.phase != PRE:
        return protocols.end(verdict.reason)  # after the call: the session ends (the call ran)
    return protocols.deny(cli, ev.event, verdict.reason, end_session=verdict.end_session)


def _outage(opts: dict[str, Any], ev: Any, what: str) -> Answer:
    if opts["fail_closed"] and (ev is None or ev.phase == PRE):
        reason = f"agent-watchdog: refused (--fail-closed): {what}"
        return protocols.deny(opts["cli"], ev.event if ev else "PreToolUse", reason, end_session=False)
    return Answer("", f"agent-watchdog: hook: {what}; the call is let through (fail-open)\n", 0)


def emit(ans: Answer) -> int:
    if ans.stdout:
        sys.stdout.write(ans.stdout + "\n")
    if ans.stderr:
        sys.stderr.write(ans.stderr)
    sys.stdout.flush()
    return ans.exit_code


def refuse_unanswered(argv: Sequence[str]) -> int:
    """--fail-closed when the resident helper took the call but never answered."""
    opts = parse_args(argv)
    reason = "agent-watchdog: refused (--fail-closed): the resident helper did not answer"
    return emit(protocols.deny(opts["cli"], "PreToolUse" if opts["cli"] != "gemini" else "BeforeTool", reason,
                               end_session=False))


def run(argv: Sequence[str]) -> int:
    """The `hook CLI` command: stdin → answer on stdout/stderr, the exit status returned."""
    try:
        opts = parse_args(argv)
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1  # not 2: to Claude Code and Gemini an exit 2 means "block this call"
    try:
        raw = sys.stdin.read()
    except (OSError, UnicodeDecodeError) as exc:
        raw = ""
        sys.stderr.write(f"agent-watchdog: hook: cannot read stdin ({exc})\n")
    return emit(answer(opts, raw))


def main() -> None:
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(run(sys.argv[1:]))
