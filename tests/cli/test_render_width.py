"""Every table at 80 and 120 columns (rich's console width): snapshot files, and the rules that make them
readable, asserted directly: no line wider than the console, no name, URL or status cut (no `…`), long
reasons on their own line under their row.

The snapshots are tests/cli/snapshots/VIEW_WIDTH.txt. After an intended change of layout, regenerate them
with ``SKY_LITE_UPDATE_SNAPSHOTS=1 pytest tests/cli/test_render_width.py`` and review the diff.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console, RenderableType

from skyserve_lite.api import ServiceView
from skyserve_lite.cli.render import (
    status_renderable,
)
from tests.cli import render_samples as s

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("SKY_LITE_UPDATE_SNAPSHOTS") == "1"

VIEWS = s.RENDERED_VIEWS
WIDTHS = (80, 120)


def render(renderable: RenderableType, width: int) -> str:
    console = Console(width=width, record=True, color_system=None, force_terminal=False, file=io.StringIO())
    console.print(renderable)
    # Rich pads every cell to its column's width; the trailing spaces are invisible and only noise in a diff.
    return "".join(line.rstrip() + "\n" for line in console.export_text().splitlines())


def assert_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"no snapshot {path}; create it with SKY_LITE_UPDATE_SNAPSHOTS=1"
    assert text == path.read_text(), f"{name} differs from its snapshot; if intended: SKY_LITE_UPDATE_SNAPSHOTS=1"


def flat(text: str) -> str:
    """The words of ``text`` on one line: a note that wraps reads as the sentence it is."""
    return " ".join(text.split())


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_snapshot(view: str, width: int) -> None:
    assert_snapshot(f"{view}_{width}.txt", render(VIEWS[view](), width))


@pytest.mark.parametrize("width", [60, *WIDTHS, 200])
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_nothing_is_wider_than_the_console_or_cut(view: str, width: int) -> None:
    text = render(VIEWS[view](), width)
    assert max(cell_len(line) for line in text.splitlines()) <= width
    assert "…" not in text and "..." not in text


@pytest.mark.parametrize("width", [*WIDTHS, 200])
def test_names_endpoints_urls_and_statuses_are_whole_on_one_line(width: int) -> None:
    lines = render(VIEWS["status"](), width).splitlines()
    whole = [*s.SERVICE_NAMES, *s.ENDPOINTS, *s.REPLICA_URLS, "PROVISIONING", "NOT_READY", "FAILED"]
    assert [value for value in whole if not any(value in line for line in lines)] == []


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(
    ("service", "replica_id", "reason"),
    [(s.DEMO, 2, s.CAPACITY), (s.DEMO, 3, s.PROBE), (s.GATEWAY, 4, "the workload exited (run exited with code 3)")],
)
def test_a_long_reason_is_under_its_row_in_full(width: int, service: str, replica_id: int, reason: str) -> None:
    lines = render(VIEWS["status"](), width).splitlines()
    replicas = lines[lines.index("Replicas"):]
    row = next(i for i, line in enumerate(replicas) if line.startswith(f"{service} ") and
               line.split()[1] == str(replica_id))
    below = replicas[row + 1:]
    # The row's instance type may take a second line (120 columns); the note follows it.
    note = next(i for i, line in enumerate(below) if line.startswith("  └ "))
    assert all(line.startswith(" ") for line in below[:note])
    block = [below[note], *(line for line in below[note + 1:] if line.startswith("    "))]
    assert flat(reason) in flat("\n".join(block))


def test_the_circuit_breaker_reason_is_under_its_service() -> None:
    lines = render(VIEWS["status"](), 80).splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith(s.GATEWAY))
    assert flat(s.CIRCUIT) in flat("\n".join(lines[row + 1:row + 5]))


def header(text: str, title: str) -> list[str]:
    """The column headers of the table under ``title`` (a header of two words is one entry)."""
    lines = text.splitlines()
    return re.split(r" {2,}", lines[lines.index(title) + 1].strip())


@pytest.mark.parametrize(
    ("view", "title", "width", "columns"),
    [
        pytest.param("status", "Services", 80, ["NAME", "STATUS", "ENDPOINT", "REPLICAS"], id="services-80"),
        pytest.param("status", "Services", 120, ["NAME", "STATUS", "VERSION", "ENDPOINT", "POLICY", "REPLICAS"],
                     id="services-120"),
        pytest.param("status", "Services", 200, ["NAME", "STATUS", "VERSION", "ENDPOINT", "POLICY", "LB POLICY",
                                                 "REPLICAS", "AUTOSCALER"], id="services-200"),
        pytest.param("status", "Replicas", 80, ["SERVICE", "ID", "VERSION", "STATUS", "URL", "AGE"],
                     id="replicas-80"),
        pytest.param("status", "Replicas", 120, ["SERVICE", "ID", "VERSION", "STATUS", "CLOUD/REGION", "INSTANCE",
                                                 "URL", "AGE"], id="replicas-120"),
        pytest.param("history", "History of autoscaling-demo-service", 80, ["VERSION", "CREATED", "MODE", "CHANGES"],
                     id="history-80"),
        pytest.param("history", "History of autoscaling-demo-service", 120,
                     ["VERSION", "CREATED", "MODE", "FILES", "CHANGES"], id="history-120"),
        pytest.param("launch_plan", "Launch autoscaling-demo-service on aws: 2 replicas", 80,
                     ["REPLICA", "TRIES, IN ORDER"], id="launch-80"),
        pytest.param("launch_plan", "Launch autoscaling-demo-service on aws: 2 replicas", 120,
                     ["REPLICA", "MARKET", "TRIES, IN ORDER", "ZONES"], id="launch-120"),
    ],
)
def test_columns_shown(view: str, title: str, width: int, columns: list[str]) -> None:
    assert header(render(VIEWS[view](), width), title) == columns


def _replicas_header(views: list[ServiceView], width: int) -> list[str]:
    return header(render(status_renderable(views, s.NOW), width), "Replicas")


def test_version_gives_way_early_only_when_every_replica_runs_its_services_version() -> None:
    """Out of a rollout the services table says the version; during one it tells old replicas from new."""
    steady = [s.GATEWAY_VIEW, s.WEB_VIEW]
    assert "VERSION" not in _replicas_header(steady, 80) and "CLOUD/REGION" in _replicas_header(steady, 80)
    old = dataclasses.replace(s.WEB_VIEW.replicas[0], version=0)
    rolling = [s.GATEWAY_VIEW, dataclasses.replace(s.WEB_VIEW, replicas=(old,))]
    assert "VERSION" in _replicas_header(rolling, 80) and "CLOUD/REGION" not in _replicas_header(rolling, 80)


def test_a_short_reason_stays_in_its_column_when_it_fits() -> None:
    probing = dataclasses.replace(s.WEB_VIEW.replicas[0], status_reason="HTTP 503")
    text = render(status_renderable([dataclasses.replace(s.WEB_VIEW, replicas=(probing,))], s.NOW), 200)
    assert header(text, "Replicas")[-1] == "REASON" and "└" not in text.split("Replicas")[1]


def test_the_live_view_fits_the_terminal_it_is_shown_in() -> None:
    """`serve up --wait` renders the same value on every refresh; the width comes from the console."""
    renderable = status_renderable([s.DEMO_VIEW], s.NOW)
    narrow, wide = render(renderable, 80), render(renderable, 200)
    assert "CLOUD/REGION" not in narrow and "CLOUD/REGION" in wide
    assert max(map(cell_len, narrow.splitlines())) <= 80


@pytest.mark.parametrize("width", [80, 200])
def test_brackets_in_a_reason_are_text_not_markup(width: int) -> None:
    """Rich reads a str cell as markup: `[errno 111]` used to vanish from the reason."""
    refused = dataclasses.replace(s.WEB_VIEW.replicas[0], status_reason="cannot connect: [errno 111] refused")
    text = render(status_renderable([dataclasses.replace(s.WEB_VIEW, replicas=(refused,))], s.NOW), width)
    assert "cannot connect: [errno 111] refused" in text
