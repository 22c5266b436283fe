"""A local replica's ``pid`` file names the replica or no one: it records the process's start time, every
reader checks it before acting on the pid, and it goes when the replica is terminated."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from skyserve_lite import procs
from skyserve_lite.clock import SystemClock
from skyserve_lite.forcedown import find_recorded_replica_pids
from skyserve_lite.providers.base import InstanceState, LaunchRequest
from skyserve_lite.providers.local import PID_FILE, LocalProvider, find_live_replica, find_recorded_process
from skyserve_lite.spec.parse import parse_task


def launch(provider: LocalProvider, replica_id: int = 1) -> str:
    """Start a replica that runs until stopped; its instance id once its supervisor recorded its pid."""
    spec = parse_task("service:\n  replicas: 1\nrun: sleep 300\n")
    (outcome,) = provider.launch([LaunchRequest(service="svc", replica_id=replica_id, version=1, spec=spec,
                                                launch_token="tok", is_spot=False)])
    assert outcome.instance is not None
    wait_until(lambda: procs.read_pid_file(replica_directory(provider, replica_id) / PID_FILE) is not None)
    return outcome.instance.instance_id


def replica_directory(provider: LocalProvider, replica_id: int = 1) -> Path:
    (directory,) = (provider._root / "svc").glob(f"{replica_id}-*")
    return directory


def wait_until(condition: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[LocalProvider]:
    local = LocalProvider(tmp_path / "home", SystemClock(), grace_seconds=1)
    yield local
    local.abandon()


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process of nobody's replica, leading a process group of its own: what a replica's pid may belong
    to once the replica ended and the pid space wrapped."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


# The ways a pid file can name the stranger: as an older sky-lite wrote it (the pid alone), or with a start
# time that is not the stranger's (the replica's, which ended).
STALE_RECORDS: list[Callable[[int], str]] = [
    lambda pid: f"{pid}\n",
    lambda pid: f"{pid} {(procs.process_start_time(pid) or 0) + 1}\n",
]
STALE_IDS = ["pid-only", "other-start-time"]


def test_the_supervisor_records_its_pid_and_start_time(provider: LocalProvider) -> None:
    launch(provider)
    recorded = procs.read_pid_file(replica_directory(provider) / PID_FILE)
    assert recorded is not None
    process = procs.find_process(recorded.pid)
    assert process is not None and recorded.start_time == process.start_time
    assert process.pgid == recorded.pid  # the leader of the replica's process group


def test_terminate_removes_the_pid_file_once_the_process_is_gone(provider: LocalProvider) -> None:
    instance_id = launch(provider)
    directory = replica_directory(provider)
    recorded = procs.read_pid_file(directory / PID_FILE)
    assert recorded is not None and recorded.is_alive()

    provider.terminate([instance_id])

    assert not recorded.is_alive()
    assert not (directory / PID_FILE).exists()
    assert (directory / "replica.log").exists()  # the log stays for `serve logs`


@pytest.mark.parametrize("stale", STALE_RECORDS, ids=STALE_IDS)
def test_terminate_does_not_signal_a_process_that_took_the_recorded_pid(
        provider: LocalProvider, stranger: subprocess.Popen[bytes], stale: Callable[[int], str]) -> None:
    instance_id = launch(provider)
    directory = replica_directory(provider)
    (directory / PID_FILE).write_text(stale(stranger.pid))

    provider.terminate([instance_id])

    assert stranger.poll() is None, "the stranger's process group was signalled"
    assert not (directory / PID_FILE).exists()  # naming a process that is not the replica: gone too
    assert provider.list_instances() == []


@pytest.mark.parametrize("stale", STALE_RECORDS, ids=STALE_IDS)
def test_a_replica_whose_pid_another_process_took_is_not_running(
        provider: LocalProvider, stranger: subprocess.Popen[bytes], stale: Callable[[int], str]) -> None:
    launch(provider)
    directory = replica_directory(provider)
    recorded = procs.read_pid_file(directory / PID_FILE)
    assert recorded is not None
    os.killpg(recorded.pid, signal.SIGKILL)  # the replica ends without a word (no exit_code)...
    wait_until(lambda: not recorded.is_alive())
    (directory / PID_FILE).write_text(stale(stranger.pid))  # ...and its pid is another process's now

    (instance,) = provider.list_instances()

    assert (instance.state, instance.detail) == (InstanceState.EXITED, "killed by a signal")
    assert find_recorded_process(directory) is None
    assert find_live_replica(provider._root, "svc", 1) is None
    assert stranger.pid not in find_recorded_replica_pids(provider._root.parent)


def test_find_live_replica_names_the_running_replica_only(provider: LocalProvider) -> None:
    home = provider._root
    assert find_live_replica(home, "svc", 1) is None  # not launched
    instance_id = launch(provider)
    recorded = procs.read_pid_file(replica_directory(provider) / PID_FILE)

    found = find_live_replica(home, "svc", 1)

    assert found is not None and found == recorded
    assert os.getpgid(found.pid) == found.pid  # the leader of the replica's process group: kill -- -PID
    assert find_live_replica(home, "svc", 2) is None
    assert find_live_replica(home, "other", 1) is None
    provider.terminate([instance_id])
    assert find_live_replica(home, "svc", 1) is None
