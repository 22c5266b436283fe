"""`serve down` waiting on a controller that is gone: the wait ends within seconds (not at its timeout) with
an error saying the controller stopped and what to run; a controller that runs, or comes back within the
grace, is waited on as before."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from skyserve_lite import procs
from skyserve_lite.api import CONTROLLER_GONE_SECONDS, LocalController, describe_stopped_controller
from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.pidfile import PID_FILE
from skyserve_lite.errors import ControllerError, WaitTimeoutError
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task

TEXT = "service: {replicas: 1}\nrun: python serve.py\n"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    task = SubmittedTask(text=TEXT, source="/t/svc.yaml", spec=parse_task(TEXT))
    controller = LocalController(home, FakeClock(), start_daemon=False)
    controller.create_service("svc", task)
    controller.request_down(["svc"])  # marked for deletion; nothing will delete it
    return home


def dead_process() -> procs.RecordedProcess:
    """A process that ran and exited: what the pid file of a controller killed with SIGKILL holds."""
    child = subprocess.Popen(["true"])
    recorded = procs.RecordedProcess.of(child.pid)
    child.wait()
    return recorded


def test_a_dead_controller_ends_the_wait_at_once_saying_what_to_run(home: Path) -> None:
    recorded = dead_process()
    procs.write_pid_file(home / PID_FILE, recorded)
    clock = FakeClock()
    with pytest.raises(ControllerError) as raised:
        LocalController(home, clock).finish_down(["svc"], 25, poll_seconds=0.2)
    message = str(raised.value)
    assert f"the controller (pid {recorded.pid}) stopped before svc was down" in message
    assert "run `sky-lite controller start`" in message and "serve logs svc --controller" in message
    assert sum(clock.sleeps) == pytest.approx(CONTROLLER_GONE_SECONDS) and CONTROLLER_GONE_SECONDS < 25


def test_a_controller_that_stopped_cleanly_is_gone_too(home: Path) -> None:
    with pytest.raises(ControllerError, match=r"^the controller stopped before svc was down"):
        LocalController(home, FakeClock()).finish_down(["svc"], 25)


def test_a_running_controller_is_waited_on_until_the_timeout(home: Path) -> None:
    procs.write_pid_file(home / PID_FILE, procs.RecordedProcess.of(os.getpid()))  # alive: this very process
    clock = FakeClock()
    with pytest.raises(WaitTimeoutError, match="still shutting down after 25s: svc"):
        LocalController(home, clock).finish_down(["svc"], 25, poll_seconds=0.5)
    assert sum(clock.sleeps) == pytest.approx(25)


class RestartingClock(FakeClock):
    """A clock whose first sleep lets "cron" start the controller again (a live pid file)."""

    def __init__(self, home: Path) -> None:
        super().__init__()
        self.home = home

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if len(self.sleeps) == 1:
            procs.write_pid_file(self.home / PID_FILE, procs.RecordedProcess.of(os.getpid()))


def test_a_controller_back_within_the_grace_is_waited_on(home: Path) -> None:
    procs.write_pid_file(home / PID_FILE, dead_process())
    clock = RestartingClock(home)
    with pytest.raises(WaitTimeoutError):
        LocalController(home, clock).finish_down(["svc"], 10, poll_seconds=1)


def test_without_a_background_controller_nothing_is_expected_to_run(home: Path) -> None:
    with pytest.raises(WaitTimeoutError):
        LocalController(home, FakeClock(), start_daemon=False).finish_down(["svc"], 10)


@pytest.mark.parametrize(("recorded", "left", "start"), [
    (procs.RecordedProcess(4242, None), ["a"], "the controller (pid 4242) stopped before a was down, and nothing "
                                               "takes it down"),
    (None, ["a", "b"], "the controller stopped before a, b were down, and nothing takes them down"),
])
def test_describe_stopped_controller(recorded: procs.RecordedProcess | None, left: list[str], start: str) -> None:
    text = describe_stopped_controller(recorded, left)
    assert text.startswith(start) and f"`sky-lite serve logs {left[0]} --controller`" in text
