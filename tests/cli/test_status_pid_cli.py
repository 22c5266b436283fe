"""`serve status NAME --replica-id N --pid`: the README's "A replica dies" recipe, which must name a live
replica or no one."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from skyserve_lite import procs
from skyserve_lite.cli.main import main
from skyserve_lite.clock import SystemClock
from skyserve_lite.providers.base import LaunchRequest
from skyserve_lite.providers.local import PID_FILE, LocalProvider
from skyserve_lite.spec.parse import parse_task


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def provider(home: Path) -> Iterator[LocalProvider]:
    local = LocalProvider(home, SystemClock(), grace_seconds=1)
    yield local
    local.abandon()


def run(home: Path, *args: str) -> tuple[int, str, str]:
    """The command as a person runs it: this machine's state directory, no controller passed in."""
    result = CliRunner().invoke(main, ["serve", "status", *args], env={"SKY_LITE_HOME": str(home),
                                                                       "SKY_LITE_CONTROLLER": None})
    return result.exit_code, result.stdout, result.stderr


def launch(provider: LocalProvider, replica_id: int) -> str:
    spec = parse_task("service:\n  replicas: 1\nrun: sleep 300\n")
    (outcome,) = provider.launch([LaunchRequest(service="web", replica_id=replica_id, version=1, spec=spec,
                                                launch_token="tok", is_spot=False)])
    assert outcome.instance is not None
    (directory,) = (provider._root / "web").glob(f"{replica_id}-*")
    deadline = time.monotonic() + 15
    while procs.read_pid_file(directory / PID_FILE) is None:
        assert time.monotonic() < deadline, "the supervisor never wrote its pid"
        time.sleep(0.05)
    return outcome.instance.instance_id


def test_pid_prints_the_process_group_of_the_running_replica(home: Path, provider: LocalProvider) -> None:
    launch(provider, 1)
    launch(provider, 2)

    code, stdout, stderr = run(home, "web", "--replica-id", "2", "--pid")

    assert (code, stderr) == (0, "")
    pid = int(stdout)
    (directory,) = (provider._root / "web").glob("2-*")
    assert procs.read_pid_file(directory / PID_FILE) == procs.RecordedProcess.of(pid)
    assert os.getpgid(pid) == pid  # `kill -- -PID` signals the replica's whole process group


def test_pid_of_a_terminated_replica_names_no_one(home: Path, provider: LocalProvider) -> None:
    instance_id = launch(provider, 1)
    provider.terminate([instance_id])

    code, stdout, stderr = run(home, "web", "--replica-id", "1", "--pid")

    assert (code, stdout) == (1, "")
    assert stderr == (f"Error: replica 1 of web has no running process on this machine (--pid reads the local "
                      f"replicas in {home.resolve() / 'replicas'})\n")


def test_pid_of_a_replica_whose_pid_another_process_took_names_no_one(home: Path, provider: LocalProvider) -> None:
    launch(provider, 1)
    (directory,) = (provider._root / "web").glob("1-*")
    # The file as it was before the replica ended, with the pid of another process now (this test's own).
    (directory / PID_FILE).write_text(f"{os.getpid()} {(procs.process_start_time(os.getpid()) or 0) + 1}\n")

    code, stdout, _stderr = run(home, "web", "--replica-id", "1", "--pid")

    assert (code, stdout) == (1, "")


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["web", "--pid"], "--pid and --replica-id go together", id="pid-alone"),
    pytest.param(["web", "--replica-id", "1"], "--pid and --replica-id go together", id="replica-id-alone"),
    pytest.param(["--replica-id", "1", "--pid"], "--pid prints one replica's pid: name exactly one service",
                 id="no-name"),
    pytest.param(["web", "api", "--replica-id", "1", "--pid"],
                 "--pid prints one replica's pid: name exactly one service", id="two-names"),
    pytest.param(["web", "--replica-id", "1", "--pid", "--endpoint"], "pass at most one of --endpoint and --pid",
                 id="with-endpoint"),
])
def test_pid_usage_errors_exit_2_and_write_nothing(home: Path, args: list[str], message: str) -> None:
    code, stdout, stderr = run(home, *args)

    assert (code, stdout) == (2, "")
    assert stderr.startswith(f"Error: {message}") and stderr.count("\n") == 1
    assert not home.exists()


def test_pid_of_a_name_that_is_no_service_name_looks_nowhere(home: Path, tmp_path: Path) -> None:
    # A replica directory outside `replicas/` that a path-like name would reach.
    outside = tmp_path / "1-x"
    outside.mkdir()
    (outside / "instance.json").write_text("{}")
    (outside / PID_FILE).write_text(procs.RecordedProcess.of(os.getpid()).to_text())

    code, stdout, _stderr = run(home, "../..", "--replica-id", "1", "--pid")

    assert (code, stdout) == (1, "")
