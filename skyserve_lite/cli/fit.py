"""A table that fits the console it is printed on: columns give way by priority instead of being cut.

Rich squeezes a table that is too wide by wrapping and cutting its cells, so in 80 columns `serve status` used
to show `http://…` and `autoscal…` and a reason one word per line. ``FitTable`` decides its columns when it is
rendered, from the width it is given (a terminal's, the 200 of a pipe, a live view's), with the pure
``plan_layout``:

1. Every column at its natural width (its widest cell or header, on one line) when that fits.
2. Otherwise the column with the lowest ``priority`` gives way: a ``DROP`` column is left out, an ``UNDER``
   column moves to an indented line under its row (``  └ label: value``, or the bare text for a reason).
   ``KEEP`` columns (names, ids, URLs, statuses) never give way.
3. Before a column gives way, free-text columns (``fold_to``) may wrap, down to that many cells, so that a
   message folds into a readable block instead of one word per line.
4. When even the ``KEEP`` columns do not fit (a 40-column terminal), cells fold onto more lines; nothing is
   ever cut or replaced by an ellipsis.

Worked numbers, the replicas of `serve status` in 80 columns: SERVICE 24 + ID 2 + VERSION 7 + STATUS 16 +
CLOUD/REGION 12 + INSTANCE 19 + URL 22 + AGE 3 = 105, plus 7 gaps of 2 = 119; the reasons (priority 0) go
under their rows first, then INSTANCE (119 - 21 = 98), VERSION when every replica runs its service's version
(89), CLOUD/REGION (75 <= 80): SERVICE, ID, STATUS, URL and AGE stay, in full.

Drawing: each run of rows is a rich table with those widths, unless no cell of a row folds: then the row is
written directly (``cli.fit_lines``: the same segments, about a hundredth of the cost, which at 10,000
replicas is the difference between 10 s and a tenth of one). No line ends in spaces, whichever draws it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.measure import Measurement
from rich.segment import Segment
from rich.text import Text

from skyserve_lite.cli.fit_lines import GAP, NOTE_PREFIX, Cell, Cells, Lines, trim_line

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
    from rich.table import Table

__all__ = ["GAP", "NOTE_PREFIX", "Cell", "Column", "FitTable", "Layout", "Narrow", "plan_layout"]


class Narrow(str, Enum):
    """What a column does when the table does not fit."""

    KEEP = "keep"  # always shown, never cut: names, ids, URLs, statuses
    DROP = "drop"  # left out (the JSON output still has it)
    UNDER = "under"  # moved to a line under its row


@dataclass(frozen=True)
class Column:
    header: str
    narrow: Narrow = Narrow.KEEP
    priority: int = 0  # among DROP and UNDER columns the lowest gives way first; ties: the rightmost
    fold_to: int | None = None  # free text: may wrap down to this width; None: one line or give way
    # Under the row: ``label: value``; None labels it with the header in lower case, "" shows the bare text
    # on a line of its own (a reason reads as a sentence, not as a field).
    label: str | None = None

    @property
    def note_label(self) -> str:
        return self.header.lower() if self.label is None else self.label


@dataclass(frozen=True)
class Layout:
    """Where each column goes: ``widths[i]`` is its width in the table, or None when it is not in it;
    ``under`` lists the columns shown under their row, in column order."""

    widths: tuple[int | None, ...]
    under: tuple[int, ...] = ()

    @property
    def inline(self) -> tuple[int, ...]:
        return tuple(i for i, width in enumerate(self.widths) if width is not None)


def _total(widths: Iterable[int]) -> int:
    values = list(widths)
    return sum(values) + GAP * max(0, len(values) - 1)


def _shrink_widest(widths: dict[int, int], floors: dict[int, int], excess: int) -> None:
    """Take ``excess`` cells off the widest of ``widths`` first, none below its floor: two free-text
    columns of 60 and 20 that must lose 30 become 30 and 20, not 42 and 8."""
    while excess > 0:
        candidates = [i for i in widths if widths[i] > floors[i]]
        if not candidates:
            return
        widest = max(candidates, key=lambda i: (widths[i], i))
        widths[widest] -= 1
        excess -= 1


def plan_layout(columns: Sequence[Column], natural: Sequence[int], max_width: int) -> Layout:
    """The layout of a table whose columns are ``natural`` cells wide (widest cell or header) in
    ``max_width`` cells. Pure; see the module docstring for the order in which columns give way."""
    minimum = [natural[i] if c.fold_to is None else min(natural[i], max(c.fold_to, cell_len(c.header)))
               for i, c in enumerate(columns)]
    inline = list(range(len(columns)))
    giving_way = sorted((i for i, c in enumerate(columns) if c.narrow is not Narrow.KEEP),
                        key=lambda i: (columns[i].priority, -i))
    while True:
        if _total(natural[i] for i in inline) <= max_width:
            widths = {i: natural[i] for i in inline}
            break
        if _total(minimum[i] for i in inline) <= max_width or not giving_way:
            widths = {i: natural[i] for i in inline}
            _shrink_widest(widths, {i: minimum[i] for i in inline}, _total(widths.values()) - max_width)
            # Still too wide: only KEEP columns are left and they fold (never cut) onto more lines.
            _shrink_widest(widths, {i: 1 for i in inline}, _total(widths.values()) - max_width)
            break
        inline.remove(giving_way.pop(0))
    under = tuple(i for i, c in enumerate(columns) if c.narrow is Narrow.UNDER and i not in widths)
    return Layout(tuple(widths.get(i) for i in range(len(columns))), under)


def _text(cell: Cell) -> Text:
    return Text(cell) if isinstance(cell, str) else cell


class FitTable:
    """Rows under a header row; the columns are chosen when it is rendered (``plan_layout``), so the same
    value prints right in an 80-column terminal, a 200-column pipe and a live view."""

    def __init__(self, columns: Sequence[Column], *, note_style: str = "dim") -> None:
        self.columns = tuple(columns)
        self.rows: list[tuple[Cell, ...]] = []
        self.note_style = note_style
        self._cells: Cells | None = None  # the rows read by column, once (``cli.fit_lines``)

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of {len(self.columns)} columns got {len(cells)} cells")
        self.rows.append(cells)
        self._cells = None

    def cells(self) -> Cells:
        if self._cells is None:
            self._cells = Cells.of(self.rows, len(self.columns))
        return self._cells

    def natural_widths(self) -> list[int]:
        cells = self.cells()
        return [max(cell_len(column.header), max(widths, default=0))
                for column, widths in zip(self.columns, cells.widths, strict=True)]

    def layout(self, max_width: int) -> Layout:
        """``plan_layout`` over the columns that have something to show: a DROP or UNDER column whose every
        cell is empty (no replica has a reason) is left out, not printed as a blank column."""
        natural = self.natural_widths()
        cells = self.cells()
        shown = [i for i, column in enumerate(self.columns) if column.narrow is Narrow.KEEP or not cells.is_empty(i)]
        inner = plan_layout([self.columns[i] for i in shown], [natural[i] for i in shown], max_width)
        widths: list[int | None] = [None] * len(self.columns)
        for position, i in enumerate(shown):
            widths[i] = inner.widths[position]
        return Layout(tuple(widths), tuple(shown[position] for position in inner.under))

    def notes(self, row: Sequence[Cell], layout: Layout) -> list[Text]:
        """The lines under ``row``: one of ``label: value`` pairs for the labelled columns, then each line
        of an unlabelled one (a reason) on its own."""
        fields: list[Text] = []
        bare: list[Text] = []
        for i in layout.under:
            cell = _text(row[i])
            if cell.plain.strip() in ("", "-"):
                continue
            label = self.columns[i].note_label
            if label:
                fields.append(Text(f"{label}: ") + Text(" ").join(cell.split("\n")))
            else:
                bare.extend(cell.split("\n"))
        return ([Text("; ").join(fields)] if fields else []) + bare

    def _chunk(self, layout: Layout, header: bool) -> Table:
        from rich.table import Table

        table = Table(box=None, padding=(0, 1), pad_edge=False, show_header=header, header_style="bold")
        for i in layout.inline:
            # Never no_wrap: rich cuts a no_wrap cell that is too wide. The widths make every KEEP cell fit
            # on one line; only when even those do not fit does a cell fold onto a second line.
            table.add_column(self.columns[i].header, width=layout.widths[i], overflow="fold")
        return table

    def _direct(self, console: Console, layout: Layout, max_width: int) -> Lines | None:
        """What writes the lines that need no folding, or None to leave every line to rich (a table wider
        than the console, which rich squeezes)."""
        widths = [width for width in layout.widths if width is not None]
        if not widths or _total(widths) > max_width:
            return None
        return Lines(console, self.cells(), layout.inline, widths)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from _joined(self._draw(console, options.max_width))

    def _draw(self, console: Console, max_width: int) -> Iterator[str | Segment | Trimmed]:
        """The table's lines: rich tables, segments, and a str for each line without a style."""
        layout = self.layout(max_width)
        cells = self.cells()
        inline = layout.inline
        # Rows go in runs, one rich table each with the same fixed widths (so the columns line up); a row
        # with notes ends its run, and the notes print under it at the full width. A row none of whose cells
        # folds is written directly (``cli.fit_lines``) and ends the run before it.
        direct = self._direct(console, layout, max_width)
        header = None if direct is None else direct.header([self.columns[i].header for i in inline])
        if header is not None:
            yield from header
        table: Table | None = None if header is not None else self._chunk(layout, header=True)
        drawn = direct.rows() if direct is not None else [None] * len(cells.rows)
        for row, lines in zip(cells.rows, drawn, strict=True):
            if lines is None:
                if table is None:
                    table = self._chunk(layout, header=False)
                table.add_row(*(_text(row[i]) for i in inline))
            else:
                if table is not None:
                    yield Trimmed(table)
                    table = None
                if isinstance(lines, str):
                    yield lines
                else:
                    yield from lines
            notes = self.notes(row, layout) if layout.under else []
            if notes and table is not None:
                yield Trimmed(table)
                table = None
            for note in notes:
                line = None if direct is None else direct.note(note, self.note_style, max_width)
                if line is None:
                    yield Trimmed(_note(note, self.note_style))
                else:
                    yield from line
        if table is not None:
            yield Trimmed(table)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        natural = self.natural_widths()
        keep = [natural[i] for i, c in enumerate(self.columns) if c.narrow is Narrow.KEEP]
        return Measurement(min(_total(keep), options.max_width), min(_total(natural), options.max_width))


# Lines per segment of a run of lines without a style: rich splits a segment into its lines again, each split
# copying the rest of it, so a segment of 10,000 lines is slower than 10,000 segments; 50 is ~2x faster.
_PLAIN_RUN = 50


class Trimmed:
    """``renderable``'s lines without the spaces at their ends (``fit_lines.trim_line``): rich pads every
    cell of a table to its column's width, the last one included."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in console.render_lines(self.renderable, options, pad=False):
            yield from trim_line(line)
            yield Segment.line()


def _joined(items: Iterable[str | Segment | Trimmed]) -> RenderResult:
    """``items`` with each run of lines without a style (str) joined into segments of up to ``_PLAIN_RUN``
    lines, each line ended."""
    run: list[str] = []
    for item in items:
        if isinstance(item, str):
            run.append(item)
            if len(run) < _PLAIN_RUN:
                continue
        if run:
            yield Segment("\n".join(run) + "\n")
            run.clear()
        if not isinstance(item, str):
            yield item
    if run:
        yield Segment("\n".join(run) + "\n")


def _note(text: Text, style: str) -> Table:
    """``  └ text``, its continuation lines indented under the text (a hanging indent)."""
    from rich.table import Table

    grid = Table.grid()
    grid.add_column(width=cell_len(NOTE_PREFIX), no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(Text(NOTE_PREFIX, style=style), Text.assemble(text, style=style))
    return grid
