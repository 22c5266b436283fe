"""docs/cli.md opens with a synopsis of every command: each command that `--help` lists has a line there, and
the options on its lines are exactly the command's own (every one of them, none it lacks).

A command with several forms has several lines (`serve down`, `controller up`); a long line goes on in
lines that start with spaces.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from skyserve_lite.cli.main import main

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
_OPTION = re.compile(r"(?<![\w-])--?[a-zA-Z][\w-]*")


def synopsis() -> list[str]:
    """The first ``text`` block of docs/cli.md, a line per form (continuation lines joined)."""
    text = CLI_MD.read_text()
    start = text.index("```text\n") + len("```text\n")
    forms: list[str] = []
    for line in text[start:text.index("```", start)].splitlines():
        if line.startswith(" ") and forms:
            forms[-1] += " " + line.strip()
        elif line.strip():
            forms.append(line.strip())
    return forms


def commands(group: click.Group = main, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command `--help` shows (hidden ones are internal: `controller rpc`), groups included."""
    yield path, group
    for name, command in sorted(group.commands.items()):
        if command.hidden:
            continue
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def forms_of(path: tuple[str, ...]) -> list[str]:
    """The synopsis lines of the command at ``path``: ``sky-lite serve up ...``, not ``... serve update``."""
    prefix = " ".join(("sky-lite", *path))
    return [form for form in synopsis() if form == prefix or (form.startswith(prefix + " ") and (
        path or form[len(prefix) + 1] in "[-"))]


COMMANDS = [(path, command) for path, command in commands() if path == () or not isinstance(command, click.Group)]


def test_the_synopsis_has_no_line_for_a_command_that_does_not_exist() -> None:
    assert [form for form in synopsis() if not any(form in forms_of(path) for path, _ in COMMANDS)] == []


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(path) or "sky-lite" for path, _ in COMMANDS])
def test_every_command_and_option_is_in_the_synopsis(path: tuple[str, ...], command: click.Command) -> None:
    """An option is shown by any of its names (`-o` or `--output`); a flag pair by one of each side
    (`--wait | --no-wait`)."""
    forms = forms_of(path)
    assert forms, f"docs/cli.md's synopsis has no line for `sky-lite {' '.join(path)}`"
    shown = {name for form in forms for name in _OPTION.findall(form)} - {"-h", "--help"}
    options = [param for param in command.params if isinstance(param, click.Option)]
    missing = [param.opts[-1] for param in options
               if not shown & {*param.opts} or (param.secondary_opts and not shown & {*param.secondary_opts})]
    assert missing == [], "options missing from the synopsis"
    known = {name for param in options for name in (*param.opts, *param.secondary_opts)}
    assert sorted(shown - known) == [], "options in the synopsis the command does not have"
