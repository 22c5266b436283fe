"""Errors about what was typed are one line that names the thing at fault once: the option, or the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock

from .runner import Cli

TASK = "service:\n  replicas: 1\nrun: echo hi\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("SKY_LITE_HOME", str(home))
    return home


@pytest.fixture
def cli(home: Path) -> Cli:
    return Cli(LocalController(home, FakeClock(), start_daemon=False))


def test_an_unknown_infra_cloud_is_the_line_the_option_names(cli: Cli, home: Path, tmp_path: Path) -> None:
    task = tmp_path / "svc.yaml"
    task.write_text(TASK)

    code, stdout, stderr = cli("serve", "up", str(task), "--infra", "asw")

    assert (code, stdout, stderr) == (2, "", "Error: --infra: unknown cloud 'asw'; expected one of: local, aws, gcp\n")
    assert not (home / "state.db").exists()  # refused before anything was stored


@pytest.mark.parametrize(("infra", "problem"), [
    pytest.param("oci", "cloud 'oci' is not offered by sky-lite", id="not-offered"),
    pytest.param("local/here", "'local/here': the local cloud has no regions or zones", id="local-region"),
    pytest.param("aws//x", "must look like CLOUD, CLOUD/REGION or CLOUD/REGION/ZONE", id="shape"),
    pytest.param("aws/us-east-1/eu-west-1a", "zone 'eu-west-1a' is not in region 'us-east-1'", id="zone"),
])
@pytest.mark.parametrize("command", [["serve", "up"], ["serve", "up", "--dry-run"], ["serve", "update", "svc"]],
                         ids=["up", "up-dry-run", "update"])
def test_every_bad_infra_is_one_line_naming_the_option_once(cli: Cli, home: Path, tmp_path: Path, infra: str,
                                                            problem: str, command: list[str]) -> None:
    task = tmp_path / "svc.yaml"
    task.write_text(TASK)

    code, stdout, stderr = cli(*command, str(task), "--infra", infra)

    assert (code, stdout) == (2, "")
    assert stderr.startswith(f"Error: --infra: {problem}") and stderr.endswith("\n") and stderr.count("\n") == 1
    assert stderr.count("--infra") == 1 and "command line" not in stderr
    assert not (home / "state.db").exists()


@pytest.mark.parametrize(("make", "reason"), [
    pytest.param(lambda tmp: tmp / "nope.yaml", "No such file or directory", id="missing"),
    pytest.param(lambda tmp: tmp / "nowhere" / "nope.yaml", "No such file or directory", id="missing-directory"),
])
@pytest.mark.parametrize("command", [["serve", "up"], ["serve", "update", "svc"]], ids=["up", "update"])
def test_an_unreadable_task_file_is_one_line_naming_it_once(cli: Cli, home: Path, tmp_path: Path, make: object,
                                                            reason: str, command: list[str]) -> None:
    assert callable(make)
    path: Path = make(tmp_path)

    code, stdout, stderr = cli(*command, str(path))

    assert (code, stdout, stderr) == (2, "", f"Error: {path}: cannot read the file: {reason}\n")
