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

REPO = Path(__file__).resolve().parents[2]
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


GONE = """
import subprocess, sys
from watchdog.core import procid
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
alive = procid.create_time(child.pid)
child.kill(); child.wait()
print(alive is not None, procid.create_time(child.pid))
"""


def test_gone_pid_gives_none():
    # In a pid namespace of its own nothing else forks, so the reaped child's pid cannot be taken
    # by another process before the check: the answer is deterministic, None and only None.
    res = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", GONE], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "None"]


@pytest.mark.parametrize("pid", [-1, 0, "nosuchpid", "1/../self", 2**22 + 1])
def test_a_pid_that_cannot_exist_gives_none(pid):
    # 2**22 + 1 is above the largest pid_max Linux allows (4194304).
    assert procid.create_time(pid) is None


HOST = """
from watchdog import Watchdog
from watchdog.core import procid
wd = Watchdog(sys_argv_db)
with wd.run(agent="where") as run:
    run.step(cost_eur=0.0)
print(procid.hostname(), run.id)
"""


def test_hostname_is_the_uts_name_the_run_is_registered_under(sqlite_url):
    # A host of its own (UTS namespace): the name the kernel gives this process, not a cached
    # or resolved one, and the name the SDK writes in the run's row for the daemon to match.
    code = HOST.replace("sys_argv_db", repr(sqlite_url))
    res = subprocess.run(["unshare", "--uts", "sh", "-c", f'hostname agent-host-7 && exec "$0" -c "$1"',
                          sys.executable, code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    name, run_id = res.stdout.split()
    assert name == "agent-host-7" != socket.gethostname()
    import sqlite3

    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        assert conn.execute("SELECT host FROM runs WHERE id = ?", (run_id,)).fetchone() == ("agent-host-7",)
