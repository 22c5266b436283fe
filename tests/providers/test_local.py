"""The local provider with real processes: launch, observe, terminate, and nothing left behind."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyserve_lite import procs
from skyserve_lite.clock import FakeClock, SystemClock
from skyserve_lite.providers.base import Instance, InstanceState, LaunchRequest
from skyserve_lite.providers.local import LocalProvider
from skyserve_lite.spec.parse import parse_task
from tests.providers.http import get_text as get

SERVER = "exec python3 -m http.server $PORT --bind 127.0.0.1"


def request(run: str, *, replica_id: int = 1, extra: str = "", source_dir: Path | None = None
            ) -> LaunchRequest:
    text = f"service:\n  replicas: 1\nrun: |\n  {run}\n{extra}"
    return LaunchRequest(service="svc", replica_id=replica_id, version=1, spec=parse_task(text),
                         launch_token="tok", is_spot=False,
                         source_dir=str(source_dir) if source_dir else None)


def wait_for(provider: LocalProvider, replica_id: int, state: InstanceState, timeout: float = 15) -> Instance:
    deadline = time.monotonic() + timeout
    while True:
        found = [i for i in provider.list_instances() if i.replica_id == replica_id]
        if found and found[0].state is state:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"replica {replica_id} never reached {state}: {found}")
        time.sleep(0.05)


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[LocalProvider]:
    local = LocalProvider(tmp_path / "home", SystemClock(), grace_seconds=2)
    yield local
    local.terminate([i.instance_id for i in local.list_instances()])


def test_launch_runs_setup_then_run_with_env_and_port(provider: LocalProvider, tmp_path: Path) -> None:
    extra = "envs:\n  GREETING: hello\n  COUNT: 3\nsetup: echo set-up > marker.txt\n"
    run = "echo $GREETING-$COUNT-$SKY_LITE_REPLICA_ID > env.txt; " + SERVER
    (outcome,) = provider.launch([request(run, replica_id=7, extra=extra)])
    assert outcome.instance is not None and outcome.error is None
    instance = outcome.instance
    assert instance.url is not None and instance.url.startswith("http://127.0.0.1:")
    listing = get(instance.url + "/")
    assert "env.txt" in listing and "marker.txt" in listing
    assert get(instance.url + "/env.txt").strip() == "hello-3-7"
    assert get(instance.url + "/marker.txt").strip() == "set-up"
    assert wait_for(provider, 7, InstanceState.RUNNING).instance_id == instance.instance_id


def test_launch_is_idempotent_per_replica(provider: LocalProvider) -> None:
    (first,) = provider.launch([request("sleep 30")])
    (again,) = provider.launch([request("sleep 30")])
    assert first.instance is not None and again.instance is not None
    assert again.instance.instance_id == first.instance.instance_id
    assert len(provider.list_instances()) == 1


@pytest.mark.parametrize(
    ("run", "extra", "detail"),
    [
        pytest.param("exit 3", "", "run exited with code 3", id="run-exit-code"),
        pytest.param("sleep 30", "setup: exit 5\n", "setup failed with exit code 5", id="setup-failure"),
    ],
)
def test_exits_are_observed_with_their_reason(provider: LocalProvider, run: str, extra: str,
                                              detail: str) -> None:
    provider.launch([request(run, extra=extra)])
    assert wait_for(provider, 1, InstanceState.EXITED).detail == detail


def test_terminate_kills_the_whole_process_group_and_keeps_the_log(provider: LocalProvider) -> None:
    # `run` starts a grandchild; terminating the replica must take it down too.
    (outcome,) = provider.launch([request("sleep 300 & echo started; wait")])
    assert outcome.instance is not None
    instance = wait_for(provider, 1, InstanceState.RUNNING)
    directory = next((provider._root / "svc").glob("1-*"))
    pgid = int((directory / "pid").read_text())
    provider.terminate([instance.instance_id])
    assert provider.list_instances() == []
    assert not procs._group_alive(pgid)
    log = provider.replica_log("svc", 1)
    assert log is not None and "started" in log.read_text()
    provider.terminate([instance.instance_id])  # idempotent


def test_workdir_and_file_mounts_are_copied(provider: LocalProvider, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "main.txt").write_text("from workdir")
    (project / "weights.bin").write_text("from mount")
    extra = "workdir: app\nfile_mounts:\n  /data/weights.bin: weights.bin\n"
    (outcome,) = provider.launch([request(SERVER, extra=extra, source_dir=project)])
    assert outcome.instance is not None and outcome.instance.url
    assert get(outcome.instance.url + "/main.txt") == "from workdir"
    assert get(outcome.instance.url + "/data/weights.bin") == "from mount"


def test_missing_mount_source_is_a_permanent_error_naming_the_field(provider: LocalProvider,
                                                                     tmp_path: Path) -> None:
    extra = "file_mounts:\n  /data/x: does-not-exist\n"
    (outcome,) = provider.launch([request(SERVER, extra=extra, source_dir=tmp_path)])
    assert outcome.instance is None and outcome.permanent
    assert outcome.error is not None and outcome.error.startswith("file_mounts./data/x: cannot copy")


def test_a_launch_whose_process_never_started_is_reported_exited(tmp_path: Path) -> None:
    clock = FakeClock()
    provider = LocalProvider(tmp_path / "home", clock)
    directory = tmp_path / "home" / "replicas" / "svc" / "1-abc"
    directory.mkdir(parents=True)
    (directory / "instance.json").write_text(
        '{"instance_id": "local-abc", "service": "svc", "replica_id": 1, "version": 1, '
        f'"launch_token": "t", "port": 1, "launched_at": {clock.now()}}}')
    assert provider.list_instances()[0].state is InstanceState.PENDING
    clock.advance(31)
    (instance,) = provider.list_instances()
    assert (instance.state, instance.detail) == (InstanceState.EXITED, "the process never started")


def test_release_service_removes_its_files(provider: LocalProvider) -> None:
    (outcome,) = provider.launch([request("exit 0")])
    assert outcome.instance is not None
    wait_for(provider, 1, InstanceState.EXITED)
    provider.terminate([outcome.instance.instance_id])
    provider.release_service("svc")
    assert not (provider._root / "svc").exists()
    assert provider.replica_log("svc", 1) is None
