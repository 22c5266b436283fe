"""`serve status NAME`: a service's last hour as one line of sparklines. Pure: values in, text out.

``web  req/s ▁▂▅█▅▂▁▁▁▁▁▁▁▁▁ 0–12.3  ready ▁▁▃▃█▃▁▁▁▁▁▁▁▁▁ 1–3  (last hour)``
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from skyserve_lite.api import ServiceView
from skyserve_lite.state.history import ServiceHistory

BLOCKS = "▁▂▃▄▅▆▇█"
GAP = " "  # a stretch with no value at all (no controller pass sampled it)
LINE_WIDTH = 80
# Widths that split 60 minutes evenly (3, 4, 5, 6 minutes a character...): every character then stands for
# as many minutes as the others.
_WIDTHS = (30, 20, 15, 12, 10, 6, 5, 4, 3, 2, 1)
# A sparkline keeps at least 10 characters (6 minutes each); a long name is shortened instead.
MIN_SPARK_WIDTH = 10


def sparkline(values: Sequence[float | None], width: int) -> str:
    """``values`` as at most ``width`` block characters, the lowest value ``▁`` and the highest ``█``
    (all ``▁`` when they are equal). More values than ``width`` are averaged in ``width`` consecutive
    groups (60 values in 12: 5 a character); a group with no value at all is a space. Empty for no values."""
    if width < 1:
        raise ValueError("a sparkline needs at least one character")
    groups = _groups(values, width)
    present = [v for v in groups if v is not None]
    if not present:
        return GAP * len(groups)
    low, high = min(present), max(present)
    return "".join(GAP if v is None else _block(v, low, high) for v in groups)


def _block(value: float, low: float, high: float) -> str:
    if high == low:
        return BLOCKS[0]
    # Halves round up, not to even as round() does: 0.5 of the way from ▁ to █ is ▅ (3.5 of 7 steps), as 0.6 is.
    return BLOCKS[math.floor((value - low) / (high - low) * (len(BLOCKS) - 1) + 0.5)]


def _groups(values: Sequence[float | None], width: int) -> list[float | None]:
    count = len(values)
    if count <= width:
        return list(values)
    groups: list[float | None] = []
    for index in range(width):
        present = [v for v in values[index * count // width:(index + 1) * count // width] if v is not None]
        groups.append(sum(present) / len(present) if present else None)
    return groups


def format_range(values: Sequence[float | None]) -> str:
    """``0–12.3``: the lowest and the highest value (one value when they are equal); ``-`` for none."""
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    low, high = min(present), max(present)
    return _number(low) if low == high else f"{_number(low)}–{_number(high)}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def history_line(name: str, history: ServiceHistory, width: int = LINE_WIDTH) -> str:
    """The line of ``serve status NAME``: the request rate and the READY replicas over the last hour, each
    with its range, within ``width`` characters: the sparklines get what the name and labels leave, in a
    width that splits the hour evenly, at least ``MIN_SPARK_WIDTH`` (a name too long for that is shortened
    with ``…``)."""
    rates: list[float | None] = list(history.requests_per_second)
    ready: list[float | None] = [None if count is None else float(count) for count in history.ready]
    rate_range, ready_range = format_range(rates), format_range(ready)
    labels = f"  req/s  {rate_range}  ready  {ready_range}  (last hour)"
    room = width - len(name) - len(labels)
    if room < 2 * MIN_SPARK_WIDTH:  # the table above has the whole name; here the hour must stay readable
        name = name[:max(1, width - len(labels) - 2 * MIN_SPARK_WIDTH - 1)] + "…"
        room = width - len(name) - len(labels)
    spark_width = next((w for w in _WIDTHS if 2 * w <= room), 1)
    return (f"{name}  req/s {sparkline(rates, spark_width)} {rate_range}  ready {sparkline(ready, spark_width)} "
            f"{ready_range}  (last hour)")


def history_lines(views: Sequence[ServiceView], width: int = LINE_WIDTH) -> list[str]:
    """What `serve status NAME` prints after the tables: a blank line, then ``history_line`` for each service
    shown whose policy autoscales (the only ones with a history); nothing when there is none."""
    lines = [history_line(view.service.name, view.history, width) for view in views if view.history is not None]
    return ["", *lines] if lines else []
