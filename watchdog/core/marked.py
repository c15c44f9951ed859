"""How a writer's words appear in an alert: marked, bounded, on one line, defanged. Pure.

Anyone who can write a run (an SDK caller, a plain-SQL writer, an OTLP sender, a gateway's
client) chooses its agent name, its tools' names, its labels, its model, its conversation id,
its heartbeat text. An alert is read by a human who acts on it, so such text must never read
as the daemon's own words, nor as a link or a command to follow (issue 32, item 8). The rule,
written once here and applied by the table of outcomes (watchdog.core.outcomes):

- The **title** is the daemon's words only. A run is named there by `run_ref`: its short id
  only when that is 8 lowercase hex digits (the form every writer of this project generates),
  else "a run"; a stop reason only when it is one of the daemon's own (`reason_ref`).
- In the **body**, writer text appears only inside a marked field, `«…»` (`marked`): secrets
  masked (watchdog.core.scrub), control,
  format and line-break characters (newlines, ANSI escapes, bidi overrides, zero-width) become
  one space; at most `limit` characters, a cut shown as `…`; URLs and shell-looking text are
  defanged: `http` -> `hxxp`, `://` -> `[:]//`, a dot in a link's host, after `www`, in a host
  followed by a path or in a word ending in a common top-level domain -> `[.]`, the
  shell's metacharacters ``| ; & $ ` < >`` -> their fullwidth forms, `«` `»` -> `‹` `›` (a field
  cannot close itself early).
"""

from __future__ import annotations

import re
import unicodedata

from watchdog.core.scrub import scrub

OPEN, CLOSE = "«", "»"
NAME_CHARS = 64  # an agent, a tool, a model, a label: past this, cut
TEXT_CHARS = 200  # a free text (an error, a heartbeat, a partial answer)

# Fullwidth forms: they read the same to a human and mean nothing to a shell.
_SHELL = str.maketrans({"|": "¦", ";": "；", "&": "＆", "$": "＄", "`": "ˋ", "<": "＜", ">": "＞",
                        OPEN: "‹", CLOSE: "›"})
_SCHEME = re.compile(r"(?i)\b(h)(tt)(ps?)?(?=[:\[])|://")
# A dot in a link's host, or in a word ending in a common top-level domain ("evil.sh"), but not
# in a tool's dotted name ("search.read", "fs.write_file").
_URL_HOST = re.compile(r"(?<=\[:\]//)[^\s/?#]+")
_TLDS = ("com|net|org|io|sh|dev|app|ai|co|me|info|biz|xyz|top|site|online|link|click|zip|mov|ru|cn|"
         "us|uk|de|fr|nl|eu|in|ly|gg|to|cc|tk|ws|su|pw|run|cloud|host|page|live|icu|shop|pro|tv")
_DOMAIN = re.compile(rf"\b[\w-]+(?:\.[\w-]+)*\.(?:{_TLDS})\b", re.IGNORECASE)
# Chat apps link more than a scheme or a known domain: any `www.` word ("www.evil.ninja"), and
# a dotted host followed by a path ("evil.ninja/login"). Not a tool's dotted name ("fs.read").
_WWW_WORD = re.compile(r"(?i)\bwww\.[\w.-]+")
_HOST_PATH = re.compile(r"\b[\w-]+(?:\.[\w-]+)*\.[A-Za-z][\w-]*(?=/)")
_RUN_REF = re.compile(r"[0-9a-f]{8}")
_RUN_ID = re.compile(r"[0-9a-f]{8,64}")


def _one_line(text: str) -> str:
    # Cc (controls, ESC, newlines), Cf (bidi overrides, zero-width), Zl/Zp (line and paragraph separators).
    kept = "".join(" " if unicodedata.category(c)[0] == "C" or unicodedata.category(c) in ("Zl", "Zp") else c
                   for c in text)
    return " ".join(kept.split())


def _defang_scheme(m: re.Match[str]) -> str:
    if m.group(0) == "://":
        return "[:]//"
    return f"{m.group(1)}xx{m.group(3) or ''}"


def defanged(text: str) -> str:
    """`text` with its links and shell-looking parts made inert (see the module docstring)."""
    text = _SCHEME.sub(_defang_scheme, text)
    text = _URL_HOST.sub(lambda m: m.group(0).replace(".", "[.]"), text)
    text = _DOMAIN.sub(lambda m: m.group(0).replace(".", "[.]") if "[.]" not in m.group(0) else m.group(0), text)
    text = _WWW_WORD.sub(lambda m: m.group(0).replace(".", "[.]"), text)
    text = _HOST_PATH.sub(lambda m: m.group(0).replace(".", "[.]"), text)
    return text.translate(_SHELL)


def marked(text: object, limit: int = NAME_CHARS) -> str:
    """A writer's text as one marked, bounded, defanged field: `«…»`. None reads `«»`."""
    s = _one_line(scrub("" if text is None else str(text)[: limit * 4]))  # bound the work; no secret shown
    s = defanged(s)
    if len(s) > limit:
        s = s[: max(1, limit - 1)].rstrip() + "…"
    return f"{OPEN}{s}{CLOSE}"


# What could open a Markdown or HTML construct mid-line once `defanged` made the shell's and the
# field's characters inert (backticks, `<`, `>`, `|`, `&` are fullwidth by then): emphasis,
# links and images, strikethrough, a heading's closing `#`, escapes (a list, a heading or a fence
# only opens at a line's start, and the text is one line inside the daemon's). CommonMark lets
# any ASCII punctuation be backslash-escaped, and an escaped one is only itself.
_MARKDOWN = re.compile(r"[\\*_\[\]()!#~]")


def _md_escape(m: re.Match[str], s: str) -> str:
    """Backslash-escaped, but an underscore between two letters or digits (`verify_iban`): it can
    neither open nor close emphasis there (CommonMark), and the raw file keeps the name readable."""
    i = m.start()
    if m.group(0) == "_" and 0 < i < len(s) - 1 and s[i - 1].isalnum() and s[i + 1].isalnum():
        return "_"
    return "\\" + m.group(0)

# GFM's extended autolinks need no `<>` nor a scheme: `www.` starts a link to any domain (one
# `_DOMAIN` does not know: "www.evil.ninja"), `@` an email one ("x@evil.ninja", also after
# `mailto:` / `xmpp:`). The dot after www and the @ are made inert, as `defanged` does a host's dots.
_WWW = re.compile(r"(?i)\b(www)\.")
_AT = str.maketrans({"@": "＠"})


def md_text(text: object, limit: int = TEXT_CHARS) -> str:
    """A writer's text inside Markdown (the postmortem): one line (no heading, list or fence can
    start), bounded, secrets masked, links and shell-looking text defanged as in `marked`, and
    every character that could open emphasis, a link, an image or HTML escaped. Unmarked (no
    «»): it reads as the name it is. None reads as an empty string."""
    s = _one_line(scrub("" if text is None else str(text)[: limit * 4]))
    s = _WWW.sub(r"\1[.]", defanged(s)).translate(_AT)
    if len(s) > limit:
        s = s[: max(1, limit - 1)].rstrip() + "…"
    return _MARKDOWN.sub(lambda m: _md_escape(m, s), s)


def md_run_id(run_id: object) -> str:
    """A run's whole id in Markdown: as code when of the generated form (hex), else as `md_text`."""
    return f"`{run_id}`" if isinstance(run_id, str) and _RUN_ID.fullmatch(run_id) else md_text(run_id, 64)


def run_ref(run_id: object) -> str:
    """A run as a title may name it: `run 1a2b3c4d` for an id of the generated form, else `a run`."""
    short = run_id[:8] if isinstance(run_id, str) else ""
    return f"run {short}" if _RUN_REF.fullmatch(short) else "a run"


def ident(run_id: object) -> str:
    """A run's whole id in a body: as is when of the generated form (hex), else marked."""
    return run_id if isinstance(run_id, str) and _RUN_ID.fullmatch(run_id) else marked(run_id, 40)


def command_id(run_id: object) -> str | None:
    """The id a command names the run by: its whole id, when of the generated form (hex), else None.
    Never its 8-character short form: a writer chooses its run's id, so another run may share
    those 8 (chosen to), and `show 1a2b3c4d` would then fail as ambiguous, or name the other run
    once the first is gone. A title may still call the run `run 1a2b3c4d` (run_ref): a name to
    read, not a command to paste."""
    return run_id if isinstance(run_id, str) and _RUN_ID.fullmatch(run_id) else None


def show_command(run_id: object) -> str:
    """The command line an alert ends with: only a generated id is pasted into a shell, whole."""
    whole = command_id(run_id)
    return f"agent-watchdog show {whole}" if whole is not None else "agent-watchdog runs --all"


def reason_ref(reason: object, known: tuple[str, ...]) -> str:
    """A stop reason as a title may name it: one of the daemon's own words (`known`), else a phrase."""
    return reason if isinstance(reason, str) and reason in known else "a reason the run gave"
