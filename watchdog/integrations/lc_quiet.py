"""LangChain logs every exception a callback raises ("Error in WatchdogCallbackHandler.
on_tool_start callback: ToolUnavailable(...)") before re-raising it for a handler with
`raise_error = True`. Our refusals are raised on purpose (the tool is not run, the model is
told why): that line looks like a crash. This filter drops exactly those records — our
handler, a refusal of ours — and lets every other warning through."""

from __future__ import annotations

import logging

MANAGER_LOGGER = "langchain_core.callbacks.manager"
OURS = ("WatchdogCallbackHandler",)
REFUSALS = ("ToolUnavailable(", "RunKilled(")


class RefusalNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if (record.msg == "Error in %s.%s callback: %s" and len(args) == 3 and args[0] in OURS
                and isinstance(args[2], str) and args[2].startswith(REFUSALS)):
            return False
        return True


def install() -> None:
    logger = logging.getLogger(MANAGER_LOGGER)
    if not any(isinstance(f, RefusalNoise) for f in logger.filters):
        logger.addFilter(RefusalNoise())
