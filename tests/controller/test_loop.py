"""At most one controller per state directory; a tick waits for the lock; liveness is probed without it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from skyserve_lite import procs
from skyserve_lite.controller.host import HostSettings
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.loop import build_loop_parts, controller_lock, run_loop, run_tick
from skyserve_lite.controller.pidfile import is_controller_running, read_controller_pid
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.errors import ControllerError, UsageError
from skyserve_lite.forcedown import force_down
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ServiceStatus
from skyserve_lite.state.store import Store, prepare_home


def test_a_loop_waits_for_a_tick_but_gives_up_after_its_timeout(tmp_path: Path) -> None:
    with controller_lock(tmp_path, timeout_seconds=0):  # a tick in progress
        assert not is_controller_running(tmp_path)  # a tick is not a running controller loop
        with pytest.raises(ControllerError, match="only one may run per state directory"):
            run_loop(tmp_path, ControllerSettings(interval_seconds=0.1), lock_timeout_seconds=0.3)
    assert not is_controller_running(tmp_path)


def run_in_thread(home: Path, stop: threading.Event, interval: float = 0.05) -> threading.Thread:
    thread = threading.Thread(target=run_loop, args=(home, ControllerSettings(interval_seconds=interval), stop))
    thread.start()
    for _ in range(200):
        if is_controller_running(home):
            break
        stop.wait(0.05)
    return thread


def test_loop_runs_passes_until_stopped_and_releases_the_lock(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = Store.open(home)
    task = SubmittedTask(text="service: {replicas: 1}\nrun: sleep 600\n", source="/t.yaml",
                         spec=parse_task("service: {replicas: 1}\nrun: sleep 600\n"))
    store.create_service("svc", task, 30001, 0.0)
    stop = threading.Event()
    thread = run_in_thread(home, stop)
    try:
        assert is_controller_running(home)
        assert read_controller_pid(home) == os.getpid()
        for _ in range(600):  # a pass ran to its end: the launch's outcome and the service status recorded
            if (any(r.instance_id for r in store.list_replicas("svc"))
                    and store.get_service("svc").status is not ServiceStatus.CONTROLLER_INIT):
                break
            stop.wait(0.05)
        (replica,) = store.list_replicas("svc")
        assert replica.instance_id is not None
        assert store.get_service("svc").status is not ServiceStatus.CONTROLLER_INIT
    finally:
        stop.set()
        thread.join(10)
        force_down(home, clouds=lambda _controller_id: {})  # the replica and load balancer the pass started
        store.close()
    assert not thread.is_alive()
    assert not is_controller_running(home)
    assert not (home / "controller.pid").exists()
    # The lock is free again: a tick can take it at once.
    with controller_lock(home, timeout_seconds=0):
        pass


def test_a_second_loop_is_refused_at_once(tmp_path: Path) -> None:
    stop = threading.Event()
    thread = run_in_thread(tmp_path, stop)
    try:
        started = time.monotonic()
        with pytest.raises(ControllerError, match="only one may run per state directory"):
            run_loop(tmp_path, ControllerSettings(interval_seconds=0.1), lock_timeout_seconds=30)
        assert time.monotonic() - started < 5  # it did not wait out the 30 s: a loop never lets go
    finally:
        stop.set()
        thread.join(10)


class RecordingHost:
    """Host settings and load balancer runners for ``build_loop_parts``, counting the reads and the builds."""

    def __init__(self, settings: HostSettings) -> None:
        self.settings = settings
        self.reads: list[Path] = []
        self.runners: list[tuple[Path, str, FakeLoadBalancerRunner]] = []

    def read(self, home: Path) -> HostSettings:
        self.reads.append(home)
        return self.settings

    def make_runner(self, home: Path, lb_host: str) -> FakeLoadBalancerRunner:
        runner = FakeLoadBalancerRunner()
        self.runners.append((home, lb_host, runner))
        return runner


def test_the_loop_reads_the_host_settings_once_and_builds_one_load_balancer_runner(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = Store.open(home)
    try:
        store.create_service("svc", SubmittedTask(text="run: x\n", source="/t.yaml", spec=parse_task(
            "service: {replicas: 1}\nrun: sleep 600\n")), 30001, 0.0)
        host = RecordingHost(HostSettings(lb_host="127.0.0.7", endpoint_host="127.0.0.7"))
        parts = build_loop_parts(home, store, ControllerSettings(), read_host_settings=host.read,
                                 make_lb_runner=host.make_runner)
        assert host.reads == [home]
        ((built_home, lb_host, runner),) = host.runners  # one runner, on the host's load balancer address
        assert (built_home, lb_host) == (home, "127.0.0.7")
        # The host's load balancers start through that one runner.
        parts.host_lbs.reconcile_host_lbs()
        assert runner.started == [("svc", 30001)]
        assert (len(host.reads), len(host.runners)) == (1, 1)  # nothing more read or built for it
    finally:
        store.close()


def test_tick_refuses_while_a_loop_runs(tmp_path: Path) -> None:
    stop = threading.Event()
    thread = run_in_thread(tmp_path, stop)
    try:
        with pytest.raises(ControllerError, match=rf"a controller loop \(pid {os.getpid()}\) is running"):
            run_tick(tmp_path, ControllerSettings())
    finally:
        stop.set()
        thread.join(10)


@pytest.mark.parametrize(
    ("content", "running"),
    [
        pytest.param(None, False, id="no-pid-file"),
        pytest.param("garbage\n", False, id="unreadable"),
        pytest.param("999999999 1\n", False, id="dead-pid"),
        pytest.param("{pid} 1\n", False, id="pid-reused-by-another-process"),
        pytest.param("{pid} {start}\n", True, id="this-process"),
    ],
)
def test_liveness_reads_the_pid_file_and_checks_that_process(tmp_path: Path, content: str | None,
                                                             running: bool) -> None:
    if content is not None:
        start = procs.process_start_time(os.getpid())
        (tmp_path / "controller.pid").write_text(content.format(pid=os.getpid(), start=start))
    assert is_controller_running(tmp_path) is running


def test_probing_liveness_never_gets_in_the_way_of_a_starting_controller(tmp_path: Path) -> None:
    """A status probe looping next to 500 lock attempts: every attempt gets the lock at once."""
    prepare_home(tmp_path)
    done = threading.Event()
    probes = 0

    def probe() -> None:
        nonlocal probes
        while not done.is_set():
            is_controller_running(tmp_path)
            probes += 1

    prober = threading.Thread(target=probe)
    prober.start()
    refused = 0
    try:
        for _ in range(500):
            try:
                with controller_lock(tmp_path, timeout_seconds=0):
                    pass
            except ControllerError:
                refused += 1
    finally:
        done.set()
        prober.join(10)
    assert probes > 0
    assert refused == 0


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({}, ControllerSettings(), id="defaults"),
        pytest.param({"SKY_LITE_CONTROLLER_INTERVAL_SECONDS": "0.5", "SKY_LITE_FAILURE_LIMIT": "5",
                      "SKY_LITE_DRAIN_SECONDS": "0", "SKY_LITE_PROBE_FAILURE_GRACE_SECONDS": " 30 "},
                     ControllerSettings(interval_seconds=0.5, failure_limit=5, drain_seconds=0,
                                        probe_failure_grace_seconds=30), id="overrides"),
    ],
)
def test_settings_from_env(env: dict[str, str], expected: ControllerSettings) -> None:
    assert ControllerSettings.from_env(env) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param({"SKY_LITE_FAILURE_LIMIT": "abc"}, "SKY_LITE_FAILURE_LIMIT must be a whole number, got 'abc'",
                     id="not-a-number"),
        pytest.param({"SKY_LITE_FAILURE_LIMIT": "2.5"}, "SKY_LITE_FAILURE_LIMIT must be a whole number",
                     id="fraction-for-a-count"),
        pytest.param({"SKY_LITE_CONTROLLER_INTERVAL_SECONDS": "0"},
                     "SKY_LITE_CONTROLLER_INTERVAL_SECONDS must be at least 0.1", id="interval-too-small"),
        pytest.param({"SKY_LITE_DRAIN_SECONDS": "-1"}, "SKY_LITE_DRAIN_SECONDS must be at least 0", id="negative"),
        pytest.param({"SKY_LITE_DRAIN_SECONDS": "nan"}, "SKY_LITE_DRAIN_SECONDS must be at least 0", id="nan"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ControllerSettings.from_env(env)
