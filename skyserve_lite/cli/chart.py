"""`serve simulate --plot`: the load and the replica target over time as plain text. Pure: decisions in, lines out.

Two panels share one time axis: the load (qps) above, the replica target below. In the replica panel ``^``
marks the raw target of a decision whose increase the upscale delay held back, ``v`` one whose decrease the
downscale delay held back, so the gap between a mark and the ``#`` line is the change not (yet) applied.

Each column covers an equal slice of time, from the first decision to one period after the last (the last
target holds for a period). A decision holds until the next, so with fewer decisions than columns a decision
spans several columns; with more, a column shows the highest qps and target of the decisions in it (peaks are
what capacity is sized for) and the hold of any of them, upscale first.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from skyserve_lite.autoscalers.simulator import SimulatedDecision

QPS_MARK = "*"
TARGET_MARK = "#"
UP_MARK = "^"
DOWN_MARK = "v"

MIN_WIDTH = 40
MIN_HEIGHT = 4
# What `serve simulate --plot` draws: the terminal's width, but never under 80 columns (a narrower terminal
# wraps the lines, which stays readable, while a narrower chart merges more decisions per column: an hour of
# 20 s decisions, 180, already shares the 75 columns of 80), and 16 rows.
MIN_CHART_WIDTH = 80
DEFAULT_HEIGHT = 16
# A tick label ("1200") and the gap to the next one need about 10 columns.
_TICK_SPACING_COLUMNS = 10


class Hold(enum.Enum):
    UPSCALE = "upscale"
    DOWNSCALE = "downscale"


def find_hold(decision: SimulatedDecision) -> Hold | None:
    """Which delay held the decision's change back, if any. A delay holds only a raw target that differs
    from the applied one (an equal decision resets the counters), so the direction is their order."""
    if decision.held_back is None:
        return None
    if decision.raw_target != decision.target_replicas:
        return Hold.UPSCALE if decision.raw_target > decision.target_replicas else Hold.DOWNSCALE
    return Hold.DOWNSCALE if decision.held_back.startswith("downscale") else Hold.UPSCALE


@dataclass(frozen=True)
class ChartColumn:
    """What one column of the chart shows."""

    start_s: float
    qps: float
    target: int
    hold: Hold | None = None
    held_raw: int | None = None  # the raw target the hold kept back; None without a hold


def compute_columns(decisions: Sequence[SimulatedDecision], count: int) -> list[ChartColumn]:
    """``count`` columns over the decisions' time span (see the module docstring). ``decisions`` are in time
    order; raises ``ValueError`` when there are none or ``count`` < 1."""
    if not decisions or count < 1:
        raise ValueError("a chart needs at least one decision and one column")
    times = [d.time_s for d in decisions]
    start, end = time_span(decisions)
    step = (end - start) / count
    eps = 1e-9 * max(1.0, abs(end))
    columns = []
    for index in range(count):
        low = start + index * step
        first = bisect.bisect_left(times, low - eps)
        last = bisect.bisect_left(times, low + step - eps)
        # A column no decision falls into shows the one before it, which still holds.
        group = decisions[first:last] if last > first else decisions[max(0, first - 1):first]
        columns.append(_column(low, group))
    return columns


def time_span(decisions: Sequence[SimulatedDecision]) -> tuple[float, float]:
    """From the first decision to one period after the last: the last target holds for a period too."""
    start = decisions[0].time_s
    period = decisions[-1].time_s - decisions[-2].time_s if len(decisions) > 1 else 1.0
    return start, decisions[-1].time_s + period


def _column(start_s: float, group: Sequence[SimulatedDecision]) -> ChartColumn:
    qps = max(d.qps for d in group)
    target = max(d.target_replicas for d in group)
    holds = [(find_hold(d), d.raw_target) for d in group]
    up = [raw for hold, raw in holds if hold is Hold.UPSCALE]
    down = [raw for hold, raw in holds if hold is Hold.DOWNSCALE]
    if up:
        return ChartColumn(start_s, qps, target, Hold.UPSCALE, max(up))
    if down:
        return ChartColumn(start_s, qps, target, Hold.DOWNSCALE, min(down))
    return ChartColumn(start_s, qps, target)


def nice_ceiling(value: float) -> float:
    """The top of a scale for ``value``: the smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of
    ten that is >= ``value`` (5.33 -> 6, 4.2 -> 5, 12 -> 12, 0.3 -> 0.3); 1 for a value <= 0. Fine steps keep
    the peak near the top row: with 1, 2, 5 only, 5.33 qps would get a scale to 10 and use half the rows."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for factor in (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0):
        if factor * power >= value * (1 - 1e-9):
            return factor * power
    return 10.0 * power


def _format_number(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def render_chart(decisions: Sequence[SimulatedDecision], width: int, height: int) -> list[str]:
    """The chart as lines of at most ``width`` characters: the qps panel, the replica panel, the time axis
    and a legend. ``height`` is the rows of the two panels together, at most (the qps panel leaves one
    unused to have a row at half its scale); the replica panel takes one row per replica count when that
    fits in half of them. Raises ``ValueError`` for no decisions, ``width`` < ``MIN_WIDTH`` or ``height`` <
    ``MIN_HEIGHT``."""
    if width < MIN_WIDTH or height < MIN_HEIGHT:
        raise ValueError(f"a chart needs at least {MIN_WIDTH} columns and {MIN_HEIGHT} rows")
    if not decisions:
        raise ValueError("a chart needs at least one decision")

    # The scales (and so the labels, whose width is the gutter's) depend on the data only, not on the
    # columns: they come first, and the columns get what the gutter leaves.
    peak_qps = max(d.qps for d in decisions)
    qps_top = nice_ceiling(peak_qps)
    counts = [d.target_replicas for d in decisions] + [d.raw_target for d in decisions if find_hold(d)]
    low, high = min(counts), max(counts)
    replica_rows = min(high - low + 1, height // 2)
    qps_rows = height - replica_rows
    if qps_rows > 2 and (qps_rows - 1) % 2:  # an even number of steps puts a row at half the scale
        qps_rows -= 1
    qps_labels = _qps_labels(qps_top, qps_rows)
    replica_labels = _replica_labels(low, high, replica_rows)
    gutter = max(len(label) for label in [*qps_labels.values(), *replica_labels.values(), "qps"])
    plot_width = width - gutter - 2  # the gutter, a space and the axis

    columns = compute_columns(decisions, plot_width)
    qps_levels = [_level(c.qps, 0.0, qps_top, qps_rows) for c in columns]
    qps_grid = _step_line(qps_levels, qps_rows, QPS_MARK)
    replica_grid = _step_line([_level(c.target, low, high, replica_rows) for c in columns], replica_rows,
                              TARGET_MARK)
    for x, column in enumerate(columns):
        if column.hold is not None and column.held_raw is not None:
            mark = UP_MARK if column.hold is Hold.UPSCALE else DOWN_MARK
            replica_grid[_level(column.held_raw, low, high, replica_rows)][x] = mark

    lines = [f"qps (0-{_format_number(qps_top)})"]
    lines += _panel(qps_grid, qps_labels, gutter)
    lines.append(f"replicas ({low}-{high})" if high > low else f"replicas ({low})")
    lines += _panel(replica_grid, replica_labels, gutter)
    start, end = time_span(decisions)
    lines += _time_axis(start, end, plot_width, gutter, width)
    lines += _legend(width)
    return [line.rstrip() for line in lines]


def _level(value: float, low: float, high: float, rows: int) -> int:
    """The row (0 at the bottom) of ``value`` on a scale from ``low`` (row 0) to ``high`` (the top row)."""
    if rows == 1 or high <= low:
        return 0
    # Halves round up (2 on a 0-4 scale of 2 rows is the top row), not to even as round() does.
    return max(0, min(rows - 1, math.floor((value - low) / (high - low) * (rows - 1) + 0.5)))


def _qps_labels(top: float, rows: int) -> dict[int, str]:
    """Labels on the rows at quarters of the scale when rows sit there (13 rows: 0, 3, 6, 9, 12), else at
    halves, else at the bottom and top only."""
    steps = rows - 1
    parts = 4 if steps % 4 == 0 else 2 if steps % 2 == 0 else 1
    return {steps * k // parts: _format_number(top * k / parts) for k in range(parts + 1)}


def _replica_labels(low: int, high: int, rows: int) -> dict[int, str]:
    """A label on every row that stands for a whole replica count: every row when there is one per count,
    else the bottom, the top and any row in between that lands on a whole number (0-20 on 8 rows: 0 and 20)."""
    if rows == 1 or high == low:
        return {0: str(low)}
    labels = {}
    for row in range(rows):
        value = low + row * (high - low) / (rows - 1)
        if abs(value - round(value)) < 1e-9:
            labels[row] = str(round(value))
    return labels


def _step_line(levels: Sequence[int], rows: int, mark: str) -> list[list[str]]:
    """A grid (row 0 at the bottom) with ``mark`` at each column's level, joined vertically to the previous
    column's level so that a jump reads as one step, not as two dots."""
    grid = [[" "] * len(levels) for _ in range(rows)]
    previous: int | None = None
    for x, level in enumerate(levels):
        below, above = (level, level) if previous is None else (min(previous, level), max(previous, level))
        for row in range(below, above + 1):
            grid[row][x] = mark
        previous = level
    return grid


def _panel(grid: Sequence[Sequence[str]], labels: dict[int, str], gutter: int) -> list[str]:
    return [f"{labels.get(row, ''):>{gutter}} |{''.join(grid[row])}" for row in reversed(range(len(grid)))]


def _time_axis(start: float, end: float, plot_width: int, gutter: int, width: int) -> list[str]:
    """The axis line and the tick times under it, then ``time (s)``. The axis character left of column x
    sits on that column's left edge, the time ``start + x * step``: the corner (x = 0) is the first
    decision's time and the last character the end of the span."""
    step = (end - start) / plot_width
    spacing = _nice_time_step(step * _TICK_SPACING_COLUMNS)
    axis = ["+"] + ["-"] * plot_width
    labels = [" "] * (plot_width + 1)
    free_from = 0
    first = math.ceil(start / spacing - 1e-9)
    for index in range(first, math.floor(end / spacing + 1e-9) + 1):
        tick = index * spacing  # a multiple, not a sum of steps: 0.1 added ten times is not 1.0
        x = min(plot_width, round((tick - start) / step))
        text = _format_number(tick)
        axis[x] = "+"
        if x >= free_from and gutter + 1 + x + len(text) <= width:
            labels[x:x + len(text)] = text
            free_from = x + len(text) + 1
    margin = " " * (gutter + 1)
    axis_line, label_line = margin + "".join(axis), (margin + "".join(labels)).rstrip()
    title = "time (s)"
    if len(label_line) + 2 + len(title) <= width:
        return [axis_line, f"{label_line}  {title}"]
    return [axis_line, label_line, f"{title:>{width}}"]


def _nice_time_step(at_least: float) -> float:
    """1, 2 or 5 times a power of ten seconds, at least ``at_least``: 34.3 -> 50, 9 -> 10, 0.7 -> 1."""
    power = 10.0 ** math.floor(math.log10(at_least)) if at_least > 0 else 1.0
    for factor in (1.0, 2.0, 5.0, 10.0):
        if factor * power >= at_least * (1 - 1e-9):
            return factor * power
    return 10.0 * power


def _legend(width: int) -> list[str]:
    items = [f"{QPS_MARK} qps", f"{TARGET_MARK} target replicas",
             f"{UP_MARK} raw target the upscale delay holds back",
             f"{DOWN_MARK} raw target the downscale delay holds back"]
    lines, current = [], ""
    for item in items:
        candidate = f"{current}   {item}" if current else item
        if len(candidate) > width and current:
            lines.append(current)
            candidate = item
        current = candidate
    lines.append(current)
    return lines
