"""`resume --add-...` is made from the budget registry: every budget that can pause has its
option, of its kind, in the registry's order, and a new one appears without editing the CLI."""

from __future__ import annotations

import dataclasses

import click
from click.testing import CliRunner

from watchdog.cli import main
from watchdog.cli.pause_cmds import add_option_help, add_options, resume_cmd
from watchdog.core.budgets import BUDGETS, PAUSABLE
from watchdog.core.lifecycle import StopReason


def _add_params(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and p.opts[0].startswith("--add-")]


def test_the_options_are_the_registrys_pausable_budgets_in_order():
    params = _add_params(resume_cmd)
    assert [p.opts[0] for p in params] == [f"--{b.add_option}" for b in PAUSABLE]
    assert [p.opts[0] for p in params] == ["--add-steps", "--add-tool-calls", "--add-eur", "--add-s"]
    for p, b in zip(params, PAUSABLE):
        assert isinstance(p.type, click.IntRange if b.integer else click.FloatRange), b.key
        assert p.help == add_option_help(b) and b.key in p.help


def test_help_lists_every_option_as_before():
    res = CliRunner().invoke(main, ["resume", "--help"])
    assert res.exit_code == 0, res.output
    for b in PAUSABLE:
        assert f"--{b.add_option}" in res.output
    assert "--add-steps INTEGER RANGE       Raise the run's max_steps by N.  [x>=1]" in res.output
    assert "--add-eur FLOAT RANGE           Raise the run's max_cost_eur by X.  [x>0]" in res.output
    assert "Raise the run's max_wall_s by N seconds." in res.output


def test_a_new_pausable_budget_gets_its_option_without_a_cli_edit():
    new = dataclasses.replace(BUDGETS[0], key="max_retries", label="retries", add_option="add-retries",
                              reason=StopReason.MAX_STEPS)

    @click.command()
    @add_options((*PAUSABLE, new))
    def cmd(**adds):
        click.echo(repr(sorted((k, v) for k, v in adds.items() if v is not None)))

    assert [p.opts[0] for p in _add_params(cmd)][-1] == "--add-retries"
    res = CliRunner().invoke(cmd, ["--add-retries", "2", "--add-eur", "0.5"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == "[('add_eur', 0.5), ('add_retries', 2)]"
    bad = CliRunner().invoke(cmd, ["--add-retries", "0"])
    assert bad.exit_code != 0 and "x>=1" in bad.output
