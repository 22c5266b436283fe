"""`serve simulate`: the task's policy over a CSV trace, offline, as a table or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from skyserve_lite.cli.main import main

TASK = """\
service:
  replica_policy:
    min_replicas: 1
    max_replicas: 3
    target_qps_per_replica: 2
    upscale_delay_seconds: 20
    downscale_delay_seconds: 40
run: python serve.py
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    task = tmp_path / "task.yaml"
    task.write_text(TASK)
    trace = tmp_path / "trace.csv"
    trace.write_text("time_s,qps\n0,6\n120,0\n240,0\n")
    return task, trace


def test_json_has_one_row_per_decision_period(files: tuple[Path, Path]) -> None:
    task, trace = files
    result = CliRunner().invoke(main, ["serve", "simulate", str(task), "--trace", str(trace), "-o", "json"])
    assert result.exit_code == 0, result.stderr
    decisions = json.loads(result.stdout)["decisions"]
    assert [d["time_s"] for d in decisions] == list(range(0, 241, 20))
    # The decision at t=0 counts the requests of [-60, 0): none yet, as in the controller.
    assert decisions[0] == {"time_s": 0, "qps": 0.0, "target_replicas": 1, "raw_target": 1, "held_back": None}
    # At t=20 the window holds 20 s of 6 qps: 120 requests / 60 s = 2 qps.
    assert decisions[1]["qps"] == 2.0
    targets = [d["target_replicas"] for d in decisions]
    # 6 qps wants 3 replicas; upscale threshold int(20 / 20) = 1 decision; downscale int(40 / 20) = 2.
    assert max(targets) == 3 and targets[-1] == 1


def test_table_and_period_override(files: tuple[Path, Path]) -> None:
    task, trace = files
    result = CliRunner().invoke(main, ["serve", "simulate", str(task), "--trace", str(trace), "--period", "60"])
    assert result.exit_code == 0
    assert "Autoscaling 1-3 replicas (2 qps/replica)" in result.stdout
    assert "TARGET" in result.stdout


@pytest.mark.parametrize(
    ("trace_text", "message"),
    [("when,qps\n0,1\n", "the header must name time_s and qps"), (None, "--trace: cannot read")],
)
def test_bad_trace_exits_2_naming_it(files: tuple[Path, Path], trace_text: str | None, message: str) -> None:
    task, trace = files
    if trace_text is None:
        trace.unlink()
    else:
        trace.write_text(trace_text)
    result = CliRunner().invoke(main, ["serve", "simulate", str(task), "--trace", str(trace)])
    assert result.exit_code == 2
    assert message in result.stderr
