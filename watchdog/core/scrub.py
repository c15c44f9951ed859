"""Scrub secrets out of free text before it is stored, logged, alerted or shown to a model.

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
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import overload

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
