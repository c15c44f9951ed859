"""A scripted chat model: the demo's stand-in for an LLM.

Stateless on purpose: the answer is a function of the turn index (the number
of assistant messages in the transcript) and of what the tools returned, never
of a variable kept between calls. So the same transcript always gets the same
answer, a killed agent could resume against it, and a script can read its own
tool results before deciding (the `recover` script does).

Tokens are counted on the whole prompt (transcript + tool schema), as a real
provider bills them: each turn re-sends everything before it, which is why a
run that never answers costs more and more per turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

MODEL = "scripted-1"  # the [prices."scripted-1"] entry of the demo config prices it

IBAN = "IT60 X054 2811 1010 0000 0123 456"
_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORD = re.compile(r"[A-Za-z][A-Za-z-]{4,}")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    args: dict


@dataclass(frozen=True)
class Reply:
    content: str | None  # the final answer; None while the model asks for tools
    tool_calls: tuple[ToolCall, ...]
    tokens_in: int
    tokens_out: int

    def message(self) -> dict:
        return {"role": "assistant", "content": self.content,
                "tool_calls": [{"id": c.id, "name": c.name, "args": c.args} for c in self.tool_calls]}


def count_tokens(text: str) -> int:
    """Words and punctuation marks: close enough to a BPE count, and the same on every machine."""
    return len(_TOKEN.findall(text))


# -- scripts: (turn, tool results so far) -> answer text, or a list of (tool, args) -----------

def _plan(t: int, results: list[str]):
    if t == 0:
        return [("list_files", {})]
    if t == 1:
        return [("read_file", {"path": "errors.log"})]
    line = next((ln for ln in results[-1].splitlines() if "timed out" in ln), "nothing about a timeout")
    return f"errors.log mentions the timeout: {line[20:]}"


def _recover(t: int, results: list[str]):
    if t == 0:
        return [("read_file", {"path": "timeout.log"})]  # a wrong guess
    if not any("Call list_files" in r for r in results):
        return "I could not read the file, so I do not know."  # what it says when the error is useless
    if t == 1:
        return [("list_files", {})]
    if t == 2:
        return [("read_file", {"path": "errors.log"})]
    return "errors.log (not timeout.log) has it: worker 7 timed out after 30000 ms on payments-api."


def _runaway(t: int, results: list[str]):
    # Never answers: always one more lead to follow. First every file, then every
    # new word it has read, each searched once (so no call ever repeats).
    if t == 0:
        return [("list_files", {})]
    if t <= 3:
        return [("read_file", {"path": ("access.log", "errors.log", "notes.txt")[t - 1]})]
    words = list(dict.fromkeys(w.lower() for r in results for w in _WORD.findall(r)))
    return [("search", {"query": words[(t - 4) % len(words)] + ("" if t - 4 < len(words) else f" {t}")})]


def _broken_tool(t: int, results: list[str]):
    # The upstream says 500: maybe it is the format? Try two others, then insist on the
    # original forever, even once the watchdog says the tool is unavailable.
    variants = (IBAN, IBAN.replace(" ", ""), IBAN.replace(" ", "").lower())
    return [("verify_iban", {"iban": variants[t] if t < len(variants) else IBAN})]


def _hung(t: int, results: list[str]):
    if t == 0:
        return [("list_files", {})]
    if t == 1:
        return [("scan_archive", {"path": "archive"})]  # never returns
    return "The archive is indexed."


def _stubborn(t: int, results: list[str]):
    # "Check every refund": three refund ids per turn, counting up forever. Never the
    # same call twice (no loop to detect) and short results (cheap): what runs out
    # is its tool-call budget.
    return [("search", {"query": f"R-{1001 + 3 * t + i}"}) for i in (0, 1, 2)]


SCRIPTS = {"plan": _plan, "recover": _recover, "runaway": _runaway, "broken-tool": _broken_tool,
           "hung": _hung, "stubborn": _stubborn}


class ScriptedModel:
    def __init__(self, script: str):
        if script not in SCRIPTS:
            raise ValueError(f"script: expected one of {', '.join(SCRIPTS)}, got {script!r}")
        self.script = SCRIPTS[script]

    def prompt_tokens(self, messages: list[dict], tools: list[dict]) -> int:
        return count_tokens(json.dumps(messages) + json.dumps(tools))

    def complete(self, messages: list[dict], tools: list[dict]) -> Reply:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        results = [m["content"] for m in messages if m["role"] == "tool"]
        out = self.script(turn, results)
        if isinstance(out, str):
            return Reply(out, (), self.prompt_tokens(messages, tools), count_tokens(out))
        calls = tuple(ToolCall(f"call_{turn}_{i}", name, args) for i, (name, args) in enumerate(out))
        return Reply(None, calls, self.prompt_tokens(messages, tools), count_tokens(json.dumps(out)))
