"""Output piped to a file or another program (CliRunner's stdout is not a terminal): laid out for `COLUMNS`
when it is set, else for 200 columns, and no line ends in spaces."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from rich.cells import cell_len

from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock
from skyserve_lite.spec.parse import load_task_file
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus
from skyserve_lite.state.store import Store

from .runner import Cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "serve"
TASK = "resources:\n  infra: local\n  image_id: img-1\nservice:\n  replicas: 2\nrun: python serve.py\n"
REASON = "readiness probe failed 3 times in a row: HTTP 503 from /health after 5.0s"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """A service of two READY replicas and one NOT_READY with a long reason, whose rows are wider than 60."""
    monkeypatch.delenv("COLUMNS", raising=False)
    home = tmp_path / "home"
    task = tmp_path / "autoscaling-demo-service.yaml"
    task.write_text(TASK)
    LocalController(home, FakeClock(), start_daemon=False).create_service("autoscaling-demo-service",
                                                                          load_task_file(task))
    store = Store.open(home)
    template = ReplicaRecord(service="autoscaling-demo-service", replica_id=0, version=1, status=ReplicaStatus.READY,
                             cloud="local", launched_at=0.0, status_since=0.0, launch_token="t")
    store.add_replicas("autoscaling-demo-service", 2, template)
    store.add_replicas("autoscaling-demo-service", 1, dataclasses.replace(
        template, status=ReplicaStatus.NOT_READY, status_reason=REASON))
    store.close()
    (tmp_path / "trace.csv").write_text("time_s,qps\n0,0\n60,12\n240,0\n600,0\n")
    (tmp_path / "new.yaml").write_text(TASK.replace("img-1", "img-2"))
    return Cli(LocalController(home, FakeClock(), start_daemon=False))


def commands(tmp_path: Path) -> dict[str, list[str]]:
    return {
        "status": ["serve", "status"],
        "status-named": ["serve", "status", "autoscaling-demo-service"],
        "update-plan": ["serve", "update", "autoscaling-demo-service", str(tmp_path / "new.yaml"), "--dry-run"],
        "history": ["serve", "history", "autoscaling-demo-service"],
        "simulate": ["serve", "simulate", str(EXAMPLES / "autoscaling.yaml"), "--trace", str(tmp_path / "trace.csv")],
        "launch-plan": ["serve", "up", str(EXAMPLES / "minimal.yaml"), "--dry-run", "-n", "a-long-service-name"],
    }


COMMANDS = ["status", "status-named", "update-plan", "history", "simulate", "launch-plan"]


@pytest.mark.parametrize("columns", [None, "60", "100"])
@pytest.mark.parametrize("command", COMMANDS)
def test_no_line_ends_in_spaces(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str,
                                columns: str | None) -> None:
    """Rich pads the last column of a table too: every row used to end in up to 90 spaces."""
    if columns is not None:
        monkeypatch.setenv("COLUMNS", columns)
    code, stdout, stderr = cli(*commands(tmp_path)[command])
    assert code == 0, stderr
    assert [line for line in stdout.splitlines() if line.endswith(" ")] == []


@pytest.mark.parametrize("command", ["status", "status-named", "update-plan"])
def test_columns_sets_the_width_of_piped_output(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                command: str) -> None:
    assert max(map(cell_len, cli(*commands(tmp_path)[command])[1].splitlines())) > 60  # laid out for 200
    monkeypatch.setenv("COLUMNS", "60")
    code, stdout, stderr = cli(*commands(tmp_path)[command])
    assert code == 0, stderr
    assert max(map(cell_len, stdout.splitlines())) <= 60


@pytest.mark.parametrize("columns", [None, "", "abc", "0", "-5"])
def test_without_a_usable_columns_piped_output_is_laid_out_for_200(cli: Cli, monkeypatch: pytest.MonkeyPatch,
                                                                   columns: str | None) -> None:
    if columns is not None:
        monkeypatch.setenv("COLUMNS", columns)
    code, stdout, _ = cli("serve", "status")
    assert code == 0
    services_header = stdout.splitlines()[1].split()
    assert "AUTOSCALER" not in services_header  # a fixed policy: nothing to show
    assert services_header[5:7] == ["LB", "POLICY"]  # 119 columns: only 200 holds every column
    assert REASON in stdout.replace("\n  └ ", " ")
    monkeypatch.setenv("COLUMNS", "80")
    assert "LB POLICY" not in cli("serve", "status")[1]
