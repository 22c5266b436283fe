"""Instance emulation over the fake provider: what the cloud reports running runs here, on 127.0.0.1, booted
from the version the controller stored (not from anything the instance carries)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyserve_lite.clock import SystemClock
from skyserve_lite.files.blobs import blob_store_of
from skyserve_lite.files.capture import capture_task_files
from skyserve_lite.providers import LazyProvider, make_providers
from skyserve_lite.providers.base import InstanceState, LaunchRequest, ReplicaLog
from skyserve_lite.providers.emulation import EmulatedProvider, compute_boot_request
from skyserve_lite.providers.fake import Call, FakeProvider
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import VersionRecord
from tests.providers.http import get_text as get

TASK = """\
resources:
  cloud: aws
  image_id: ami-1
service:
  replicas: 1
envs:
  GREETING: hi
workdir: app
file_mounts:
  /data/weights.txt: weights.txt
setup: echo $GREETING > ready.txt
run: exec python3 -m http.server $PORT --bind 127.0.0.1
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A task file with a relative workdir and file mount, as `serve up` stores it (absolute source path)."""
    root = tmp_path / "project"
    (root / "app").mkdir(parents=True)
    (root / "app" / "index.txt").write_text("from workdir")
    (root / "weights.txt").write_text("from mount")
    (root / "svc.yaml").write_text(TASK)
    return root


def version_of(project: Path, text: str = TASK) -> VersionRecord:
    """The version as the store holds it: its files captured into the blob store of ``project``'s sibling
    ``home`` (the state directory the emulated provider boots from)."""
    source = str(project / "svc.yaml")
    files = capture_task_files(parse_task(text), project, source, blob_store_of(project.parent / "home"))
    return VersionRecord(service="svc", version=1, text=text, source=source, created_at=0.0, mode="initial",
                         files_json=json.dumps(files.to_json()) if files is not None else None)


def request(replica_id: int) -> LaunchRequest:
    spec = parse_task("service:\n  replicas: 1\nrun: irrelevant\n")
    return LaunchRequest(service="svc", replica_id=replica_id, version=1, spec=spec, launch_token="t",
                         is_spot=False)


@pytest.fixture
def emulated(tmp_path: Path, project: Path) -> Iterator[tuple[EmulatedProvider, FakeProvider, list[tuple[str, int]]]]:
    cloud = FakeProvider(name="aws")
    asked: list[tuple[str, int]] = []

    def find_version(service: str, version: int) -> VersionRecord | None:
        asked.append((service, version))
        return version_of(project) if (service, version) == ("svc", 1) else None

    provider = EmulatedProvider(cloud, tmp_path / "home", SystemClock(), find_version)
    yield provider, cloud, asked
    provider.abandon()


def test_running_instances_boot_from_their_stored_version_and_stop_when_gone(
        emulated: tuple[EmulatedProvider, FakeProvider, list[tuple[str, int]]]) -> None:
    provider, cloud, asked = emulated
    (outcome,) = provider.launch([request(1)])
    assert outcome.instance is not None
    (instance,) = provider.list_instances()
    assert instance.url is not None and instance.url.startswith("http://127.0.0.1:")
    assert instance.instance_id == outcome.instance.instance_id
    # envs and setup, and the workdir and file mounts resolved against the task file's directory.
    assert get(instance.url + "/ready.txt") == "hi\n"
    assert get(instance.url + "/index.txt") == "from workdir"
    assert get(instance.url + "/data/weights.txt") == "from mount"
    provider.list_instances()
    assert asked == [("svc", 1)]  # looked up once, when the instance booted

    cloud.set_state(instance.instance_id, InstanceState.TERMINATED)
    assert provider.list_instances() == []
    assert provider._local.list_instances() == []


def test_an_instance_of_a_version_the_controller_does_not_know_boots_nothing(
        emulated: tuple[EmulatedProvider, FakeProvider, list[tuple[str, int]]]) -> None:
    provider, _cloud, _asked = emulated
    provider.launch([dataclasses.replace(request(1), version=7)])
    (instance,) = provider.list_instances()
    assert (instance.state, instance.url) == (InstanceState.PENDING, None)
    assert provider._local.list_instances() == []


def test_a_workload_that_cannot_start_is_reported_exited_with_the_reason(tmp_path: Path, project: Path) -> None:
    version = version_of(project)
    shutil.rmtree(blob_store_of(tmp_path / "home").root)  # the snapshot's contents are gone
    provider = EmulatedProvider(FakeProvider(name="aws"), tmp_path / "home", SystemClock(),
                                lambda _service, _version: version)
    provider.launch([request(1)])
    (instance,) = provider.list_instances()
    assert (instance.state, instance.url) == (InstanceState.EXITED, None)
    assert instance.detail is not None and "workdir: index.txt: its content" in instance.detail


def test_cloud_states_other_than_running_pass_through(tmp_path: Path, project: Path) -> None:
    cloud = FakeProvider(name="aws", initial_state=InstanceState.PENDING)
    provider = EmulatedProvider(cloud, tmp_path / "home", SystemClock(), lambda _service, _version: version_of(project))
    provider.launch([request(1)])
    (instance,) = provider.list_instances()
    assert instance.state is InstanceState.PENDING
    assert provider._local.list_instances() == []


def test_read_log_is_the_emulated_process_log_else_the_clouds(
        emulated: tuple[EmulatedProvider, FakeProvider, list[tuple[str, int]]]) -> None:
    provider, cloud, _asked = emulated
    cloud.logs[("svc", 1)] = cloud.logs[("svc", 2)] = ReplicaLog(text="console output")
    (outcome,) = provider.launch([request(1)])  # reported running at once: booted here
    assert outcome.instance is not None
    log = provider.read_log("svc", 1, outcome.instance.instance_id, "r1")
    assert log is not None and log.path is not None and log.path.name == "replica.log"
    assert log.path.is_relative_to(provider._local._root)
    # Replica 2 was never booted here: what the cloud keeps.
    assert provider.read_log("svc", 2, "i-2", "r1") == ReplicaLog(text="console output")
    assert cloud.calls_to("read_log") == [Call("read_log", ("svc", 2, "i-2", "r1"))]


def test_abandon_stops_the_emulated_processes_and_tells_the_cloud_provider(
        emulated: tuple[EmulatedProvider, FakeProvider, list[tuple[str, int]]]) -> None:
    provider, cloud, _asked = emulated
    provider.launch([request(1)])
    (instance,) = provider.list_instances()
    assert instance.url is not None
    get(instance.url + "/ready.txt")

    provider.abandon()

    assert cloud.calls_to("abandon") == [Call("abandon")]
    assert [i.state for i in provider._local.list_instances()] == [InstanceState.EXITED]


def test_the_boot_request_is_the_instances_replica_with_the_versions_task(project: Path) -> None:
    version = version_of(project)
    cloud = FakeProvider(name="aws")
    (outcome,) = cloud.launch([request(4)])
    assert outcome.instance is not None
    boot = compute_boot_request(outcome.instance, version)
    assert (boot.service, boot.replica_id, boot.version) == ("svc", 4, 1)
    assert boot.spec == version.spec and boot.spec.files is not None  # its snapshot, not a folder to read
    assert boot.launch_token == outcome.instance.instance_id


def test_make_providers_wraps_aws_in_emulation_with_the_controllers_versions(tmp_path: Path, project: Path) -> None:
    providers = make_providers(tmp_path, SystemClock(), "c1", {"SKY_LITE_EMULATE_INSTANCES": "1"},
                               find_version=lambda _service, _version: version_of(project))
    aws = providers["aws"]
    assert isinstance(aws, LazyProvider) and isinstance(aws.provider, EmulatedProvider)
    assert aws.provider._find_version("svc", 1) == version_of(project)


def test_cloud_providers_are_built_on_first_use_and_abandoning_one_never_built_builds_nothing(
        tmp_path: Path) -> None:
    code = ("import sys; from pathlib import Path; from skyserve_lite.clock import SystemClock; "
            "from skyserve_lite.providers import make_providers; "
            f"p = make_providers(Path({str(tmp_path)!r}), SystemClock(), 'c1'); "
            "p['aws'].abandon(); p['gcp'].abandon(); "
            "print(sorted(p), 'boto3' in sys.modules, 'google.cloud.compute_v1' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["['aws',", "'gcp',", "'local']", "False", "False"]


def test_an_emulated_instance_gets_a_bare_environment_tagged_with_the_state_directory(
        tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "t0ken")
    monkeypatch.setenv("HF_HOME", "/models")
    monkeypatch.setenv("SKY_LITE_REPLICA_ENV_PASSTHROUGH", "HF_HOME")
    text = TASK.replace("run: exec", "run: env > env.txt; exec")
    provider = EmulatedProvider(FakeProvider(name="aws"), tmp_path / "home", SystemClock(),
                                lambda _service, _version: version_of(project, text))
    try:
        provider.launch([request(1)])
        (instance,) = provider.list_instances()
        assert instance.url is not None
        env = dict(line.split("=", 1) for line in get(instance.url + "/env.txt").splitlines() if "=" in line)
    finally:
        provider.abandon()
    assert "AWS_SECRET_ACCESS_KEY" not in env and "AWS_SESSION_TOKEN" not in env
    assert (env["GREETING"], env["HF_HOME"], env["SKY_LITE_REPLICA_ID"]) == ("hi", "/models", "1")
    assert env["SKY_LITE_HOME"] == str(tmp_path / "home")
    assert env["SKY_LITE_REPLICA_DIR"].startswith(str(tmp_path / "home" / "emulated" / "aws" / "replicas" / "svc"))
