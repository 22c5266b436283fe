"""Which columns a table keeps in a given width (``cli.fit.plan_layout``), as a table of cases."""

from __future__ import annotations

import pytest
from rich.console import Console

from skyserve_lite.cli.fit import Column, FitTable, Layout, Narrow, plan_layout

KEEP, DROP, UNDER = Narrow.KEEP, Narrow.DROP, Narrow.UNDER


@pytest.mark.parametrize(
    ("columns", "natural", "width", "layout"),
    [
        pytest.param([Column("A"), Column("B", DROP)], [10, 20], 32, Layout((10, 20)), id="fits-exactly"),
        pytest.param([Column("A"), Column("B", DROP)], [10, 20], 31, Layout((10, None)), id="one-cell-short-drops"),
        pytest.param([Column("A"), Column("WHY", UNDER, label="")], [10, 50], 40, Layout((10, None), under=(1,)),
                     id="reason-goes-under"),
        pytest.param([Column("A"), Column("B", DROP, priority=2), Column("C", DROP, priority=1)], [10, 10, 10], 25,
                     Layout((10, 10, None)), id="lowest-priority-first"),
        pytest.param([Column("A"), Column("B", DROP), Column("C", DROP)], [10, 10, 10], 25, Layout((10, 10, None)),
                     id="ties-rightmost-first"),
        pytest.param([Column("A"), Column("B", DROP), Column("C", DROP)], [10, 10, 10], 12, Layout((10, None, None)),
                     id="until-it-fits"),
        # 10 + 2 + 60 = 72 in 50: the message folds to 38 rather than giving way.
        pytest.param([Column("A"), Column("MSG", UNDER, fold_to=30)], [10, 60], 50, Layout((10, 38)),
                     id="free-text-folds-first"),
        # ... but not below its floor of 30: in 40 it goes under the row.
        pytest.param([Column("A"), Column("MSG", UNDER, fold_to=30)], [10, 60], 40, Layout((10, None), under=(1,)),
                     id="not-below-its-floor"),
        # Two free-text columns losing 30 cells: the widest gives first (60 + 20 -> 30 + 20, not 42 + 8).
        pytest.param([Column("A", fold_to=10), Column("B", fold_to=10)], [60, 20], 52, Layout((30, 20)),
                     id="widest-folds-first"),
        # Only KEEP columns, still too wide: they fold onto more lines (never cut), widest first.
        pytest.param([Column("NAME"), Column("URL")], [24, 22], 40, Layout((19, 19)), id="keep-columns-fold-last"),
        # The replicas of `serve status` in 80 columns (module docstring of cli.fit): REASON under, then
        # INSTANCE, VERSION (every replica on its service's version) and CLOUD/REGION dropped: 75 <= 80.
        pytest.param([Column("SERVICE"), Column("ID"), Column("VERSION", DROP, priority=2), Column("STATUS"),
                      Column("CLOUD/REGION", DROP, priority=3), Column("INSTANCE", DROP, priority=1), Column("URL"),
                      Column("AGE", DROP, priority=4), Column("REASON", UNDER, priority=0, label="")],
                     [24, 2, 7, 16, 12, 19, 22, 3, 90], 80,
                     Layout((24, 2, None, 16, None, None, 22, 3, None), under=(8,)), id="replicas-in-80"),
    ],
)
def test_layout(columns: list[Column], natural: list[int], width: int, layout: Layout) -> None:
    assert plan_layout(columns, natural, width) == layout


def test_a_header_is_its_columns_floor() -> None:
    """A free-text column never folds narrower than its header: `HELD BACK BY` (12) with a floor of 5."""
    assert plan_layout([Column("A"), Column("HELD BACK BY", UNDER, fold_to=5)], [10, 40], 25) == Layout((10, 13))


def test_a_column_with_nothing_to_show_is_left_out_not_printed_blank() -> None:
    table = FitTable([Column("NAME"), Column("REASON", Narrow.UNDER, label=""), Column("AGE", Narrow.DROP)])
    table.add_row("web", "", "-")
    table.add_row("api", "", "3s")
    console = Console(width=200, record=True, color_system=None, force_terminal=False)
    console.print(table)
    lines = console.export_text().splitlines()
    assert lines[0].split() == ["NAME", "AGE"]
    assert table.layout(200).under == ()
