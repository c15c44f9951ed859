"""The scrubber (pure) and the one place error messages are shaped for the store."""

from __future__ import annotations

import pytest

from watchdog.core.lifecycle import ERROR_MSG_MAX_CHARS, error_fields
from watchdog.core.text import MASK, luhn_ok, scrub

SECRET = "sk-live-TENANTA-SECRET"


@pytest.mark.parametrize("text, expected", [
    # URL userinfo, query strings and fragments
    ("GET https://api.example.org/v1/charge?api_key=" + SECRET + "&amount=3 failed",
     "GET https://api.example.org/v1/charge?*** failed"),
    ("could not connect to postgresql://watchdog:hunter2@db.example.org:5432/aw",
     "could not connect to postgresql://watchdog:***@db.example.org:5432/aw"),
    ("mailtos://user:pass@example.org?to=oncall@example.org", "mailtos://user:***@example.org?***"),
    ("clone https://ghp_abcdefghijklmnopqrstuvwxyz0123@github.com/o/r failed",
     "clone https://***@github.com/o/r failed"),
    ("no tables at postgresql+psycopg://postgres@127.0.0.1:5432/aw", "no tables at postgresql+psycopg://postgres@127.0.0.1:5432/aw"),
    ("redirect to https://app.example.org/cb#access_token=abc.def", "redirect to https://app.example.org/cb#***"),
    # headers and credentials
    ("Authorization: Bearer abc123def456ghi", "Authorization: ***"),
    ('{"authorization": "Basic dXNlcjpwYXNz"}', '{"authorization": "***"}'),
    ("got 401 with bearer eyJhbGciOiJIUzI1NiJ9 token", "got 401 with bearer *** token"),
    # key = value styles
    ("upstream said (api_key=" + SECRET + "); do not retry", "upstream said (api_key=***); do not retry"),
    ('{"api_key": "sk-live-VICTIM", "card": "4111111111111111"}', '{"api_key": "***", "card": "***"}'),
    ("password=hunter2 user=bob", "password=*** user=bob"),
    ("X-Api-Key: k-9f8e7d6c", "X-Api-Key: ***"),
    ("client_secret => 'abc'", "client_secret => '***'"),
    ("Set-Cookie: session=abc123; Path=/", "Set-Cookie: ***; Path=/"),
    ("session=abc123; path=/", "session=***; path=/"),
    # well-known token shapes, bare
    ("key " + SECRET + " rejected", "key *** rejected"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123 expired", "token *** expired"),
    ("slack xoxb-123456789012-abcdefABCDEF refused", "slack *** refused"),
    ("AKIAIOSFODNN7EXAMPLE is not authorised", "*** is not authorised"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl bad", "jwt *** bad"),
    # long high-entropy tokens
    ("nonce Zx8Qp2Lm9Rt4Vw7Yb3Nc6Hd1Jk5 reused", "nonce *** reused"),
    # card-like numbers (Luhn), spaced or not; other long numbers stay
    ("card 4111 1111 1111 1111 declined", "card *** declined"),
    ("card 5500-0000-0000-0004 declined", "card *** declined"),
    ("order 1234567890123 not found", "order 1234567890123 not found"),
])
def test_secrets_are_masked(text, expected):
    assert scrub(text) == expected


@pytest.mark.parametrize("text", [
    "500 Internal Server Error",
    "ConnectionRefusedError: [Errno 111] Connection refused",
    "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='api.x.org', port=443): Max retries exceeded",
    "timeout after 30.0 s calling verify_iban",
    "connection_pool_timeout_exceeded_2 while reading",
    "KeyError: 'customer_id'",
    "https://api.example.org/v1/status returned 503",
])
def test_ordinary_errors_are_left_alone(text):
    assert scrub(text) == text


def test_scrub_is_idempotent_and_keeps_none():
    once = scrub(f"https://u:p@h/x?token={SECRET} api_key={SECRET}")
    assert scrub(once) == once and SECRET not in once
    assert scrub(None) is None and scrub("") == ""


def test_luhn():
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")


def test_error_fields_scrub_before_cutting_and_never_keep_the_secret():
    err = ConnectionError("x" * 150 + f" https://bank.example.org/v1?api_key={SECRET} " + "y" * 300)
    cls, msg = error_fields(err)
    assert cls == "ConnectionError"
    assert SECRET not in msg and "api_key" not in msg and len(msg) <= ERROR_MSG_MAX_CHARS
    # a token straddling the cut is never half kept
    err = RuntimeError("e " * 95 + SECRET)
    assert "TENANTA" not in error_fields(err)[1]


def test_error_fields_class_only():
    assert error_fields(ValueError(f"api_key={SECRET}"), "class") == ("ValueError", None)
    assert error_fields("tool said no", "class") == ("Error", None)


def test_a_huge_message_is_bounded_before_it_is_scrubbed():
    cls, msg = error_fields(RuntimeError(("word " * 100_000) + SECRET))
    assert len(msg) <= ERROR_MSG_MAX_CHARS and MASK not in msg
