"""sd_notify client against real AF_UNIX datagram sockets."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import uuid

import pytest

from watchdog.daemon.process.sdnotify import notify, watchdog_interval_s


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(2.0)
    return sock


@pytest.fixture
def short_tmp():
    # sun_path is limited to 108 bytes and pytest's tmp_path can be longer
    # (it embeds the test name), so use a short directory directly in /tmp.
    with tempfile.TemporaryDirectory(prefix="sdn-") as d:
        yield d


def test_path_socket_receives_one_datagram(short_tmp):
    address = os.path.join(short_tmp, "notify")
    with _receiver(address) as rx:
        assert notify("READY=1", "STATUS=x", env={"NOTIFY_SOCKET": address}) is True
        assert rx.recv(4096) == b"READY=1\nSTATUS=x"


def test_uses_os_environ_by_default(short_tmp, monkeypatch):
    address = os.path.join(short_tmp, "notify")
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    with _receiver(address) as rx:
        assert notify("WATCHDOG=1") is True
        assert rx.recv(4096) == b"WATCHDOG=1"


def test_abstract_socket():
    name = f"agent-watchdog-test-{uuid.uuid4().hex}"
    with _receiver("\0" + name) as rx:
        assert notify("READY=1", "STATUS=abstract", env={"NOTIFY_SOCKET": "@" + name})
        assert rx.recv(4096) == b"READY=1\nSTATUS=abstract"


@pytest.mark.parametrize("env", [{}, {"NOTIFY_SOCKET": ""}])
def test_unset_socket_is_false(env):
    assert notify("READY=1", env=env) is False


def test_unset_socket_in_os_environ(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False


def test_missing_path_is_false_and_quiet(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="watchdog.sdnotify")
    env = {"NOTIFY_SOCKET": str(tmp_path / "does-not-exist")}
    assert notify("READY=1", env=env) is False
    assert any("failed" in r.getMessage() for r in caplog.records)
    assert all(r.levelno <= logging.DEBUG for r in caplog.records)


def test_missing_abstract_socket_is_false():
    env = {"NOTIFY_SOCKET": f"@agent-watchdog-absent-{uuid.uuid4().hex}"}
    assert notify("READY=1", env=env) is False


def test_socket_gone_after_first_send(short_tmp):
    # systemd restarted / socket removed while the daemon keeps running.
    address = os.path.join(short_tmp, "notify")
    rx = _receiver(address)
    env = {"NOTIFY_SOCKET": address}
    assert notify("WATCHDOG=1", env=env) is True
    rx.close()
    os.unlink(address)
    assert notify("WATCHDOG=1", env=env) is False


def test_unsupported_address_is_false():
    assert notify("READY=1", env={"NOTIFY_SOCKET": "vsock:2:1234"}) is False


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "60000000"}, 60.0),
        ({"WATCHDOG_USEC": "1500000"}, 1.5),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}, 60.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "junk"}, None),
        ({}, None),
        ({"WATCHDOG_USEC": ""}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "sixty"}, None),
        ({"WATCHDOG_PID": str(os.getpid())}, None),
    ],
)
def test_watchdog_interval(env, expected):
    assert watchdog_interval_s(env) == expected


def test_watchdog_interval_from_os_environ(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval_s() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert watchdog_interval_s() is None
