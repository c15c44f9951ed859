"""Exceptions shared by the SDK, the daemon and the CLI (no heavy imports here)."""


class RunKilled(BaseException):
    """The watchdog (or an in-process guard) stopped this run.

    A BaseException, like asyncio.CancelledError, so that an agent's
    `except Exception:` cannot swallow a stop.
    """

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class ToolUnavailable(Exception):
    """A tool's circuit is open: the call failed fast without running the tool.

    An ordinary Exception on purpose: the agent (and the model) should read it
    and choose another path, not die of it.
    """

    def __init__(self, tool: str, message: str):
        self.tool = tool
        super().__init__(message)


class ToolTimeout(TimeoutError):
    """A tool called with `run.tool_call(..., timeout_s=N)` did not answer within N seconds.

    An ordinary exception (a TimeoutError): recorded as the tool's error, retried like one.
    """

    def __init__(self, tool: str, timeout_s: float):
        self.tool = tool
        self.timeout_s = timeout_s
        super().__init__(f"{tool}: no answer within {timeout_s:g} s (timeout_s)")


class ConfigError(Exception):
    """Bad configuration: the message is one line naming file, key and what was expected."""


class StoreError(Exception):
    """A store-level problem with a clear one-line message (bad URL, unknown run id...)."""


class StoreMisconfigured(StoreError):
    """The store answers but this process cannot use it: read-only for it, never migrated, or it
    refuses the credentials. A configuration error (raised at a run's first contact, with the URL
    and the fix in one line), never an outage to buffer through."""
