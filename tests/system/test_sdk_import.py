"""Importing the SDK, in a fresh interpreter, loads none of the daemon's dependencies (the SDK
on a store: tests/store/test_sdk.py)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_sdk_does_not_import_the_daemons_dependencies():
    code = (
        "import sys, watchdog.client\n"
        "from watchdog import Watchdog, RunKilled\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('psutil', 'apprise', 'apscheduler'))\n"
        "print(','.join(heavy))\n"
        "assert 'watchdog.client' in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
