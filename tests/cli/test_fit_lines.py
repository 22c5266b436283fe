"""``cli.fit_lines`` writes what rich's tables print: the same bytes, styles included, for every view and for
tables of awkward cells, against the same tables drawn by rich alone (``FitTable._direct`` answering None)."""

from __future__ import annotations

import functools
import io
import random
import re
from collections.abc import Callable, Iterator

import pytest
from rich.console import Console, RenderableType
from rich.text import Text

from skyserve_lite.cli import fit
from skyserve_lite.cli.fit import Cell, Column, FitTable, Narrow
from tests.cli import render_samples as s

VIEWS = s.RENDERED_VIEWS
# A terminal (escape codes), a pipe (no style: runs of rows are one segment) and a recorded console.
CONSOLES = {"terminal": {"color_system": "truecolor", "force_terminal": True},
            "pipe": {"color_system": None}, "recorded": {"color_system": None, "record": True}}


def printed(renderable: RenderableType, width: int, console: str) -> str:
    out = io.StringIO()
    Console(width=width, file=out, **CONSOLES[console]).print(renderable)  # type: ignore[arg-type]
    return out.getvalue()


@pytest.fixture
def rich_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[[], RenderableType], int, str], str]]:
    """Print with every row drawn by rich's tables, as ``FitTable`` did before ``cli.fit_lines``."""
    def print_rich_only(make: Callable[[], RenderableType], width: int, console: str) -> str:
        with monkeypatch.context() as patch:
            patch.setattr(FitTable, "_direct", lambda *_: None)
            return printed(make(), width, console)
    yield print_rich_only


@pytest.mark.parametrize("console", sorted(CONSOLES))
@pytest.mark.parametrize("width", [30, 60, 80, 120, 200])
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_every_view_prints_as_rich_prints_it(rich_only: Callable[[Callable[[], RenderableType], int, str], str],
                                             view: str, width: int, console: str) -> None:
    assert printed(VIEWS[view](), width, console) == rich_only(VIEWS[view], width, console)


WORDS = ("a", "bb", "[x]", "[bold]no markup[/]", "日本語", "é", "  sp  ", "tab\tx", "two\nlines", "", "-",
         "longwordlongwordlongword", "bell\a", "cr\rx")


def awkward_table(seed: int) -> FitTable:
    """Cells of every kind ``cli.fit_lines`` must write or leave to rich: plain, styled, with spans, on
    several lines, wide characters, tabs, control codes, empty, too wide for a narrow console."""
    rng = random.Random(seed)
    table = FitTable([Column("NAME"), Column("STATUS"), Column("X", Narrow.DROP, priority=1),
                      Column("WHY", Narrow.UNDER, priority=0, label=""), Column("F", Narrow.UNDER, priority=2,
                                                                                 fold_to=10)])
    for _ in range(rng.randint(0, 8)):
        cells: list[Cell] = []
        for _ in table.columns:
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 4)))
            kind = rng.random()
            if kind < 0.3:
                cells.append(Text(words, style=rng.choice(["green", "bold red", "", "dim"])))
            elif kind < 0.45:
                cells.append(Text.assemble(words, (rng.choice(WORDS), "red"), style=rng.choice(["", "underline"])))
            else:
                cells.append(words)
        table.add_row(*cells)
    return table


@pytest.mark.parametrize("console", ["terminal", "pipe"])
@pytest.mark.parametrize("width", [20, 50, 90, 200])
def test_awkward_cells_print_as_rich_prints_them(rich_only: Callable[[Callable[[], RenderableType], int, str], str],
                                                 width: int, console: str) -> None:
    for seed in range(60):
        expected = rich_only(functools.partial(awkward_table, seed), width, console)
        assert printed(awkward_table(seed), width, console) == expected, f"seed {seed}"


def test_rows_that_fit_are_written_without_a_rich_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of ``cli.fit_lines``: 10,000 one-line rows cost no rich table (one took a millisecond a row)."""
    def no_table(*_: object) -> None:
        raise AssertionError("a row was drawn by a rich table")

    monkeypatch.setattr(FitTable, "_chunk", no_table)
    monkeypatch.setattr(fit, "_note", no_table)
    table = FitTable([Column("NAME"), Column("STATUS"), Column("WHY", Narrow.UNDER, label="")])
    reason = "readiness probe failed 3 times in a row: HTTP 503 from /health after 5s"  # 72: under its row
    for number in range(1000):
        table.add_row(f"svc-{number}", Text("READY", style="green"), reason)
    lines = printed(table, 80, "terminal").splitlines()
    assert len(lines) == 1 + 2 * 1000  # the header, each row and its note
    assert lines[1] == "svc-0    \x1b[32mREADY\x1b[0m" and lines[2].endswith(f"{reason}\x1b[0m")


_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def ends_in_space(text: str) -> list[str]:
    """The lines of ``text`` (escape codes removed) that end in a space."""
    return [line for line in _ESCAPE.sub("", text).split("\n") if line.endswith(" ")]


@pytest.mark.parametrize("console", sorted(CONSOLES))
@pytest.mark.parametrize("width", [30, 60, 80, 120, 200])
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_no_line_of_any_view_ends_in_spaces(view: str, width: int, console: str) -> None:
    """Rich pads a table's last column too: piped to a file, every row used to end in up to 90 spaces."""
    assert ends_in_space(printed(VIEWS[view](), width, console)) == []


@pytest.mark.parametrize("console", ["terminal", "pipe"])
@pytest.mark.parametrize("width", [20, 50, 90, 200])
def test_no_line_of_an_awkward_table_ends_in_spaces(width: int, console: str) -> None:
    """Cells rich draws (folded, tabs, several lines) and notes under rows included."""
    for seed in range(60):
        assert ends_in_space(printed(awkward_table(seed), width, console)) == [], f"seed {seed}"
