"""A real LiteLLM proxy (`litellm --config`) with our callback, for the gateway tests: a
mock_response model, a master key, loopback, no network; and a plain OpenAI client for it.

One proxy per test file (each start is ~10 s): `proxy(folder, db_url, watchdog_toml)`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import openai

MASTER_KEY = "sk-watchdog-test-0123456789abcdef"
STARTUP_S = 180.0
LITELLM = str(Path(sys.executable).with_name("litellm"))

CONFIG_YAML = """
model_list:
  - model_name: gpt-4o
    litellm_params:
      model: openai/gpt-4o
      api_key: sk-not-used
      mock_response: "Hello from the mock"
litellm_settings:
  callbacks: ["watchdog.integrations.litellm.proxy_handler"]
general_settings:
  master_key: {key}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def proxy(folder: Path, db_url: str, watchdog_toml: str) -> Iterator[str]:
    """The proxy's base URL while it serves, its callback on the store at db_url (the proxy's
    log: folder/litellm.log)."""
    (folder / "litellm.yaml").write_text(CONFIG_YAML.format(key=MASTER_KEY))
    (folder / "watchdog.toml").write_text(watchdog_toml)
    port = free_port()
    env = {**os.environ, "AGENT_WATCHDOG_DB": db_url, "AGENT_WATCHDOG_CONFIG": str(folder / "watchdog.toml"),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(Path(__file__).parents[1])}
    log = open(folder / "litellm.log", "wb")
    proc = subprocess.Popen([LITELLM, "--config", str(folder / "litellm.yaml"), "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    end = time.monotonic() + STARTUP_S
    try:
        while True:
            assert proc.poll() is None, (folder / "litellm.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/health/liveliness", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < end, "the LiteLLM proxy did not start"
            time.sleep(0.3)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=MASTER_KEY, max_retries=0, timeout=30)


def call(base: str, trace: str | None):
    headers = {"x-litellm-trace-id": trace} if trace else {}
    return client(base).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                                extra_headers=headers)
