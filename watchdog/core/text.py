"""Text every surface shares, made safe: a URL without its secret, a duration, secrets scrubbed out of free text,
and a writer's words marked and bounded in an alert.

Small text rules every surface shares: how a URL is shown without its secret, how a
duration reads. Pure.

Scrub secrets out of free text before it is stored, logged, alerted or shown to a model.

Pure: text in, text out. Applied to every error message the SDK records and to
everything the daemon copies out of the store (alerts, circuit rows, logs), so a
secret an upstream error echoes back (`…?api_key=sk-live-…`, `Authorization:
Bearer …`, a card number in a validation error) never travels further than the
process that saw it.

What it removes, each replaced by `***`:

- URL passwords and tokens in the userinfo (`https://user:pass@host` →
  `https://user:***@host`, `https://ghp_…@host` → `https://***@host`) and query
  strings and fragments (`https://host/p?token=x` → `https://host/p?***`);
- `Authorization:` / `Proxy-Authorization:` header values and `Bearer` / `Basic`
  / `Token` credentials;
- the value of any key/value pair whose key names a secret (`api_key=`,
  `"token": "…"`, `password: …`, `client_secret=`, `X-Api-Key: …`, `session=`…);
- well-known token shapes (OpenAI/Stripe `sk-…`, GitHub `ghp_…`, Slack `xox?-…`,
  AWS `AKIA…`, JWTs `eyJ….….…`);
- long high-entropy tokens (24+ characters mixing letters and digits, random-looking);
- card-like numbers (13 to 19 digits, spaces or dashes allowed, Luhn-valid).

Over-scrubbing a harmless identifier is accepted; leaking a key is not.

How a writer's words appear in an alert: marked, bounded, on one line, defanged. Pure.

Anyone who can write a run (an SDK caller, a plain-SQL writer, an OTLP sender, a gateway's
client) chooses its agent name, its tools' names, its labels, its model, its conversation id,
its heartbeat text. An alert is read by a human who acts on it, so such text must never read
as the daemon's own words, nor as a link or a command to follow (issue 32, item 8). The rule,
written once here and applied by the table of outcomes (watchdog.core.outcomes):

- The **title** is the daemon's words only. A run is named there by `run_ref`: its short id
  only when that is 8 lowercase hex digits (the form every writer of this project generates),
  else "a run"; a stop reason only when it is one of the daemon's own (`reason_ref`).
- In the **body**, writer text appears only inside a marked field, `«…»` (`marked`): secrets
  masked (watchdog.core.text), control,
  format and line-break characters (newlines, ANSI escapes, bidi overrides, zero-width) become
  one space; at most `limit` characters, a cut shown as `…`; URLs and shell-looking text are
  defanged: `http` -> `hxxp`, `://` -> `[:]//`, a dot in a link's host, after `www`, in a host
  followed by a path or in a word ending in a common top-level domain -> `[.]`, the
  shell's metacharacters ``| ; & $ ` < >`` -> their fullwidth forms, `«` `»` -> `‹` `›` (a field
  cannot close itself early).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from typing import overload


_SCHEME = re.compile(r"([A-Za-z][\w+.-]*)://")


def url_scheme_only(url: object) -> str:
    """An alert URL as `slack://…`: everything after an apprise scheme may be a secret."""
    m = _SCHEME.match(url) if isinstance(url, str) else None
    return f"{m[1]}://…" if m else "…"


def url_without_password(url: str | None) -> str | None:
    """A store URL fit for a terminal or a log: `scheme://user:***@host/db`, no query string
    (it may carry a password too). Works on URLs no parser accepts."""
    if not url:
        return url
    m = _SCHEME.match(url)
    if not m:
        return "(unparsable URL)"
    rest = url[m.end():].split("?", 1)[0]
    auth, at, hostpart = rest.rpartition("@")
    if at:
        user = auth.split(":", 1)[0]
        rest = f"{user}:***@{hostpart}" if ":" in auth else f"{user}@{hostpart}"
    return f"{m[1]}://{rest}"


def duration(seconds: float | None) -> str:
    """`45s`, `12m05s`, `3h20m`: short enough for a table column."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069]+")


def one_line(text: object, limit: int = 200) -> str:
    """Text from the store (a name any writer chose) fit for one line of an alert or a log:
    control and bidi characters become one space, and it is cut at `limit` with a marker."""
    s = _UNPRINTABLE.sub(" ", text if isinstance(text, str) else repr(text)).strip()
    return s if len(s) <= limit else s[: max(0, limit - 1)] + "…"


_TERMINAL_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069]+")


def terminal_safe(text: str) -> str:
    """A text the CLI prints whose lines and tabs stay, but no escape sequence (ANSI colours, an
    OSC 8 link, a screen clear) nor bidi control of a writer's name reaches the terminal."""
    return _TERMINAL_UNSAFE.sub(" ", text)


def printable(text: str) -> bool:
    """No control, line-break or bidi characters: fit to be a name on one line."""
    return _UNPRINTABLE.search(text) is None


# -- Scrub secrets out of free text before it is stored, logged, alerted or shown to a model -----------------------

MASK = "***"

# Keys whose values are secrets, matched inside a key name (`x-api-key`, `db_password`, `refresh_token`).
_SECRET_KEY = (r"(?:api[_-]?key|apikey|access[_-]?key|secret|passw(?:or)?d|passwd|pwd|token|auth|"
               r"credential|session|cookie|signature|private[_-]?key|client[_-]?secret)")

_URL = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.\-]{1,30}://)(?P<rest>[^\s<>\"'`]+)")
_AUTH_HEADER = re.compile(r"(?i)\b((?:proxy-)?authori[sz]ation\b[\"']?\s*[:=]\s*[\"']?)([^\r\n\"',;}]+)")
_SCHEME_CRED = re.compile(r"(?i)\b(bearer|basic|token|digest)(\s+)([A-Za-z0-9._~+/=\-]{6,})")
_KEY_VALUE = re.compile(
    r"(?i)(?P<key>[\w.\-]*" + _SECRET_KEY + r"[\w.\-]*)"
    r"(?P<sep>[\"']?\s*(?:=>|=|:)\s*)"
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s,;&)}\]\"']+)")
_KNOWN_TOKENS = re.compile(
    r"\b(?:sk|pk|rk)[-_](?:live|test|proj|ant|or)?[-_]?[A-Za-z0-9_\-]{8,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{16,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{16,}"
    r"|\bxox[abposr]-[A-Za-z0-9\-]{8,}"
    r"|\b(?:AKIA|ASIA)[A-Z0-9]{12,}"
    r"|\beyJ[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]*")
_LONG_TOKEN = re.compile(r"[A-Za-z0-9_\-+=]{24,}")
_HEX = re.compile(r"[0-9a-f]+|[0-9A-F]+")
_CARD = re.compile(r"(?<![\d.])\d(?:[ \-]?\d){12,18}(?![\d.])")

# A random token of n characters over an alphabet of 60+ has ~log2(n) bits per
# character at n < 60; English words and snake_case identifiers stay well below.
ENTROPY_MIN_BITS = 3.6


@overload
def scrub(text: str) -> str: ...


@overload
def scrub(text: None) -> None: ...


def scrub(text: str | None) -> str | None:
    """`text` with every secret-looking part replaced by `***` (None stays None)."""
    if not text:
        return text
    text = _URL.sub(_url, text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + MASK, text)
    text = _SCHEME_CRED.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    text = _KEY_VALUE.sub(_key_value, text)
    text = _KNOWN_TOKENS.sub(MASK, text)
    text = _LONG_TOKEN.sub(_token, text)
    text = _CARD.sub(_card, text)
    return text


def _url(m: re.Match[str]) -> str:
    rest = m.group("rest")
    # Query and fragment first: they are where tokens ride (?api_key=, #access_token=).
    for mark in ("?", "#"):
        head, sep, _tail = rest.partition(mark)
        if sep:
            rest = head + sep + MASK
            break
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        if colon:  # user:password — the user name stays, as SQLAlchemy and apprise print it
            userinfo = user + ":" + MASK
        elif _KNOWN_TOKENS.sub(MASK, _LONG_TOKEN.sub(_token, userinfo)) != userinfo:
            userinfo = MASK  # a token used as the user name (https://TOKEN@host/...)
        authority = userinfo + "@" + host
    return m.group("scheme") + authority + slash + path


def _key_value(m: re.Match[str]) -> str:
    value = m.group("value")
    if value == MASK or value.strip("\"'") == MASK:
        return m.group(0)
    quote = value[0] if value[:1] in "\"'" and len(value) >= 2 else ""
    return m.group("key") + m.group("sep") + quote + MASK + quote


def entropy_bits(s: str) -> float:
    """Shannon entropy of the characters of `s`, in bits per character."""
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values()) if n else 0.0


def _token(m: re.Match[str]) -> str:
    s = m.group(0)
    if MASK in s:
        return s
    upper = any(c.isupper() for c in s)
    lower = any(c.islower() for c in s)
    digits = sum(c.isdigit() for c in s)
    if upper and lower and digits and entropy_bits(s) >= ENTROPY_MIN_BITS:
        return MASK  # random mixed-case alphanumerics: an API key, a session id
    if len(s) >= 32 and _HEX.fullmatch(s):
        return MASK  # a hex secret (also hashes and ids: over-scrubbing is accepted)
    if digits >= len(s) // 4 and (upper or lower) and entropy_bits(s) >= ENTROPY_MIN_BITS:
        return MASK  # single-case random alphanumerics; words with a digit or two are not
    return s


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(m: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", m.group(0))
    return MASK if 13 <= len(digits) <= 19 and luhn_ok(digits) else m.group(0)


# -- How a writer's words appear in an alert: marked, bounded, on one line, defanged. Pure -------------------------

OPEN, CLOSE = "«", "»"
NAME_CHARS = 64  # an agent, a tool, a model, a label: past this, cut
TEXT_CHARS = 200  # a free text (an error, a heartbeat, a partial answer)

# Fullwidth forms: they read the same to a human and mean nothing to a shell.
_SHELL = str.maketrans({"|": "¦", ";": "；", "&": "＆", "$": "＄", "`": "ˋ", "<": "＜", ">": "＞",
                        OPEN: "‹", CLOSE: "›"})
_marked_SCHEME = re.compile(r"(?i)\b(h)(tt)(ps?)?(?=[:\[])|://")
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
    text = _marked_SCHEME.sub(_defang_scheme, text)
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
