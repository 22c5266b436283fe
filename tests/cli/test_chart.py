"""The text chart of `serve simulate --plot`: scales, columns, and marks where a delay held a change back."""

from __future__ import annotations

import pytest

from skyserve_lite.autoscalers.simulator import SimulatedDecision
from skyserve_lite.cli.chart import (
    DOWN_MARK,
    UP_MARK,
    ChartColumn,
    Hold,
    compute_columns,
    find_hold,
    nice_ceiling,
    render_chart,
)

D = SimulatedDecision

# 0-40 s: the load rises, the upscale delay holds raw 2 at t=10, 2 applies at t=20, and at t=30 the downscale
# delay holds raw 1 back.
HELD = [D(0, 0.0, 1, 1, None), D(10, 2.0, 1, 2, "upscale delay 1/2"), D(20, 4.0, 2, 2, None),
        D(30, 4.0, 2, 1, "downscale delay 1/3")]


def test_a_small_chart_line_by_line() -> None:
    # Width 45: a gutter of 3 ("qps"), a space and the axis leave 40 columns, 10 per decision.
    assert render_chart(HELD, 45, 6) == [
        "qps (0-4)",
        "  4 |                    ********************",
        "  2 |          ***********",
        "  0 |***********",
        "replicas (1-2)",
        "  2 |          ^^^^^^^^^^####################",
        "  1 |#####################         vvvvvvvvvv",
        "    +---------+---------+---------+---------+",
        "    0         10        20        30",
        "                                     time (s)",
        "* qps   # target replicas",
        "^ raw target the upscale delay holds back",
        "v raw target the downscale delay holds back",
    ]


@pytest.mark.parametrize("width", [80, 100, 137, 200])
def test_every_line_fits_the_width_and_the_marks_stay_where_the_holds_are(width: int) -> None:
    lines = render_chart(HELD, width, 16)
    assert all(len(line) <= width for line in lines)
    plot = width - 5  # gutter 3, " |"
    [top, bottom] = [line for line in lines if line.startswith(("  2 |", "  1 |"))][-2:]
    # Each decision holds a quarter of the plot; a column shows the decisions made in it, so the hold at
    # t=10 starts in the column holding t=10, floor(plot / 4), and lasts until the one holding t=20.
    ups = [x for x, c in enumerate(top[5:]) if c == UP_MARK]
    downs = [x for x, c in enumerate(bottom[5:]) if c == DOWN_MARK]
    assert ups == list(range(plot // 4, plot // 2))
    assert downs == list(range(3 * plot // 4, plot))
    assert any(line.startswith("* qps   # target replicas") for line in lines[-2:])


def test_80_columns_labels_qps_at_quarters_and_the_time_axis() -> None:
    lines = render_chart(HELD, 80, 16)
    # 14 rows left for qps; 13 are used so that rows sit at quarters of the 0-4 scale.
    labels = [line[:3].strip() for line in lines[1:14]]
    assert [label for label in labels if label] == ["4", "3", "2", "1", "0"]
    assert lines[14] == "replicas (1-2)"
    assert lines[17] == "    +------------------+------------------+-----------------+------------------+"
    assert lines[18] == "    0                  10                 20                30  time (s)"


@pytest.mark.parametrize(
    ("decision", "hold"),
    [
        (D(0, 1.0, 1, 3, "upscale delay 1/15"), Hold.UPSCALE),
        (D(0, 1.0, 3, 1, "downscale delay 2/60"), Hold.DOWNSCALE),
        (D(0, 1.0, 2, 2, None), None),
        (D(0, 1.0, 1, 3, None), None),  # a change applied at once is not held
        (D(0, 1.0, 2, 2, "downscale delay 1/2"), Hold.DOWNSCALE),  # equal counts: the rule named decides
    ],
)
def test_find_hold(decision: SimulatedDecision, hold: Hold | None) -> None:
    assert find_hold(decision) is hold


@pytest.mark.parametrize(
    ("value", "top"),
    [(0.0, 1.0), (0.3, 0.3), (0.31, 0.4), (1.0, 1.0), (4.2, 5.0), (5.33, 6.0), (6.0, 6.0), (12.0, 12.0),
     (13.0, 15.0), (81.0, 100.0), (2400.0, 2500.0)],
)
def test_nice_ceiling(value: float, top: float) -> None:
    assert nice_ceiling(value) == pytest.approx(top)


SPREAD = [D(0, 1.0, 1, 1, None), D(10, 5.0, 2, 2, None), D(20, 3.0, 3, 3, None), D(30, 0.0, 1, 1, None)]


@pytest.mark.parametrize(
    ("decisions", "count", "expected"),
    [
        # Fewer columns than decisions: each column the peak of the two decisions in it.
        (SPREAD, 2, [ChartColumn(0.0, 5.0, 2), ChartColumn(20.0, 3.0, 3)]),
        # More columns: a decision holds over the columns until the next one.
        (SPREAD, 8, [ChartColumn(0.0, 1.0, 1), ChartColumn(5.0, 1.0, 1), ChartColumn(10.0, 5.0, 2),
                     ChartColumn(15.0, 5.0, 2), ChartColumn(20.0, 3.0, 3), ChartColumn(25.0, 3.0, 3),
                     ChartColumn(30.0, 0.0, 1), ChartColumn(35.0, 0.0, 1)]),
        # One column for all of them: an upscale hold wins over a downscale one.
        ([D(0, 1.0, 1, 1, None), D(10, 1.0, 1, 3, "upscale delay 1/2"), D(20, 1.0, 2, 1, "downscale delay 1/2")],
         1, [ChartColumn(0.0, 1.0, 2, Hold.UPSCALE, 3)]),
        # A single decision spans one second.
        ([D(0, 2.0, 2, 2, None)], 2, [ChartColumn(0.0, 2.0, 2), ChartColumn(0.5, 2.0, 2)]),
    ],
)
def test_columns(decisions: list[SimulatedDecision], count: int, expected: list[ChartColumn]) -> None:
    assert compute_columns(decisions, count) == expected


def test_a_scale_too_tall_for_one_row_per_replica_labels_whole_counts_only() -> None:
    decisions = [D(0, 1.0, 0, 0, None), D(20, 50.0, 20, 20, None)]
    lines = render_chart(decisions, 80, 16)
    replica_rows = lines[lines.index("replicas (0-20)") + 1:-4]
    assert len(replica_rows) == 8
    # 0-20 over 8 rows: steps of 20/7, whole only at the bottom and the top.
    assert [row[:3].strip() for row in replica_rows] == ["20", "", "", "", "", "", "", "0"]


@pytest.mark.parametrize(("width", "height"), [(39, 16), (80, 3)])
def test_too_small_a_chart_is_refused(width: int, height: int) -> None:
    with pytest.raises(ValueError, match="a chart needs at least"):
        render_chart(HELD, width, height)


def test_no_decision_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one decision"):
        render_chart([], 80, 16)
