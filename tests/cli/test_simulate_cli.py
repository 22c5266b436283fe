"""`serve simulate`: the task's policy over a CSV trace, offline, as a table or JSON, and as a chart."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from skyserve_lite.api import LocalController
from skyserve_lite.cli.main import main

from .runner import Cli

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


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    # `serve simulate` never asks the controller anything; the helper wants one all the same.
    return Cli(LocalController(tmp_path / "home", start_daemon=False))


@pytest.mark.parametrize(("columns", "width"), [(None, 80), ("120", 120), ("60", 80)])
def test_plot_draws_the_chart_on_stderr_at_the_terminal_width(files: tuple[Path, Path], cli: Cli,
                                                             monkeypatch: pytest.MonkeyPatch, columns: str | None,
                                                             width: int) -> None:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    task, trace = files
    code, stdout, stderr = cli("serve", "simulate", str(task), "--trace", str(trace), "--plot")
    assert code == 0, stderr
    assert "TARGET" in stdout and "qps (0-" not in stdout  # the table stays on stdout, alone
    lines = stderr.splitlines()
    assert lines[0] == "qps (0-6)" and "replicas (1-3)" in lines
    assert max(len(line) for line in lines) == width  # the time axis spans the whole width
    # The decision at t=140 wants 2 replicas; the downscale delay (2 decisions) holds 3 for one more period.
    [two] = [line for line in lines if line.startswith("  2 |")]
    assert "v" in two
    assert any("v raw target the downscale delay holds back" in line for line in lines)


def test_plot_with_json_keeps_stdout_json(files: tuple[Path, Path], cli: Cli) -> None:
    task, trace = files
    code, stdout, stderr = cli("serve", "simulate", str(task), "--trace", str(trace), "--plot", "-o", "json")
    assert code == 0
    assert len(json.loads(stdout)["decisions"]) == 13
    assert stderr.startswith("qps (0-6)\n")


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, the first after the signature; AssertionError unless PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize(("args", "size"), [((), (1200, 600)), (("--plot-size", "801x433"), (801, 433))])
def test_plot_file_writes_a_png_of_the_asked_size(files: tuple[Path, Path], cli: Cli, tmp_path: Path,
                                                  args: tuple[str, ...], size: tuple[int, int]) -> None:
    task, trace = files
    image = tmp_path / "out.png"
    code, stdout, stderr = cli("serve", "simulate", str(task), "--trace", str(trace), "--plot-file", str(image),
                               *args)
    assert code == 0, stderr
    assert "TARGET" in stdout
    assert png_size(image.read_bytes()) == size


def test_plot_file_without_matplotlib_exits_2_saying_what_to_install(files: tuple[Path, Path], cli: Cli,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    task, trace = files
    image = tmp_path / "out.png"
    code, stdout, stderr = cli("serve", "simulate", str(task), "--trace", str(trace), "--plot-file", str(image))
    assert code == 2
    assert stderr == "Error: --plot-file needs matplotlib: pip install 'skyserve-lite[plot]'\n"
    assert stdout == "" and not image.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--plot-size", "800x600"), "--plot-size goes with --plot-file"),
        (("--plot-file", "x.png", "--plot-size", "800"), "--plot-size: expected WIDTHxHEIGHT in pixels"),
        (("--plot-file", "x.png", "--plot-size", "100x600"), "--plot-size: each side must be 200-10000 pixels"),
        (("--plot-file", "/nonexistent-directory/x.png"), "--plot-file: cannot write /nonexistent-directory/x.png"),
    ],
)
def test_bad_plot_options_exit_2(files: tuple[Path, Path], cli: Cli, args: tuple[str, ...], message: str) -> None:
    task, trace = files
    code, _stdout, stderr = cli("serve", "simulate", str(task), "--trace", str(trace), *args)
    assert code == 2
    assert message in stderr
