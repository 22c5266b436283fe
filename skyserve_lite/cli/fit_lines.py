"""The lines of a ``cli.fit.FitTable`` whose column widths are decided, written as rich's tables would print
them, without rich's cost per cell.

A rich table pads, wraps and crops each cell through several renderables, about a millisecond a row: 10 s
for the 10,000 replicas of 100 services. With the widths fixed, a row none of whose cells folds is only its
cells, each padded to its column's width, two cells apart (a cell's padding of one on each side that faces
another cell); a row of several lines pads its shorter cells with blank lines. ``Lines`` writes those rows,
the header and one-line notes as the segments rich renders for them, styles included (the tests compare
the two), and answers None for what rich must draw: a cell that folds, a tab, a justify of the cell's own,
styled spans over several lines.

No line ends in spaces (``trim_line``; ``cli.fit`` trims what rich draws the same way): rich pads the last
column to its width too, so piped into a file every row of `serve status` ended in up to 90 spaces, noise in
every diff and in `grep ' $'`.

Most rows are one line of printable ASCII in every cell, where ``len`` is the width: ``Cells`` reads the
table by column once, so that those lines are joined by ``str`` methods over whole columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.control import strip_control_codes
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

if TYPE_CHECKING:
    from rich.console import Console

Cell = str | Text

GAP = 2  # cells between two columns: each cell's padding of 1 on either side
NOTE_PREFIX = "  └ "

_BOLD = Style(bold=True)  # the header row's style (``header_style`` of the rich tables)
_NEW_LINE = Segment("\n")


def plain_of(cell: Cell) -> str:
    return cell if isinstance(cell, str) else cell.plain


def width_of(cell: Cell) -> int:
    """The width of the cell's widest line."""
    plain = plain_of(cell)
    if "\n" not in plain:
        return cell_len(plain)
    return max(cell_len(line) for line in plain.split("\n"))


def trim_line(segments: list[Segment]) -> list[Segment]:
    """One line's ``segments`` (no line break among them) without the spaces at its end: the padding of the
    last column, and of the cells before it when those are empty. Spaces are dropped whatever their style
    (no style used here shows on a space but a background, and none sets one)."""
    end = len(segments)
    while end:
        segment = segments[end - 1]
        if segment.control:
            break
        text = segment.text.rstrip(" ")
        if text:
            if len(text) == len(segment.text):
                return segments if end == len(segments) else segments[:end]
            return [*segments[:end - 1], Segment(text, segment.style)]
        end -= 1
    return segments[:end]


def _is_plain_ascii(texts: Sequence[str]) -> bool:
    """Every text printable ASCII: no control code, tab or line break, and ``len`` is its width."""
    return all(map(str.isascii, texts)) and all(map(str.isprintable, texts))


@dataclass(frozen=True)
class Cells:
    """A table's cells by column. A str cell is text, as ``Text(cell)`` keeps it (its control codes
    stripped), never markup: rich would read "[errno 111] refused" or a bracketed IPv6 host as markup and
    drop the brackets."""

    rows: list[tuple[Cell, ...]]  # the cells, control codes stripped
    plains: list[Sequence[str]]  # of each column, each row's text
    widths: list[list[int]]  # of each column, each row's widest line
    styles: list[list[str | Style] | None]  # of each column, each row's style; None: none is styled
    # Of each column, the rows whose cell is not one line of printable ASCII text without spans (``Lines``
    # writes those cell by cell).
    odd: list[frozenset[int]]

    @classmethod
    def of(cls, rows: Sequence[tuple[Cell, ...]], columns: int) -> Cells:
        by_column: list[Sequence[Cell]] = list(zip(*rows, strict=True)) if rows else [() for _ in range(columns)]
        plains: list[Sequence[str]] = []
        widths: list[list[int]] = []
        styles: list[list[str | Style] | None] = []
        odd: list[frozenset[int]] = []
        changed = False
        for index, column in enumerate(by_column):
            if set(map(type, column)) <= {str}:
                texts: Sequence[str] = column  # type: ignore[assignment]
                styled = None
                unusual: set[int] = set()
            else:
                # Each distinct cell read once: a column of Text cells shares them (one per replica status).
                ids = list(map(id, column))
                distinct = dict(zip(ids, column, strict=True))
                plain = {key: plain_of(cell) for key, cell in distinct.items()}
                style = {key: cell.style if isinstance(cell, Text) else "" for key, cell in distinct.items()}
                spanned = {key for key, cell in distinct.items()
                           if isinstance(cell, Text) and (cell.spans or cell.justify is not None)}
                texts = list(map(plain.__getitem__, ids))
                styled = list(map(style.__getitem__, ids)) if any(style.values()) else None
                unusual = {row for row, key in enumerate(ids) if key in spanned} if spanned else set()
            if _is_plain_ascii(texts):
                widths.append(list(map(len, texts)))
            else:
                cleaned = [strip_control_codes(cell) if isinstance(cell, str) else cell for cell in column]
                if any(a is not b for a, b in zip(cleaned, column, strict=True)):
                    by_column[index] = cleaned
                    changed = True
                texts = [plain_of(cell) for cell in cleaned]
                widths.append(list(map(width_of, cleaned)))
                unusual.update(row for row, text in enumerate(texts) if not (text.isascii() and text.isprintable()))
            plains.append(texts)
            styles.append(styled)
            odd.append(frozenset(unusual))
        kept_rows = list(zip(*by_column, strict=True)) if changed else list(rows)
        return cls(kept_rows, plains, widths, styles, odd)

    def is_empty(self, column: int) -> bool:
        """Nothing to show in the column: every cell blank or ``-``."""
        return set(map(str.strip, self.plains[column])) <= {"", "-"}


class Lines:
    """The segments of a table's lines in ``widths`` (of its columns ``inline``, by index among all)."""

    def __init__(self, console: Console, cells: Cells, inline: Sequence[int], widths: Sequence[int]) -> None:
        self.console = console
        self.cells = cells
        self.inline = inline
        self.widths = widths
        self._styles: dict[str | Style, Style] = {}
        # A console that prints no style (a pipe, not recorded) prints styled text as it prints plain
        # text, so such a row is one segment: rich's cost per segment is most of printing 10,000 rows.
        self._unstyled = console.color_system is None and not console.record

    def _style(self, style: str | Style) -> Style:
        found = self._styles.get(style)
        if found is None:
            found = self._styles[style] = self.console.get_style(style)
        return found

    def header(self, headers: Sequence[str]) -> list[Segment] | None:
        """The header line: every segment bold, the padding too (each piece its own segment, as rich's)."""
        segments: list[Segment] = []
        last = len(headers) - 1
        for position, (header, width) in enumerate(zip(headers, self.widths, strict=True)):
            lines = self._cell(header, width)
            if lines is None or len(lines) > 1:
                return None
            if position:
                segments.append(Segment(" ", _BOLD))
            segments.extend(Segment(text, _BOLD + style) for text, style, _ in lines[0])
            if position < last:
                segments.append(Segment(" ", _BOLD))
        return [*trim_line(segments), _NEW_LINE]

    def rows(self) -> list[str | list[Segment] | None]:
        """Each row's lines: a str for one line printed without a style (``FitTable`` prints runs of them
        as one segment: rich's cost per segment), its segments, or None for a row rich must draw."""
        cells, inline, widths = self.cells, self.inline, self.widths
        odd: set[int] = set()
        for index, width in zip(inline, widths, strict=True):
            odd.update(cells.odd[index])
            if max(cells.widths[index], default=0) > width:  # a column narrowed below its widest cell
                odd.update(row for row, cell_width in enumerate(cells.widths[index]) if cell_width > width)
        padded = [list(map(str.ljust, cells.plains[index], repeat(width))) for index, width in zip(inline, widths,
                                                                                                  strict=True)]
        lines = [line.rstrip(" ") for line in map((" " * GAP).join, zip(*padded, strict=True))]
        # Where each styled column's cells are in a line: (start, end, its styles).
        spans = [] if self._unstyled else [
            (sum(widths[:position]) + GAP * position, sum(widths[:position + 1]) + GAP * position, styles)
            for position, index in enumerate(inline) if (styles := cells.styles[index]) is not None]
        drawn: list[str | list[Segment] | None]
        if not spans:
            drawn = list(lines)
            for row in odd:
                drawn[row] = self.row([cells.rows[row][index] for index in inline])
            return drawn
        drawn = []
        for row, line in enumerate(lines):
            if row in odd:
                drawn.append(self.row([cells.rows[row][index] for index in inline]))
                continue
            segments = []
            start = 0
            for offset, end, styles in spans:
                if offset >= len(line):  # the line's end was padding, trimmed
                    break
                style = styles[row]
                if style:
                    if offset > start:
                        segments.append(Segment(line[start:offset]))
                    segments.append(Segment(line[offset:end], self._style(style)))
                    start = end
            if start < len(line):
                segments.append(Segment(line[start:]) if start else Segment(line))
            segments.append(_NEW_LINE)
            drawn.append(segments)
        return drawn

    def row(self, cells: Sequence[Cell]) -> list[Segment] | None:
        """The lines of a row of any cells, one line each or several; text without a style gathered into
        one segment per run (it prints the same)."""
        blocks = []
        for cell, width in zip(cells, self.widths, strict=True):
            block = self._cell(cell, width)
            if block is None:
                return None
            blocks.append(block)
        segments: list[Segment] = []
        run: list[str] = []
        last = len(blocks) - 1
        for number in range(max(len(block) for block in blocks)):
            line: list[Segment] = []
            for position, (block, width) in enumerate(zip(blocks, self.widths, strict=True)):
                if position:
                    run.append(" ")  # the left padding of this cell
                for segment in block[number] if number < len(block) else [Segment(" " * width)]:
                    if segment.style and not self._unstyled:
                        if run:
                            line.append(Segment("".join(run)))
                            run.clear()
                        line.append(segment)
                    else:
                        run.append(segment.text)
                if position < last:
                    run.append(" ")  # its right padding
            if run:
                line.append(Segment("".join(run)))
                run.clear()
            segments.extend(trim_line(line))
            segments.append(_NEW_LINE)
        return segments

    def note(self, text: Text, style: str, max_width: int) -> list[Segment] | None:
        """``  └ text`` on one line, as ``cli.fit``'s grid renders it when the text fits beside the prefix."""
        plain = text.plain
        if not plain or "\n" in plain or cell_len(NOTE_PREFIX) + cell_len(plain) > max_width:
            return None
        lines = self._cell(Text.assemble(text, style=style), cell_len(plain))
        if lines is None:
            return None
        return [*trim_line([Segment(NOTE_PREFIX, self._style(style)), *lines[0]]), _NEW_LINE]

    def _cell(self, cell: Cell, width: int) -> list[list[Segment]] | None:
        """The lines of ``cell`` left-justified in ``width`` cells, each padded to it."""
        plain = plain_of(cell)
        if "\t" in plain:
            return None
        if isinstance(cell, str):
            style = None
        elif cell.justify is not None:
            return None
        elif cell.spans:
            if "\n" in plain or cell_len(plain) > width:
                return None
            # What rich's wrapping makes of it (the line padded), rendered as rich renders its lines.
            padded = cell.copy()
            padded.truncate(width, pad=True)
            return [list(Text("\n").join([padded]).render(self.console))]
        else:
            style = self._style(cell.style) if cell.style else None
        lines = []
        for line in plain.split("\n"):
            room = width - cell_len(line)
            if room < 0:
                return None
            lines.append([Segment(line + " " * room, style)])
        return lines
