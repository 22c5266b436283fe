"""The local provider with real processes: launch, observe, terminate, and nothing left behind."""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skyserve_lite import procs, supervisor
from skyserve_lite.clock import FakeClock, SystemClock
from skyserve_lite.errors import TransientProviderError, UsageError
from skyserve_lite.files.blobs import BlobStore, blob_store_of
from skyserve_lite.files.capture import capture_task_files
from skyserve_lite.logview import find_line_time
from skyserve_lite.providers.base import Instance, InstanceState, LaunchRequest, Phase, ReplicaLog
from skyserve_lite.providers.local import (
    PASSTHROUGH_SETTING,
    REPLICAS_DIR_SETTING,
    TAG_REPLICA_DIR,
    LocalProvider,
    compute_replica_env,
    find_replica_processes,
    find_replicas_dir,
    parse_env_passthrough,
)
from skyserve_lite.spec.parse import parse_task
from tests.providers.http import get_text as get

SERVER = "exec python3 -m http.server $PORT --bind 127.0.0.1"


def request(run: str, *, replica_id: int = 1, extra: str = "", source_dir: Path | None = None,
            blobs: BlobStore | None = None) -> LaunchRequest:
    """A launch of a task; with ``source_dir`` its workdir and file mounts are captured into ``blobs`` as a
    submission would (the provider builds the replica from that snapshot)."""
    text = f"service:\n  replicas: 1\nrun: |\n  {run}\n{extra}"
    spec = parse_task(text)
    if source_dir is not None:
        assert blobs is not None
        spec = dataclasses.replace(spec, files=capture_task_files(spec, source_dir, "<test>", blobs))
    return LaunchRequest(service="svc", replica_id=replica_id, version=1, spec=spec, launch_token="tok",
                         is_spot=False)


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


def test_a_running_replica_reports_whether_it_runs_setup_or_run(provider: LocalProvider, tmp_path: Path) -> None:
    release = tmp_path / "release"
    extra = f"setup: while [ ! -e {release} ]; do sleep 0.05; done\n"
    (outcome,) = provider.launch([request(SERVER, replica_id=3, extra=extra)])
    assert outcome.instance is not None
    deadline = time.monotonic() + 15
    while wait_for(provider, 3, InstanceState.RUNNING).phase is not Phase.SETUP:
        assert time.monotonic() < deadline, "the replica never reported its setup"
        time.sleep(0.05)
    release.touch()
    while wait_for(provider, 3, InstanceState.RUNNING).phase is not Phase.RUN:
        assert time.monotonic() < deadline, "the replica never reported its run"
        time.sleep(0.05)


def test_launch_is_idempotent_per_replica(provider: LocalProvider) -> None:
    (first,) = provider.launch([request("sleep 30")])
    (again,) = provider.launch([request("sleep 30")])
    assert first.instance is not None and again.instance is not None
    assert again.instance.instance_id == first.instance.instance_id
    assert len(provider.list_instances()) == 1


def test_two_homes_naming_one_replicas_dir_list_and_adopt_each_others_replicas(tmp_path: Path) -> None:
    """Two controllers on one machine sharing a database: the one that takes a service over lists the
    replica the other launched, a launch of the same replica adopts it instead of starting a second, and
    it can terminate it."""
    shared = tmp_path / "replicas"
    environ = {REPLICAS_DIR_SETTING: str(shared)}
    first = LocalProvider(tmp_path / "home0", SystemClock(), grace_seconds=2,
                          replicas_dir=find_replicas_dir(tmp_path / "home0", environ))
    second = LocalProvider(tmp_path / "home1", SystemClock(), grace_seconds=2,
                           replicas_dir=find_replicas_dir(tmp_path / "home1", environ))
    try:
        (launched,) = first.launch([request("sleep 30")])
        assert launched.instance is not None

        assert [i.instance_id for i in second.list_instances()] == [launched.instance.instance_id]
        (adopted,) = second.launch([request("sleep 30")])
        assert adopted.instance is not None and adopted.instance.instance_id == launched.instance.instance_id
        assert len(list(shared.glob("svc/*/instance.json"))) == 1  # one replica directory, in the shared one
        assert not (tmp_path / "home0" / "replicas").exists() and not (tmp_path / "home1" / "replicas").exists()
        second.terminate([launched.instance.instance_id])
        assert first.list_instances() == []
    finally:
        for provider in (first, second):
            provider.terminate([i.instance_id for i in provider.list_instances()])


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({}, "home/replicas", id="unset: below the home"),
        pytest.param({REPLICAS_DIR_SETTING: ""}, "home/replicas", id="empty: below the home"),
        pytest.param({REPLICAS_DIR_SETTING: "{tmp}/shared"}, "shared", id="absolute: that directory"),
    ],
)
def test_find_replicas_dir(tmp_path: Path, environ: dict[str, str], expected: str) -> None:
    filled = {key: value.replace("{tmp}", str(tmp_path)) for key, value in environ.items()}
    assert find_replicas_dir(tmp_path / "home", filled) == Path(os.path.realpath(tmp_path)) / expected


def test_a_relative_replicas_dir_is_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=f"{REPLICAS_DIR_SETTING}='shared': give an absolute directory"):
        find_replicas_dir(tmp_path / "home", {REPLICAS_DIR_SETTING: "shared"})


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
    pgid = int((directory / "pid").read_text().split()[0])
    provider.terminate([instance.instance_id])
    assert provider.list_instances() == []
    assert not procs._group_alive(pgid)
    log = provider.read_log("svc", 1, instance.instance_id, None)
    assert log is not None and log.path is not None and log.text is None
    assert "started" in log.path.read_text()
    provider.terminate([instance.instance_id])  # idempotent


def test_workdir_and_file_mounts_come_from_the_snapshot_not_the_disk(provider: LocalProvider, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "app" / "empty").mkdir(parents=True)
    (project / "app" / "main.txt").write_text("from workdir")
    (project / "app" / "tool.sh").write_text("#!/bin/sh\n")
    (project / "app" / "tool.sh").chmod(0o755)
    os.symlink("main.txt", project / "app" / "link.txt")
    (project / "weights.bin").write_text("from mount")
    extra = "workdir: app\nfile_mounts:\n  /data/weights.bin: weights.bin\n"
    launch = request(SERVER, extra=extra, source_dir=project, blobs=blob_store_of(tmp_path / "home"))
    # Edited after the submission: the replica still gets what was captured.
    (project / "app" / "main.txt").write_text("edited later")
    (outcome,) = provider.launch([launch])
    assert outcome.instance is not None and outcome.instance.url
    assert get(outcome.instance.url + "/main.txt") == "from workdir"
    assert get(outcome.instance.url + "/link.txt") == "from workdir"
    assert get(outcome.instance.url + "/data/weights.bin") == "from mount"
    (workdir,) = (tmp_path / "home" / "replicas" / "svc").glob("1-*/workdir")
    assert (workdir / "empty").is_dir() and os.readlink(workdir / "link.txt") == "main.txt"
    assert (workdir / "tool.sh").stat().st_mode & 0o777 == 0o755


def test_a_version_without_a_snapshot_of_its_files_is_refused_naming_the_field(provider: LocalProvider) -> None:
    (outcome,) = provider.launch([request(SERVER, extra="workdir: app\n")])
    assert outcome.instance is None and outcome.permanent
    assert outcome.error is not None and outcome.error.startswith("workdir: version 1 has no snapshot")


def test_a_blob_missing_from_the_store_is_a_permanent_error_naming_the_field(provider: LocalProvider,
                                                                             tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("x")
    blobs = blob_store_of(tmp_path / "home")
    launch = request(SERVER, extra="file_mounts:\n  /data/x: x.txt\n", source_dir=tmp_path, blobs=blobs)
    shutil.rmtree(blobs.root)
    (outcome,) = provider.launch([launch])
    assert outcome.instance is None and outcome.permanent
    assert outcome.error is not None and outcome.error.startswith("file_mounts./data/x:")
    assert "missing from the snapshot store" in outcome.error


def test_a_mount_under_a_workdir_symlink_that_leaves_the_replica_is_refused(provider: LocalProvider,
                                                                            tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "app").mkdir()
    os.symlink(outside, tmp_path / "app" / "data")  # recorded as a link, never followed
    (tmp_path / "x.txt").write_text("x")
    extra = "workdir: app\nfile_mounts:\n  /data/x.txt: x.txt\n"
    launch = request(SERVER, extra=extra, source_dir=tmp_path, blobs=blob_store_of(tmp_path / "home"))
    (outcome,) = provider.launch([launch])
    assert outcome.instance is None and outcome.permanent
    assert outcome.error is not None and "would land outside the replica's directory" in outcome.error
    assert list(outside.iterdir()) == []


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
    assert provider.read_log("svc", 1, None, None) is None
    provider.release_service("svc")  # idempotent


def test_read_log_is_the_newest_log_of_the_replica_and_grows_while_it_runs(provider: LocalProvider) -> None:
    assert provider.read_log("svc", 1, None, None) is None
    (outcome,) = provider.launch([request("echo one; sleep 1; echo two; sleep 30")])
    assert outcome.instance is not None
    log = provider.read_log("svc", 1, outcome.instance.instance_id, None)
    assert log is not None and log.path is not None
    deadline = time.monotonic() + 10
    while "two" not in log.path.read_text():
        assert time.monotonic() < deadline, log.path.read_text()
        time.sleep(0.05)
    assert provider.read_log("svc", 2, None, None) is None


@pytest.mark.skipif(not supervisor.is_supported(), reason="only the supervisor stamps lines")
def test_every_line_of_setup_and_run_is_in_the_log_with_its_utc_time(provider: LocalProvider) -> None:
    before = time.time()
    provider.launch([request("echo run-out; echo run-err >&2; exit 4",
                             extra="setup: echo setup-out; echo setup-err >&2\n")])
    wait_for(provider, 1, InstanceState.EXITED)
    log = provider.read_log("svc", 1, None, None)
    assert log is not None and log.path is not None
    lines = log.path.read_bytes().splitlines()
    assert [line[25:] for line in lines] == [b"setup-out", b"setup-err", b"run-out", b"run-err",
                                             b"sky-lite: run exited with code 4"]
    times = [find_line_time(line) for line in lines]
    assert all(t is not None and before - 0.01 <= t <= time.time() for t in times), lines


@pytest.mark.parametrize("example", ["minimal", "autoscaling", "probe_post"])
def test_the_examples_leave_readiness_probes_out_of_their_access_log(provider: LocalProvider, example: str) -> None:
    import urllib.request

    from skyserve_lite.controller.probe import PROBE_USER_AGENT
    from skyserve_lite.spec.parse import load_task_file

    spec = load_task_file(Path(__file__).parents[2] / "examples" / "serve" / f"{example}.yaml").spec
    (outcome,) = provider.launch([dataclasses.replace(request("true"), spec=spec)])
    assert outcome.instance is not None and outcome.instance.url is not None
    url = outcome.instance.url + "/"
    get(url)  # once it listens: one request of a user
    with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": PROBE_USER_AGENT}), timeout=5):
        pass
    get(url)  # a second: the log has it once the probe's line, had there been one, is there too
    log = provider.read_log("svc", 1, None, None)
    assert log is not None and log.path is not None
    deadline = time.monotonic() + 10
    while log.path.read_text().count('"GET / HTTP/1.1" 200') < 2:
        assert time.monotonic() < deadline, log.path.read_text()
        time.sleep(0.05)
    assert log.path.read_text().count('"GET / HTTP/1.1" 200') == 2


def test_abandon_stops_the_processes_it_started_after_the_state_directory_is_gone(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "home", SystemClock(), grace_seconds=2)
    (outcome,) = provider.launch([request("sleep 300")])
    assert outcome.instance is not None
    directory = wait_for_directory(provider)
    pgid = int((directory / "pid").read_text().split()[0])
    shutil.rmtree(tmp_path / "home")  # the state directory, bookkeeping files included
    assert provider.list_instances() == []  # nothing else can find the process now

    provider.abandon()

    assert not procs._group_alive(pgid)
    provider.abandon()  # idempotent


def wait_for_directory(provider: LocalProvider, timeout: float = 15) -> Path:
    """The replica directory of replica 1 once its wrapper wrote its pid."""
    deadline = time.monotonic() + timeout
    while True:
        found = [d for d in (provider._root / "svc").glob("1-*") if (d / "pid").exists()]
        if found:
            return found[0]
        assert time.monotonic() < deadline, "the wrapper never wrote its pid"
        time.sleep(0.05)


# --- errors: OSError becomes an outcome naming the field, or a transient error ----------------------
def _fail(error: OSError) -> Callable[..., Any]:
    def fail(*_args: object, **_kwargs: object) -> Any:
        raise error
    return fail


def _no_space(*_args: object, **_kwargs: object) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def _mount_on_a_mounted_file(tmp_path: Path, _monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "b.txt").write_text("b")
    return "file_mounts:\n  /data: a.txt\n  /data/b.txt: b.txt\n"


def _replica_root_is_a_file(tmp_path: Path, _monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "home" / "replicas").mkdir(parents=True)
    (tmp_path / "home" / "replicas" / "svc").write_text("not a directory")
    return ""


def _disk_full_when_writing_the_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    write_text = Path.write_text

    def full(path: Path, *args: Any, **kwargs: Any) -> int:
        if path.name == "setup.sh":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    return "setup: echo hi\n"


def _disk_full_when_spawning(_tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(procs, "spawn_detached", _no_space)
    return ""


def _mount_on_the_providers_own_file(tmp_path: Path, _monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "x").write_text("x")
    return "file_mounts:\n  /run.sh/x: x\n"


@pytest.mark.parametrize(("arrange", "message", "others_launch", "permanent"), [
    pytest.param(_mount_on_a_mounted_file, "file_mounts./data/b.txt: cannot write the snapshot: File exists", True,
                 True, id="mount-onto-a-mounted-file"),
    pytest.param(_mount_on_the_providers_own_file, "file_mounts./run.sh/x: lands on run.sh", True, True,
                 id="own-file"),
    # A full disk is the machine's shortage, not the task's fault: retried, and no strike for the breaker.
    pytest.param(_disk_full_when_writing_the_setup, "setup: No space left on device", False, False,
                 id="disk-full-setup"),
    pytest.param(_disk_full_when_spawning, "run: cannot start bash: No space left on device", False, False,
                 id="disk-full-spawn"),
    pytest.param(_replica_root_is_a_file, "replica directory", False, True, id="replica-root-is-a-file"),
])
def test_a_launch_failing_with_an_os_error_is_an_outcome_naming_the_field_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arrange: Callable[[Path, pytest.MonkeyPatch], str],
        message: str, others_launch: bool, permanent: bool) -> None:
    provider = LocalProvider(tmp_path / "home", SystemClock(), grace_seconds=2)
    extra = arrange(tmp_path, monkeypatch)
    failed, other = provider.launch([request(SERVER, extra=extra, source_dir=tmp_path,
                                             blobs=blob_store_of(tmp_path / "home")),
                                     request("sleep 30", replica_id=2)])
    monkeypatch.undo()

    assert failed.instance is None and failed.permanent is permanent
    assert failed.error is not None and message in failed.error, failed.error
    service_root = provider._root / "svc"
    assert not service_root.is_dir() or not list(service_root.glob("1-*"))  # the half-made directory is gone
    # The batch's other request is launched all the same (it fails too where every launch would).
    assert (other.instance is not None) is others_launch
    assert [i.replica_id for i in provider.list_instances()] == ([2] if others_launch else [])
    provider.terminate([i.instance_id for i in provider.list_instances()])


def _break_liveness(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs, "is_alive", _fail(OSError(errno.EIO, "Input/output error")))


def _break_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs, "terminate_groups", _fail(PermissionError(errno.EPERM, "not allowed")))
    monkeypatch.setattr(procs, "stop_processes", _fail(PermissionError(errno.EPERM, "not allowed")))


def _break_removal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "rmtree", _fail(OSError(errno.EBUSY, "Device or resource busy")))


@pytest.mark.parametrize(("call", "arrange", "message"), [
    pytest.param(lambda p, i: p.list_instances(), _break_liveness, "list_instances: Input/output error",
                 id="list_instances"),
    pytest.param(lambda p, i: p.launch([request("sleep 30", replica_id=2)]), _break_liveness,
                 "Input/output error", id="launch-inventory"),
    pytest.param(lambda p, i: p.terminate([i.instance_id]), _break_signals, "terminate: not allowed",
                 id="terminate"),
    pytest.param(lambda p, i: p.release_service("svc"), _break_removal, "release_service: Device or resource busy",
                 id="release_service"),
    pytest.param(lambda p, i: p.abandon(), _break_signals, "abandon: not allowed", id="abandon"),
])
def test_other_os_errors_are_transient_provider_errors(
        provider: LocalProvider, monkeypatch: pytest.MonkeyPatch, call: Callable[[LocalProvider, Instance], object],
        arrange: Callable[[pytest.MonkeyPatch], None], message: str) -> None:
    provider.launch([request("sleep 30")])
    instance = wait_for(provider, 1, InstanceState.RUNNING)
    arrange(monkeypatch)
    with pytest.raises(TransientProviderError, match=message) as raised:
        call(provider, instance)
    assert isinstance(raised.value.__cause__, OSError)


def test_read_log_translates_an_unreadable_log(provider: LocalProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    provider.launch([request("sleep 30")])
    stat = Path.stat

    def failing_disk(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path.name == "replica.log":
            raise OSError(errno.EIO, "Input/output error", str(path))
        return stat(path, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", failing_disk)
    with pytest.raises(TransientProviderError, match="read_log: Input/output error"):
        provider.read_log("svc", 1, None, None)
    monkeypatch.undo()
    assert provider.read_log("svc", 1, None, None) == ReplicaLog(path=next((provider._root / "svc").glob("1-*"))
                                                                 / "replica.log")


# --- the replica's environment: the task's, not the controller's ---------------------------------------
def read_env_dump(directory: Path, timeout: float = 15) -> dict[str, str]:
    """The environment a replica's `run` saw, as `env -0 > env.dump` wrote it (the rename makes it whole)."""
    deadline = time.monotonic() + timeout
    while not (directory / "env.dump").exists():
        assert time.monotonic() < deadline, "the replica never dumped its environment"
        time.sleep(0.05)
    items = (directory / "env.dump").read_bytes().decode().split("\0")
    return dict(item.split("=", 1) for item in items if item)


DUMP_ENV = "env -0 > env.tmp && mv env.tmp env.dump; exec sleep 300"


def test_a_replica_gets_the_task_env_a_bare_base_and_the_passthrough_but_no_controller_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "t0ken")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("LC_TIME", "C")
    monkeypatch.setenv("HF_HOME", "/models")
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    monkeypatch.setenv(PASSTHROUGH_SETTING, "HF_HOME, PIP_INDEX_URL,UNSET_ONE")
    provider = LocalProvider(tmp_path / "home", SystemClock(), grace_seconds=2)
    try:
        (outcome,) = provider.launch([request(DUMP_ENV, replica_id=3, extra="envs:\n  GREETING: hi\n")])
        assert outcome.instance is not None
        directory = next((provider._root / "svc").glob("3-*"))
        env = read_env_dump(directory)
    finally:
        provider.abandon()
    assert "AWS_SECRET_ACCESS_KEY" not in env and "AWS_SESSION_TOKEN" not in env
    assert "s3cr3t" not in (directory / "env.dump").read_text()
    assert {name: env[name] for name in ("PATH", "HOME", "LANG", "LC_TIME")} == {
        name: os.environ[name] for name in ("PATH", "HOME", "LANG", "LC_TIME")}
    assert (env["HF_HOME"], env["PIP_INDEX_URL"]) == ("/models", "https://mirror.example/simple")
    assert (env["GREETING"], env["SKY_LITE_REPLICA_ID"], env["SKY_LITE_SERVICE"]) == ("hi", "3", "svc")
    assert outcome.instance.url == f"http://127.0.0.1:{env['PORT']}"
    assert (env["SKY_LITE_HOME"], env[TAG_REPLICA_DIR]) == (str(tmp_path / "home"), str(directory))
    own = {"PORT", "SKY_LITE_REPLICA_ID", "SKY_LITE_SERVICE", "SKY_LITE_HOME", TAG_REPLICA_DIR}
    base = {"PATH", "HOME", "LANG", "TMPDIR"}
    # Nothing else (bash adds PWD, OLDPWD, SHLVL and `_` itself).
    bash = {"PWD", "OLDPWD", "SHLVL", "_"}
    assert set(env) - own - base - bash - {"GREETING", "HF_HOME", "PIP_INDEX_URL"} == {
        name for name in env if name.startswith("LC_")}


@pytest.mark.parametrize(("environ", "passthrough", "envs", "expected"), [
    pytest.param({"PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "x", "USER": "me"}, (), {}, {"PATH": "/bin"},
                 id="only-the-base"),
    pytest.param({}, (), {}, {"PATH": os.defpath}, id="no-path-gets-the-default"),
    pytest.param({"PATH": "/bin", "LC_ALL": "C", "LCX": "no"}, (), {}, {"PATH": "/bin", "LC_ALL": "C"},
                 id="locale"),
    pytest.param({"PATH": "/bin", "TOKEN": "a"}, ("TOKEN", "MISSING"), {}, {"PATH": "/bin", "TOKEN": "a"},
                 id="passthrough"),
    pytest.param({"PATH": "/bin", "MODE": "controller"}, ("MODE",), {"MODE": "task", "PORT": "1"},
                 {"PATH": "/bin", "MODE": "task", "PORT": "2"}, id="task-over-passthrough-own-over-task"),
])
def test_compute_replica_env(environ: dict[str, str], passthrough: tuple[str, ...], envs: dict[str, str],
                             expected: dict[str, str]) -> None:
    assert compute_replica_env(environ, passthrough, envs, {"PORT": "2"} if "PORT" in envs else {}) == expected


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("", (), id="unset"),
    pytest.param("A, B_2 ,,_c", ("A", "B_2", "_c"), id="names"),
    pytest.param("A,B-C", "'B-C' is not a variable name", id="dash"),
    pytest.param("2X", "'2X' is not a variable name", id="digit-first"),
    pytest.param("A=B", "'A=B' is not a variable name", id="assignment"),
    pytest.param("AWS_*", "'AWS_\\*' is not a variable name", id="pattern"),
])
def test_parse_env_passthrough(text: str, expected: tuple[str, ...] | str) -> None:
    if isinstance(expected, tuple):
        assert parse_env_passthrough(text) == expected
    else:
        with pytest.raises(UsageError, match=f"{PASSTHROUGH_SETTING}: {expected}"):
            parse_env_passthrough(text)


def test_an_invalid_passthrough_setting_fails_each_launch_naming_it(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "home", SystemClock(), environ={PASSTHROUGH_SETTING: "OK,NOT OK"})
    (outcome,) = provider.launch([request("sleep 30")])
    assert outcome.instance is None and outcome.permanent
    assert outcome.error is not None and outcome.error.startswith(f"{PASSTHROUGH_SETTING}: 'NOT OK'")
    assert provider.list_instances() == []


# --- every descendant of a replica stops with it; replicas are found from the process table -------------
# `run` leaves the replica's process group twice (setsid) and starts a double-forked daemon.
ESCAPING = ("setsid sleep 1000 & (setsid bash -c 'sleep 1001 & exit 0' &); "
            "( ( exec -a sky-lite-daemon sleep 1002 ) & ); echo escaped; exec sleep 300")


def replica_processes(root: Path) -> list[procs.ProcessInfo]:
    return [p for p, _tag in find_replica_processes(lambda tag: tag.is_relative_to(root))]


def wait_for_processes(root: Path, count: int, timeout: float = 15) -> list[procs.ProcessInfo]:
    """The replica processes below ``root`` once there are ``count`` (the short-lived shells of a `run`
    that starts its children come and go first)."""
    deadline = time.monotonic() + timeout
    while True:
        found = replica_processes(root)
        if len(found) == count:
            return found
        assert time.monotonic() < deadline, f"only {found} of {count} processes"
        time.sleep(0.05)


def alive(processes: list[procs.ProcessInfo]) -> list[procs.ProcessInfo]:
    return [p for p in processes if procs.is_alive(p.pid, p.start_time)]


def test_terminate_stops_descendants_that_left_the_process_group(provider: LocalProvider) -> None:
    (outcome,) = provider.launch([request(ESCAPING)])
    assert outcome.instance is not None
    # supervisor, wrapper, run's sleep 300, and the three that left: six processes carry the replica's tag.
    started = wait_for_processes(provider._root, 6)
    pgid = int(wait_for_directory(provider).joinpath("pid").read_text().split()[0])
    assert {p.pgid for p in started} - {pgid}, "nothing left the process group: the test tests nothing"

    provider.terminate([outcome.instance.instance_id])

    assert alive(started) == []
    assert provider.list_instances() == []


def test_terminate_stops_escaped_descendants_by_their_tag_when_the_supervisor_was_killed(
        provider: LocalProvider) -> None:
    (outcome,) = provider.launch([request(ESCAPING)])
    assert outcome.instance is not None
    started = wait_for_processes(provider._root, 6)
    supervisor = int(wait_for_directory(provider).joinpath("pid").read_text().split()[0])
    os.kill(supervisor, 9)  # its orphans go to init: only their tag still says whose they are

    provider.terminate([outcome.instance.instance_id])

    assert alive(started) == []


def test_when_run_exits_what_it_left_behind_is_stopped_too(provider: LocalProvider) -> None:
    provider.launch([request("setsid sleep 1000 & sleep 1; exit 4")])
    started = wait_for_processes(provider._root, 5)  # supervisor, wrapper, run, its sleep 1, sleep 1000
    assert wait_for(provider, 1, InstanceState.EXITED).detail == "run exited with code 4"
    assert alive(started) == []


def test_abandon_after_a_restart_stops_every_replica_of_the_home_even_with_the_home_deleted(
        tmp_path: Path) -> None:
    before_restart = LocalProvider(tmp_path / "home", SystemClock(), grace_seconds=2)
    before_restart.launch([request(ESCAPING, replica_id=1), request("sleep 300", replica_id=2)])
    started = wait_for_processes(before_restart._root, 6 + 4)
    del before_restart  # the controller restarted: nothing of that object remains
    after_restart = LocalProvider(tmp_path / "home", SystemClock(), grace_seconds=2)
    assert after_restart._children == {}
    shutil.rmtree(tmp_path / "home")  # the state directory, bookkeeping files included

    after_restart.abandon()

    assert alive(started) == []
    after_restart.abandon()  # idempotent


def test_a_new_provider_stops_replicas_whose_directory_is_gone_and_leaves_recorded_ones(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = LocalProvider(home, SystemClock(), grace_seconds=2)
    first.launch([request("sleep 300", replica_id=1), request("sleep 300", replica_id=2)])
    wait_for_processes(first._root, 4 + 4)
    gone = [d for d in (first._root / "svc").glob("1-*")]
    (kept,) = [i for i in first.list_instances() if i.replica_id == 2]
    lost = [p for p, tag in find_replica_processes(lambda tag: tag in gone)]
    shutil.rmtree(gone[0])  # its record went (a home deleted and made again while no controller ran)

    restarted = LocalProvider(home, SystemClock(), grace_seconds=2)
    assert [i.instance_id for i in restarted.list_instances()] == [kept.instance_id]

    assert lost and alive(lost) == []
    assert wait_for(restarted, 2, InstanceState.RUNNING).instance_id == kept.instance_id
    restarted.terminate([kept.instance_id])


def test_replica_directories_and_logs_are_private(provider: LocalProvider, tmp_path: Path) -> None:
    (outcome,) = provider.launch([request("sleep 30")])
    assert outcome.instance is not None
    (directory,) = (tmp_path / "home" / "replicas" / "svc").glob("1-*")
    for path in (tmp_path / "home" / "replicas", tmp_path / "home" / "replicas" / "svc", directory):
        assert path.stat().st_mode & 0o777 == 0o700, path
    assert (directory / "replica.log").stat().st_mode & 0o777 == 0o600


def test_spawned_processes_log_into_a_private_folder_and_file(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "x.log"
    child = procs.spawn_detached(["true"], cwd=tmp_path, env={"PATH": os.environ["PATH"]}, log_path=log)
    child.wait(10)
    assert (tmp_path / "logs").stat().st_mode & 0o777 == 0o700
    assert log.stat().st_mode & 0o777 == 0o600
