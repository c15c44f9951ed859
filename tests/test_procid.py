"""procid must agree with psutil to the last bit, without importing it."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from watchdog.core import procid

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc formula")


def test_current_create_time_equals_psutil_for_self():
    assert procid.current_create_time() == psutil.Process(os.getpid()).create_time()


def test_child_reports_the_create_time_psutil_sees():
    code = (
        "import sys; from watchdog.core import procid\n"
        "print(repr(procid.current_create_time()), flush=True)\n"
        "print('psutil' in sys.modules, flush=True)\n"
        "sys.stdin.read()\n"  # stay alive until the parent has looked
    )
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        reported = float(child.stdout.readline())
        imported_psutil = child.stdout.readline().strip()
        assert reported == psutil.Process(child.pid).create_time()
        assert procid.create_time(child.pid) == reported
        assert imported_psutil == "False"  # the light SDK must not pull psutil in
    finally:
        child.stdin.close()
        child.wait(timeout=10)


def test_awkward_process_name_is_parsed_like_psutil(tmp_path):
    # comm may contain spaces and parentheses; parsing splits after the last ')'.
    odd = tmp_path / "a) b (c"
    shutil.copy("/bin/sleep", odd)
    child = subprocess.Popen([str(odd), "600"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).name() != odd.name and time.monotonic() < deadline:
            time.sleep(0.02)  # until exec has renamed it
        assert psutil.Process(child.pid).name() == odd.name
        assert procid.create_time(child.pid) == psutil.Process(child.pid).create_time()
    finally:
        child.kill()
        child.wait(timeout=10)


def test_gone_pid_gives_none():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=10)
    assert procid.create_time(child.pid) is None or psutil.pid_exists(child.pid)


def test_hostname():
    assert procid.hostname() == socket.gethostname()
