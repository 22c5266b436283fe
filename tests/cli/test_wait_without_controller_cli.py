"""`serve wait` when no controller runs (killed, or not started again after a reboot): nothing moves the
rollout, so it says so on stderr before it waits, instead of waiting out its --timeout in silence."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from skyserve_lite.api import ControllerStatus, LocalController, StatusReport
from skyserve_lite.clock import FakeClock
from skyserve_lite.defaults import DEFAULT_EVENTS

from .homes import home_with_service, write
from .runner import Cli

V1 = "resources:\n  infra: local\n  image_id: img-1\nservice:\n  replicas: 4\nrun: python serve.py\n"
V2 = V1.replace("img-1", "img-2")
WARNING = ("Warning: no controller is running, so the rollout does not move while this waits. Start it with "
           "`sky-lite controller start`.")


class RunningController(LocalController):
    """This machine's state, read as if its controller ran."""

    def controller_status(self) -> ControllerStatus:
        return dataclasses.replace(super().controller_status(), running=True)


def canary_under_way(tmp_path: Path, controller_type: type[LocalController]) -> Cli:
    home = home_with_service(tmp_path, V1, replicas=4)
    cli = Cli(controller_type(home, FakeClock(), start_daemon=False))
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "-y")[0] == 0
    return cli


def test_wait_without_a_controller_says_nothing_moves(tmp_path: Path) -> None:
    code, _, stderr = canary_under_way(tmp_path, LocalController)("serve", "wait", "svc", "--timeout", "0")
    assert code == 1
    assert " ".join(stderr.split()).startswith(WARNING)
    assert "version 2 is not rolled out after 0s" in stderr  # and it still waits as asked


def test_wait_with_a_controller_does_not_warn(tmp_path: Path) -> None:
    code, _, stderr = canary_under_way(tmp_path, RunningController)("serve", "wait", "svc", "--timeout", "0")
    assert code == 1
    assert "no controller" not in stderr and "version 2 is not rolled out after 0s" in stderr


def test_wait_on_an_unknown_service_names_it(tmp_path: Path) -> None:
    code, _, stderr = canary_under_way(tmp_path, LocalController)("serve", "wait", "nosuch", "--timeout", "0")
    assert code == 1
    assert "no service named 'nosuch'" in stderr and "no controller" not in stderr


class NoReportController(LocalController):
    """Refuses the full status report, which asks every endpoint: `serve wait` has no use for it."""

    def get_status_report(self, names: Sequence[str] = (), *, events: int = DEFAULT_EVENTS) -> StatusReport:
        raise AssertionError("serve wait asked for the status report and its endpoint checks")


def test_wait_does_not_ask_the_endpoints(tmp_path: Path) -> None:
    code, _, stderr = canary_under_way(tmp_path, NoReportController)("serve", "wait", "svc", "--timeout", "0")
    assert code == 1
    assert "status report" not in stderr and "version 2 is not rolled out after 0s" in stderr
