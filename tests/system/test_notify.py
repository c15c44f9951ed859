"""Alert delivery against real local receivers (SMTP and a JSON webhook); no network."""

from __future__ import annotations

import hashlib
import socket
import time

import pytest

from alertsinks import closed_port
from watchdog.daemon.alerts.notify import Notifier, Target, TargetResult, url_error

TITLE = "agent-watchdog: run r-42 stopped"
BODY = "reason: budget_exceeded\nrun: r-42\ncost: $12.50 of $10.00"


@pytest.fixture
def dead_port():
    sock, port = closed_port()
    yield port
    sock.close()


def by_url(results: list[TargetResult], needle: str) -> TargetResult:
    (found,) = [r for r in results if needle in r.target.privacy_url]
    return found


def test_email_arrives_with_title_and_plain_text_body(smtp):
    results = Notifier([smtp.url(to="oncall@example.org")]).send(TITLE, BODY)

    assert [r.ok for r in results] == [True]
    assert results[0].error is None
    assert smtp.wait_for(1)
    (mail,) = smtp.messages
    assert mail["Subject"] == TITLE
    assert mail["To"] == "oncall@example.org"
    assert mail.get_content_type() == "text/plain"
    assert mail.get_content().splitlines() == BODY.splitlines()


def test_json_post_arrives(http):
    results = Notifier([http.url()]).send(TITLE, BODY)

    assert [r.ok for r in results] == [True]
    assert http.wait_for(1)
    (post,) = http.received
    assert post["title"] == TITLE
    assert post["message"] == BODY


def test_failing_target_reports_reason_and_others_still_get_it(http, smtp):
    notifier = Notifier([http.url(), smtp.url()])
    http.fail_next(1, status=500)

    results = notifier.send(TITLE, BODY)

    failed, delivered = by_url(results, "json://"), by_url(results, "mailto://")
    assert failed.ok is False
    assert "500" in failed.error and "\n" not in failed.error
    assert delivered.ok is True and delivered.error is None
    assert smtp.wait_for(1)
    assert http.rejected == 1 and http.received == []


def test_smtp_refusal_is_a_result_that_quotes_the_server(smtp):
    smtp.fail_next(1, code=550)

    (result,) = Notifier([smtp.url()]).send(TITLE, BODY)  # returns: an exception would fail the test here

    assert result.ok is False
    assert result.error == ('Sending email to "oncall@example.org" failed '
                            "(server said 550 sink told to refuse this message)")
    assert smtp.messages == []
    # The refusal was for that message only: the next one is delivered.
    (again,) = Notifier([smtp.url()]).send(TITLE, BODY)
    assert again.ok is True and smtp.wait_for(1)


def test_skip_does_not_resend_to_a_target_that_already_got_it(http, smtp):
    notifier = Notifier([http.url(), smtp.url()])
    http.fail_next(1)
    first = notifier.send(TITLE, BODY)
    delivered = {r.target.id for r in first if r.ok}
    assert delivered == {by_url(first, "mailto://").target.id}

    retry = notifier.send(TITLE, BODY, skip=delivered)

    assert [(r.target.id, r.ok) for r in retry] == [(by_url(first, "json://").target.id, True)]
    assert http.wait_for(1) and len(http.received) == 1
    assert smtp.wait_for(1) and len(smtp.messages) == 1


def test_unreachable_target_fails_with_reason_without_raising(dead_port, smtp):
    notifier = Notifier(
        [
            f"json://127.0.0.1:{dead_port}/hook",
            f"mailto://127.0.0.1:{dead_port}?to=a@example.org&from=b@example.org&mode=insecure",
            smtp.url(),
        ],
        timeout_s=5,
    )

    results = notifier.send(TITLE, BODY)

    assert [r.ok for r in results] == [False, False, True]
    for r in results[:2]:
        assert r.error and "\n" not in r.error
    assert smtp.wait_for(1)


def test_target_ids_are_stable_hashes_not_urls(http):
    url = http.url()
    (target,) = Notifier([url, url]).targets  # a duplicate URL is one target

    assert target == Notifier([url]).targets[0]
    assert target.id == hashlib.sha256(url.encode()).hexdigest()[:12]
    assert url not in target.id


@pytest.mark.parametrize("garbage,reason", [
    ("not a url", "not an apprise URL (expected schema://...)"),
    ("slack://", "An invalid Slack (first) Token () was specified."),
    ("", "empty URL"),
    ("nosuchservice://x", "Unparseable URL nosuchservice://x"),
    ("slack://T0SECRETA/B0SECRETB/", None),  # checked below: the reason never quotes the token
])
def test_url_error_gives_the_reason_in_one_line(garbage, reason):
    got = url_error(garbage)

    if reason is not None:
        assert got == reason
    assert isinstance(got, str) and got.strip() and "\n" not in got
    assert "SECRET" not in got


def test_url_error_accepts_valid_urls(http, smtp):
    assert url_error(http.url()) is None
    assert url_error(smtp.url()) is None


def test_unparsable_url_raises_value_error_naming_index_not_secret():
    with pytest.raises(ValueError, match=r"#1 \(slack://") as excinfo:
        Notifier(["json://127.0.0.1/hook", "slack://T0SECRETA/B0SECRETB/"])
    assert "SECRET" not in str(excinfo.value)


def test_privacy_url_hides_password():
    # apprise 2.3 rejects mailto://user:secret@127.0.0.1 alone ("user@127.0.0.1"
    # is no valid From address); neither the error nor the usable form leaks it.
    with pytest.raises(ValueError) as excinfo:
        Notifier(["mailto://user:secret@127.0.0.1"])
    assert "secret" not in str(excinfo.value)
    assert "secret" not in (url_error("mailto://user:secret@127.0.0.1") or "")

    (target,) = Notifier(["mailto://user:secret@127.0.0.1?from=watchdog@example.org"]).targets

    assert isinstance(target, Target)
    assert target.privacy_url.startswith("mailto://")
    assert "secret" not in target.privacy_url


def test_no_secret_in_any_log_record_during_a_failed_send(caplog, dead_port):
    password, token = "pw-s3cr3t-value", "tok3nS3cr3tValue9"
    urls = [
        f"json://alice:{password}@127.0.0.1:{dead_port}/hook",
        # apprise logs this token at DEBUG in the POST URL and in the socket error.
        f"apprise://127.0.0.1:{dead_port}/{token}?version=1",
        f"mailto://alice:{password}@127.0.0.1:{dead_port}?from=w@example.org&to=x@example.org",
    ]
    caplog.set_level(1)  # everything, apprise's TRACE included

    notifier = Notifier(urls, timeout_s=5)
    results = notifier.send(TITLE, BODY)

    assert [r.ok for r in results] == [False, False, False]
    messages = [r.getMessage() for r in caplog.records]
    for secret in (password, token):
        assert not [m for m in messages if secret in m]
        assert secret not in caplog.text
        assert all(secret not in r.error for r in results)
        assert all(secret not in t.privacy_url for t in notifier.targets)
    # The stream is the real one: apprise did try to log the token, and it was masked.
    assert any("/notify/****" in m for m in messages)
    assert any(r.name == "watchdog.notify" and "failed" in r.getMessage() for r in caplog.records)


def test_silent_target_fails_within_timeout_instead_of_hanging():
    # Listening but never accepting: the kernel completes the handshake, then nothing.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        notifier = Notifier([f"json://127.0.0.1:{port}/hook"], timeout_s=1)

        started = time.monotonic()
        (result,) = notifier.send(TITLE, BODY)
        elapsed_s = time.monotonic() - started

    assert result.ok is False
    assert result.error == "A Connection error occurred sending JSON notification to 127.0.0.1 (Read timed out)"
    # It waited for its 1 s timeout, not for ever: generous upper bound for a loaded box, and a lower
    # bound showing it was the timeout (not a refusal) that ended the wait.
    assert 0.9 <= elapsed_s < 30, elapsed_s


def test_concurrent_sends_keep_their_own_causes_and_leave_apprise_logging_as_it_was(dead_port, http):
    """Targets are sent to at once, each in its own lane: each result keeps its own cause, and
    the host's setting of apprise's logger (the CLI silences it) is restored after the last one."""
    import logging

    import apprise

    logger = logging.getLogger(apprise.LOGGER_NAME)
    before = (logger.level, logger.propagate)
    logger.setLevel(logging.CRITICAL)
    try:
        notifier = Notifier([f"json://127.0.0.1:{dead_port}/a", http.url(), f"json://127.0.0.1:{dead_port}/b"],
                            timeout_s=5)
        for _ in range(3):
            refused_a, ok, refused_b = notifier.send(TITLE, BODY)
            assert ok.ok and not refused_a.ok and not refused_b.ok
            assert "Connection refused" in refused_a.error and "Connection refused" in refused_b.error
        assert (logger.level, logger.propagate) == (logging.CRITICAL, before[1])
        assert http.wait_for(3) and len(http.received) == 3
    finally:
        logger.setLevel(before[0])
        logger.propagate = before[1]
