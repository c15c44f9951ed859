"""`python -m watchdog.cli`."""

from watchdog.cli import main

main(prog_name="agent-watchdog")
