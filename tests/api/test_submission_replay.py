"""A submission run again with the same idempotency key gets the answer it had, but not for a service that is
going down: that one is refused as a taken name, never reported as stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock
from skyserve_lite.errors import StateConflictError
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.spec.parse import read_task

TEXT = "service:\n  replicas: 1\nrun: python -m http.server $PORT\n"


@pytest.fixture
def controller(tmp_path: Path) -> LocalController:
    return LocalController(tmp_path / "home", FakeClock(), start_daemon=False)


def test_the_same_serve_up_again_is_the_service_it_created(controller: LocalController) -> None:
    first = controller.create_service("web", read_task(TEXT, "/t/web.yaml"), key="k" * 32)
    again = controller.create_service("web", read_task(TEXT, "/t/web.yaml"), key="k" * 32)
    assert again == first


def test_the_same_serve_up_for_a_service_going_down_is_refused(controller: LocalController) -> None:
    controller.create_service("web", read_task(TEXT, "/t/web.yaml"), key="k" * 32)
    controller.request_down(["web"])
    with pytest.raises(StateConflictError, match="already exists"):
        controller.create_service("web", read_task(TEXT, "/t/web.yaml"), key="k" * 32)


def test_the_same_update_for_a_service_going_down_is_not_replayed(controller: LocalController) -> None:
    controller.create_service("web", read_task(TEXT, "/t/web.yaml"))
    new = read_task(TEXT.replace("1\n", "2\n", 1), "/t/web.yaml")
    stored = controller.submit_update("web", new, UpdateMode.ROLLING, key="u" * 32)
    assert controller.submit_update("web", new, UpdateMode.ROLLING, key="u" * 32) == stored
    controller.request_down(["web"])
    with pytest.raises(StateConflictError):
        controller.submit_update("web", new, UpdateMode.ROLLING, key="u" * 32)
