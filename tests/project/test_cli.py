"""The ``exactattn`` dispatcher: one table, every command module in it, clear usage errors."""

from __future__ import annotations

import importlib.metadata
import pkgutil
from pathlib import Path

import pytest

import exactattn
import exactattn.commands
from exactattn import cli

ROOT = Path(exactattn.__file__).resolve().parents[1]


def _listed(capsys) -> set[str]:
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    commands = text.split("commands:\n", 1)[1]
    return {line.split()[0] for line in commands.splitlines() if line.strip()}


def test_help_lists_every_module_of_the_commands_package(capsys):
    modules = {m.name.replace("_", "-") for m in pkgutil.iter_modules(exactattn.commands.__path__)}
    listed = _listed(capsys)
    assert modules <= listed, f"not in exactattn.cli.COMMANDS: {sorted(modules - listed)}"
    assert {"prove", "sweep"} <= listed


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_each_command_reaches_its_own_parser(name, capsys):
    """``exactattn NAME --help`` is answered by NAME's argparse parser (prog names it)."""
    with pytest.raises(SystemExit) as exit_:
        status = cli.main([name, "--help"])
        raise SystemExit(status)  # a command that returns instead of exiting
    assert exit_.value.code in (0, None)
    assert f"usage: exactattn {name}" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error_naming_it(capsys):
    assert cli.main(["no-such-command"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'no-such-command'" in err
    assert all(name in err for name in cli.COMMANDS)


def test_no_command_prints_the_usage_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage: exactattn COMMAND" in capsys.readouterr().err


def test_commands_live_in_one_place():
    """No feature package keeps a command line of its own."""
    paths = [*ROOT.glob("exactattn/**/cli.py"), *ROOT.glob("proofs/**/cli.py")]
    found = {p.relative_to(ROOT).as_posix() for p in paths}
    assert found == {"exactattn/cli.py"}


def test_console_script_is_the_dispatcher():
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert [e.value for e in scripts if e.name == "exactattn"] == ["exactattn.cli:main"]
