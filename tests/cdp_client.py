"""A small DevTools-protocol client over Chromium's --remote-debugging-pipe (no extra packages).

Debian's `chromium`, headless (as root with --no-sandbox). The pipe is fds 3 (commands in) and
4 (answers and events out), messages JSON terminated by NUL. It records every JavaScript
dialog (and dismisses it: a page that calls alert() would otherwise hang) and every console
message, so a test can prove that no hostile script ran.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
import zlib
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"


class Chromium:
    def __init__(self, profile: Path, *, width: int = 1280, height: int = 900):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def fds() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes to us
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [CHROMIUM, "--headless=new", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--remote-debugging-pipe", f"--user-data-dir={profile}", f"--window-size={width},{height}",
                "--hide-scrollbars", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")
        self.proc = subprocess.Popen(args, preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        self.dialogs: list[str] = []
        self.console: list[str] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.call(domain, session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def _send(self, msg: dict) -> None:
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._to_chrome, data):]

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed its pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def _event(self, msg: dict) -> None:
        self.events.append(msg)
        method = msg.get("method")
        if method == "Page.javascriptDialogOpening":
            self.dialogs.append(msg["params"].get("message", ""))
            self._id += 1
            self._send({"id": self._id, "method": "Page.handleJavaScriptDialog", "params": {"accept": False},
                        "sessionId": self.session})
        elif method == "Runtime.consoleAPICalled":
            self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in msg["params"]["args"]))
        elif method == "Log.entryAdded":
            self.console.append(msg["params"]["entry"].get("text", ""))

    def call(self, method: str, *, session: bool = False, timeout_s: float = 60.0, **params) -> dict:
        self._id += 1
        my_id = self._id
        msg = {"id": my_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self._send(msg)
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self._read(deadline)
            if answer.get("id") == my_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            if "method" in answer:
                self._event(answer)

    def wait_event(self, method: str, timeout_s: float = 60.0, since: int = 0) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            for e in self.events[since:]:
                if e.get("method") == method:
                    return e
            msg = self._read(deadline)
            if "method" in msg:
                self._event(msg)

    def open(self, url: str, timeout_s: float = 60.0) -> None:
        mark = len(self.events)
        self.call("Page.navigate", session=True, url=url)
        self.wait_event("Page.loadEventFired", timeout_s, since=mark)

    def js(self, expression: str):
        res = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", session=True, format="png",
                                          captureBeyondViewport=True)["data"])

    def settle(self, seconds: float) -> None:
        """Let the page run (its refresh script) while still seeing its events."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                msg = self._read(deadline)
                if "method" in msg:
                    self._event(msg)
        except TimeoutError:
            pass

    def close(self) -> None:
        try:
            self._id += 1
            self._send({"id": self._id, "method": "Browser.close"})
            self.proc.wait(timeout=20)
        except Exception:  # noqa: BLE001 — teardown: make sure it is gone
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


def png_colours(png: bytes) -> int:
    """How many distinct byte values the PNG's pixel data holds: a blank page has a handful."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, data = 8, b""
    while pos < len(png):
        length = int.from_bytes(png[pos:pos + 4], "big")
        kind = png[pos + 4:pos + 8]
        if kind == b"IDAT":
            data += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(data)))
