"""`serve down --all --force`: everything a state directory started stops, with its database garbage.

Real processes (replicas that escaped their process group, a load balancer, a stand-in controller); the
cloud is a fake provider, so no test reaches a cloud API.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from skyserve_lite import procs
from skyserve_lite.api import LocalController
from skyserve_lite.clock import SystemClock
from skyserve_lite.controller.lb_runner import ProcessLoadBalancerRunner
from skyserve_lite.controller.pidfile import PID_FILE, ControllerProcess
from skyserve_lite.forcedown import CONTROLLER_ID_FILE, ForceDownReport, force_down, peek_store
from skyserve_lite.providers.base import LaunchRequest, Provider
from skyserve_lite.providers.fake import Call, FakeProvider
from skyserve_lite.providers.local import LocalProvider
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.store import Store
from skyserve_lite.userconfig import set_config
from tests.postgres import PASSWORD, PASSWORD_USER, PostgresServer
from tests.providers.test_local import ESCAPING, alive, request, wait_for_processes

from .runner import Cli

TASK = "service:\n  replicas: 2\nrun: sleep 300\n"
GARBAGE = b"this is not an SQLite database\n" * 512


class FakeCloudController(LocalController):
    """This machine's state directory, with a fake cloud where AWS would be."""

    def __init__(self, home: Path, cloud: FakeProvider) -> None:
        super().__init__(home, start_daemon=False)
        self.cloud = cloud
        self.asked: list[str] = []  # the controller ids the clouds were built for

    def force_down(self, regions: Sequence[str] = ()) -> ForceDownReport:
        def clouds(controller_id: str) -> Mapping[str, Provider]:
            self.asked.append(controller_id)
            return {"aws": self.cloud}

        return force_down(self.home, regions=regions, clouds=clouds, grace_seconds=2)


def web(run: str, replica_id: int) -> LaunchRequest:
    return dataclasses.replace(request(run, replica_id=replica_id), service="web")


@dataclass
class Running:
    home: Path
    processes: list[procs.ProcessInfo]  # every process the home started
    controller: int
    load_balancer: int
    cloud: FakeProvider


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    """A service with two local replicas (one whose children left its process group), its load balancer,
    a process recorded as the controller, and two cloud instances; then state.db overwritten with garbage."""
    home = tmp_path / "home"
    LocalController(home, start_daemon=False).create_service("web", SubmittedTask(TASK, "/t/web.yaml",
                                                                                   parse_task(TASK)))
    local = LocalProvider(home, SystemClock(), grace_seconds=2)
    local.launch([web(ESCAPING, 1), web("sleep 300", 2)])
    replicas = wait_for_processes(local._root, 6 + 4)
    load_balancer = ProcessLoadBalancerRunner(home).start("web", procs.find_free_port())
    controller = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (home / PID_FILE).write_text(ControllerProcess(controller.pid, procs.process_start_time(controller.pid)).to_text())
    cloud = FakeProvider(name="aws")
    cloud.launch([web("sleep 300", 1), web("sleep 300", 2)])
    (home / CONTROLLER_ID_FILE).write_text("c0ffee\n")
    (home / "state.db").write_bytes(GARBAGE)
    started = [*replicas, *(p for p in (procs.find_process(load_balancer), procs.find_process(controller.pid))
                            if p is not None)]
    assert len(started) == 6 + 4 + 2
    yield Running(home, started, controller.pid, load_balancer, cloud)
    for process in alive(started):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    controller.wait()


def test_force_down_stops_everything_the_home_started_with_the_database_garbage(running: Running) -> None:
    controller = FakeCloudController(running.home, running.cloud)

    code, stdout, stderr = Cli(controller)("serve", "down", "--all", "--force", "-y")

    assert (code, stderr) == (0, ""), stdout
    lines = stdout.splitlines()
    assert lines[:2] == [f"Stopped the controller (pid {running.controller}).",
                         f"Stopped the load balancer of web (pid {running.load_balancer})."]
    assert [line.split(" (")[0] for line in lines[2:4]] == ["Stopped replica 1 of web", "Stopped replica 2 of web"]
    assert lines[4:] == ["Terminated aws instance fake-1 (replica 1 of web).",
                         "Terminated aws instance fake-2 (replica 2 of web)."]
    assert alive(running.processes) == []
    assert controller.asked == ["c0ffee"]
    assert running.cloud.calls_to("terminate") == [Call("terminate", ("fake-1", "fake-2"))]
    assert (running.home / "state.db").read_bytes() == GARBAGE  # changes no file


def test_force_down_is_safe_to_run_twice(running: Running) -> None:
    cli = Cli(FakeCloudController(running.home, running.cloud))
    assert cli("serve", "down", "--all", "--force", "-y")[0] == 0

    code, stdout, _stderr = cli("serve", "down", "--all", "--force", "-y")

    assert (code, stdout) == (0, f"Nothing that {running.home} started was running.\n")
    assert len(running.cloud.calls_to("terminate")) == 1


def test_force_down_without_a_controller_id_stops_the_processes_and_says_the_cloud_was_not_searched(
        running: Running) -> None:
    (running.home / CONTROLLER_ID_FILE).unlink()  # and state.db is garbage: the id is nowhere
    controller = FakeCloudController(running.home, running.cloud)

    code, stdout, _stderr = Cli(controller)("serve", "down", "--all", "--force", "-y")

    assert code == 0
    assert "Cloud instances were not searched: the controller id of" in stdout
    assert alive(running.processes) == []
    assert controller.asked == [] and running.cloud.calls_to("list_instances") == []


def test_force_down_exits_1_naming_the_cloud_it_could_not_search(running: Running) -> None:
    running.cloud.fail_inventory()

    code, stdout, stderr = Cli(FakeCloudController(running.home, running.cloud))("serve", "down", "--all",
                                                                                 "--force", "-y")

    assert code == 1
    assert "Stopped the load balancer of web" in stdout
    assert "Error: aws: instances tagged sky-lite:controller=c0ffee could not be stopped" in stderr
    assert alive(running.processes) == []


def test_the_controller_id_and_regions_are_read_from_a_store_that_can_still_be_read(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "home")
    controller_id = store.controller_id
    store.close()
    (tmp_path / "home" / CONTROLLER_ID_FILE).unlink(missing_ok=True)
    assert peek_store(tmp_path / "home") == (controller_id, ())
    (tmp_path / "home" / "state.db").write_bytes(GARBAGE)
    assert peek_store(tmp_path / "home") == (None, ())


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--force"], "name the services to take down, or pass --all", id="nothing-named"),
    pytest.param(["web", "--force"], "--force takes down everything this state directory started: pass --all",
                 id="names"),
    pytest.param(["--all", "--region", "eu-west-1"], "--region goes with --force", id="region-without-force"),
])
def test_force_down_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    code, _stdout, stderr = Cli(LocalController(tmp_path / "home", start_daemon=False))("serve", "down", *args, "-y")
    assert code == 2 and message in stderr


def test_force_down_asks_first(tmp_path: Path) -> None:
    code, stdout, _stderr = Cli(LocalController(tmp_path / "home", start_daemon=False))(
        "serve", "down", "--all", "--force", input="n\n")
    assert code == 1 and "without reading its database?" in stdout


def test_force_down_with_the_state_in_postgresql_reads_the_controller_id_from_the_database(
        tmp_path: Path, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # The store keeps the controller id in the database's meta only (no controller-id file in the home): a
    # force-down that looked for the file alone searched no cloud at all.
    database = postgres_server.create_database(owner=PASSWORD_USER)
    monkeypatch.delenv("SKY_LITE_DB_URL", raising=False)
    home = tmp_path / "home"
    set_config(home, "db_url", postgres_server.url(database, PASSWORD_USER, PASSWORD))  # the password: pgpass
    try:
        store = Store.open(home)
        controller_id = store.controller_id
        store.create_service("web", SubmittedTask(TASK, "/t/web.yaml", parse_task(TASK)), 30001, now=1.0)
        store.close()
        assert not (home / CONTROLLER_ID_FILE).exists() and not (home / "state.db").exists()
        assert peek_store(home) == (controller_id, ())
        cloud = FakeProvider(name="aws")
        cloud.launch([web("sleep 300", 1)])
        controller = FakeCloudController(home, cloud)

        code, stdout, stderr = Cli(controller)("serve", "down", "--all", "--force", "-y")

        assert (code, stderr) == (0, ""), stdout
        assert controller.asked == [controller_id]
        assert stdout.splitlines()[-1] == "Terminated aws instance fake-1 (replica 1 of web)."
        assert cloud.calls_to("terminate") == [Call("terminate", ("fake-1",))]
    finally:
        postgres_server.drop_database(database)

    # The database gone: the processes are still stopped, and the last line names the database it could not
    # read, without its password.
    code, stdout, _stderr = Cli(FakeCloudController(home, cloud))("serve", "down", "--all", "--force", "-y")
    assert code == 0
    assert (f"the controller id of {home} is unknown (no {CONTROLLER_ID_FILE} file, and the state database "
            f"postgresql://{PASSWORD_USER}:***@127.0.0.1:{postgres_server.port}/{database} cannot be read)"
            in stdout.replace("\n", " "))
    assert PASSWORD not in stdout


def test_force_down_stops_the_replicas_in_the_local_replicas_directory_the_home_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Several controllers on one machine sharing a database name one replicas directory outside their homes
    # (SKY_LITE_LOCAL_REPLICAS_DIR): a force-down that looked below the home alone left these running.
    shared = tmp_path / "shared-replicas"
    monkeypatch.setenv("SKY_LITE_LOCAL_REPLICAS_DIR", str(shared))
    home = tmp_path / "home"
    home.mkdir()
    local = LocalProvider(home, SystemClock(), grace_seconds=2, replicas_dir=shared)
    local.launch([web(ESCAPING, 1), web("sleep 300", 2)])
    started = wait_for_processes(shared, 6 + 4)
    try:
        code, stdout, stderr = Cli(FakeCloudController(home, FakeProvider(name="aws")))(
            "serve", "down", "--all", "--force", "-y")
        assert (code, stderr) == (0, ""), stdout
        assert [line.split(" (")[0] for line in stdout.splitlines()[:2]] == ["Stopped replica 1 of web",
                                                                             "Stopped replica 2 of web"]
        assert alive(started) == []
    finally:
        for process in alive(started):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
