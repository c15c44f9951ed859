"""The web view's auth file: passlib's pbkdf2_sha256 format, the lines it refuses, the header check."""

from __future__ import annotations

import base64

import pytest

from watchdog.web import auth

TOKEN = "t" * 24


def _file(tmp_path, text: str, mode: int = 0o600):
    path = tmp_path / "web.auth"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_passlibs_own_vector_verifies_and_ours_round_trips():
    # passlib's test vector for pbkdf2_sha256: a hash passlib (or Flask apps using it) made is accepted.
    vector = auth._Hash.parse("$pbkdf2-sha256$1212$4vjV83LKPjQzk31VI4E0Vw$hsYF68OiOUPdDZ1Fg.fJPeq1h/gXXY7acBp9/6c.tmQ",
                              min_rounds=1)
    assert vector.matches(b"password") and not vector.matches(b"Password")
    ours = auth._Hash.parse(auth.hash_password("pw", rounds=auth.MIN_ROUNDS))
    assert ours.matches(b"pw") and not ours.matches(b"pw ")


def test_bearer_and_basic_headers(tmp_path):
    line = auth.hash_password("s3cret", rounds=auth.MIN_ROUNDS)
    creds = auth.load(_file(tmp_path, f"# readers\n\n{TOKEN}\nalice:{line}\n"))
    basic = "Basic " + base64.b64encode(b"alice:s3cret").decode()
    assert creds.check(f"Bearer {TOKEN}") == "token" and creds.check(f"bearer  {TOKEN} ") == "token"
    assert creds.check(basic) == "alice" and creds.check(basic) == "alice"  # the second from the cache
    for bad in (None, "", f"Bearer {TOKEN}x", f"Token {TOKEN}", "Basic " + base64.b64encode(b"alice:x").decode(),
                "Basic " + base64.b64encode(b"bob:s3cret").decode(), "Basic %%%", "Basic " + base64.b64encode(b"alice").decode()):
        assert creds.check(bad) is None, bad


@pytest.mark.parametrize("text, says", [
    ("bob:$2y$05$abcdefghijklmnopqrstuv\n", "line 1 (user 'bob'): the password hash must be $pbkdf2-sha256$"),
    ("bob:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n", "agent-watchdog web --hash-password"),
    ("# c\nshort\n", "line 2: a token is one word of at least 16 characters"),
    (f"{TOKEN} extra\n", "a token is one word"),
    ("# nothing\n", "no token and no user"),
    (f"bob:$pbkdf2-sha256$1000$AAAA$AAAA\n", "1000 rounds: give at least 10000"),
])
def test_unusable_lines_are_refused_by_line_never_quoting_a_secret(tmp_path, text, says):
    with pytest.raises(auth.AuthFileError) as err:
        auth.load(_file(tmp_path, text))
    assert says in str(err.value) and "abcdefghij" not in str(err.value) and "W6ph5" not in str(err.value)


def test_a_file_other_users_can_read_or_write_is_refused(tmp_path):
    for mode in (0o644, 0o602, 0o620):
        with pytest.raises(auth.AuthFileError, match="accessible to other users"):
            auth.load(_file(tmp_path, TOKEN + "\n", mode))
    assert len(auth.load(_file(tmp_path, TOKEN + "\n", 0o640))) == 1  # a group may read it
