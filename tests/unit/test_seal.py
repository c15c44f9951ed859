"""Seals (HMAC-SHA256) and the daemon's key file, on a real filesystem."""

from __future__ import annotations

import os
import stat

import pytest

from watchdog.core.seal import Sealer
from watchdog.daemon.trust import keyfile
from watchdog.errors import ConfigError

KEY = bytes(range(32))


def test_identity_seal_binds_every_field():
    s = Sealer(KEY, "h1")
    base = ("run1", "h1", 4242, 1764412345.12, 1001, "process")
    mac = s.identity(*base)
    assert s.identity_ok(mac, *base)
    for i, other in enumerate(("run2", "h2", 4243, 1764412345.13, 1002, "tree")):
        changed = list(base)
        changed[i] = other
        assert not s.identity_ok(mac, *changed), f"field {i} is not sealed"
    assert not Sealer(bytes(32), "h1").identity_ok(mac, *base)  # another daemon's key
    assert not s.identity_ok("0" * 64, *base) and not s.identity_ok(None, *base)
    assert not s.identity_ok(mac, "run1", "h1", "not a pid", 1.0, 1, "process")


def test_field_boundaries_cannot_be_shifted():
    s = Sealer(KEY)
    assert s.identity("ab", "c", 1, 1.0, 1, "process") != s.identity("a", "bc", 1, 1.0, 1, "process")


def test_targets_seal_is_order_free_and_binds_the_run():
    s = Sealer(KEY)
    t = [("h", 10, 1.5, -1), ("h", 11, 2.5, 1001)]
    mac = s.targets("run1", t)
    assert s.targets_ok(mac, "run1", list(reversed(t)))
    assert not s.targets_ok(mac, "run2", t)
    assert not s.targets_ok(mac, "run1", t + [("h", 12, 3.5, -1)])
    assert not s.targets_ok(mac, "run1", [("h", 10, 1.5, -1)])


def test_alert_seal():
    s = Sealer(KEY)
    mac = s.alert("stop:r", "title", "body")
    assert s.alert_ok(mac, "stop:r", "title", "body")
    assert not s.alert_ok(mac, "stop:r", "title", "body!")
    assert "key" not in repr(s).lower() or KEY.hex() not in repr(s)


def test_short_keys_are_refused():
    with pytest.raises(ValueError):
        Sealer(b"short")


def test_key_file_is_created_0600_and_read_back(tmp_path):
    path = str(tmp_path / "attest.key")
    os.umask(0o022)
    key = keyfile.load_or_create(path)
    assert len(key) == 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert keyfile.load_or_create(path) == key  # the same key on the next start


def test_a_key_file_others_can_read_is_refused(tmp_path):
    path = tmp_path / "attest.key"
    keyfile.load_or_create(str(path))
    path.chmod(0o640)
    with pytest.raises(ConfigError, match=r"\[daemon\] key_file .* mode 0640 .* chmod 0600"):
        keyfile.load_or_create(str(path))


def test_a_damaged_key_file_or_missing_directory_is_a_one_line_error(tmp_path):
    path = tmp_path / "attest.key"
    path.write_text("not hex\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="not a sealing key"):
        keyfile.load_or_create(str(path))
    with pytest.raises(ConfigError, match="does not exist"):
        keyfile.load_or_create(str(tmp_path / "missing" / "attest.key"))


def test_a_symlinked_key_file_is_refused(tmp_path):
    real = tmp_path / "real.key"
    keyfile.load_or_create(str(real))
    link = tmp_path / "attest.key"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="cannot read"):
        keyfile.load_or_create(str(link))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_key_file_owned_by_another_user_is_refused(tmp_path):
    path = tmp_path / "attest.key"
    keyfile.load_or_create(str(path))
    os.chown(path, 65534, -1)
    with pytest.raises(ConfigError, match="owned by uid 65534"):
        keyfile.load_or_create(str(path))


def test_an_alert_seal_covers_its_age():
    import datetime as dt

    s = Sealer(KEY)
    t = dt.datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
    mac = s.alert("stop:r", "title", "body", t)
    assert s.alert_ok(mac, "stop:r", "title", "body", t)
    assert s.alert_ok(mac, "stop:r", "title", "body", t.replace(tzinfo=None))  # SQLite gives it back naive
    assert not s.alert_ok(mac, "stop:r", "title", "body", t + dt.timedelta(hours=1))  # made new again
    assert not s.alert_ok(mac, "stop:r", "title", "body")
    old = s.alert("stop:r", "title", "body")  # a row sealed before the age was: still verifies
    assert s.alert_ok(old, "stop:r", "title", "body", t)


def test_daemons_creating_the_key_at_once_agree_on_one_and_never_read_half_of_it(tmp_path):
    import threading

    from watchdog.daemon.trust import keyfile

    for round_ in range(20):
        path = str(tmp_path / f"attest{round_}.key")
        keys, errors = [], []
        start = threading.Barrier(8)

        def one():
            start.wait()
            try:
                keys.append(keyfile.load_or_create(path))
            except Exception as exc:  # noqa: BLE001 — the assertion below names it
                errors.append(exc)

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(set(keys)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"attest{i}.key" for i in range(20))
