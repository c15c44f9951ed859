"""The `agent-watchdog` console script: `hook claude-code|codex|gemini` without click.

A coding CLI starts `agent-watchdog hook …` for every tool call; loading click and every command
module would cost more than the hook's whole budget. So the one hot command goes to its tiny
client (watchdog.gateways.hooks.fastpath, stdlib only); everything else, `hook … --help` and
`hook install` included, to the click group of watchdog.cli.
"""

from __future__ import annotations

import sys

_HOOK_CLIS = ("claude-code", "codex", "gemini")


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) >= 2 and argv[0] == "hook" and argv[1] in _HOOK_CLIS and not {"-h", "--help"} & set(argv):
        from watchdog.gateways.hooks.fastpath import run

        sys.exit(run(argv[1:]))
    from watchdog.cli import main as cli

    cli(prog_name="agent-watchdog")
