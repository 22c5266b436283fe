"""The last-hour line of `serve status NAME`: sparklines, their ranges, and 80 columns."""

from __future__ import annotations

import pytest

from skyserve_lite.cli.sparkline import format_range, history_line, sparkline
from skyserve_lite.state.history import ServiceHistory


@pytest.mark.parametrize(
    ("values", "width", "line"),
    [
        ([0, 1, 2, 3, 4, 5, 6, 7], 8, "▁▂▃▄▅▆▇█"),
        ([7, 0], 8, "█▁"),  # fewer values than the width: one character each, no padding
        ([3, 3, 3], 3, "▁▁▁"),  # all equal: the lowest block
        ([0, None, 7], 3, "▁ █"),  # no sample that minute: a gap
        ([None, None], 2, "  "),
        ([], 4, ""),
        ([10, 20, 15], 3, "▁█▅"),  # scaled from the lowest to the highest: 15 is 3.5 of 7 steps, rounded up
        ([0, 0, 7, 7], 2, "▁█"),  # 4 values in 2: each character the mean of 2
        ([0, None, None, None, 7, 7], 3, "▁ █"),  # a group of gaps only stays a gap; a half one is its mean
        (list(range(60)), 12, "▁▂▂▃▄▄▅▅▆▇▇█"),  # the hour in 12: 5 minutes a character
    ],
)
def test_sparkline(values: list[float | None], width: int, line: str) -> None:
    assert sparkline(values, width) == line


def test_a_sparkline_needs_a_character() -> None:
    with pytest.raises(ValueError, match="at least one character"):
        sparkline([1.0], 0)


@pytest.mark.parametrize(
    ("values", "text"),
    [([0.0, 12.25, 3.0], "0–12.2"), ([1.0, 3.0], "1–3"), ([2.0, 2.0, None], "2"), ([None], "-"),
     ([0.5, 250.0], "0.5–250"), ([0.1166], "0.117")],
)
def test_format_range(values: list[float | None], text: str) -> None:
    assert format_range(values) == text


def history(requests: list[int], ready: list[int | None]) -> ServiceHistory:
    return ServiceHistory(start_minute=29_453_760, requests=tuple(requests), ready=tuple(ready),
                          target=tuple(ready))


# 20 quiet minutes, 10 at 10 req/s, 5 at 12 req/s, 25 quiet; replicas sampled from minute 20 on: 1, then 3.
HOUR = history([0] * 20 + [600] * 10 + [720] * 5 + [0] * 25, [None] * 20 + [1] * 20 + [3] * 10 + [2] * 10)


@pytest.mark.parametrize(
    ("name", "line"),
    [
        # The labels take 38 characters and "web" 3, which leaves 39: 15 a sparkline (20 would need 40), 4
        # minutes a character. Minutes 28-31 average 11 req/s, the top block; the range is of the minutes.
        ("web", "web  req/s ▁▁▁▁▁▇▇█▇▁▁▁▁▁▁ 0–12  ready      ▁▁▁▁▁██▆▅▅ 1–3  (last hour)"),
        # 15 characters leave 27: 12 a sparkline, 5 minutes a character.
        ("name-of-fifteen", "name-of-fifteen  req/s ▁▁▁▁▇▇█▁▁▁▁▁ 0–12  ready     ▁▁▁▁██▅▅ 1–3  (last hour)"),
        # A name that would leave less than 10 each is shortened; the table above it has it whole.
        ("a-much-longer-service-name",
         "a-much-longer-service…  req/s ▁▁▁▆██▁▁▁▁ 0–12  ready    ▁▁▁▃█▆▅ 1–3  (last hour)"),
    ],
)
def test_history_line(name: str, line: str) -> None:
    assert history_line(name, HOUR) == line
    assert len(line) <= 80


def test_history_line_of_63_characters_stays_within_80_columns() -> None:
    line = history_line("s" * 63, HOUR)
    assert len(line) == 80 and line.startswith("s" * 21 + "…  req/s ")


def test_history_line_without_replica_samples() -> None:
    assert history_line("web", history([7] * 60, [None] * 60)) == (
        "web  req/s ▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁▁ 0.117  ready                      -  (last hour)")
