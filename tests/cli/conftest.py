"""Fixtures the CLI tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock

from ..controller.conftest import Harness
from .homes import IMAGE_V1, home_with_service
from .runner import Cli


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    """Service ``svc`` with its 2 replicas READY after two reconcile passes (fake provider and prober); a
    test module may define a ``harness`` of its own."""
    h = Harness(tmp_path / "home")
    h.create(replicas=2)
    h.tick()
    h.tick()
    yield h
    h.store.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """Service ``svc`` of ``homes.IMAGE_V1`` with its 4 replicas READY, no controller running; a test module
    may define a ``home`` of its own."""
    return home_with_service(tmp_path, IMAGE_V1, replicas=4)


@pytest.fixture
def cli(home: Path) -> Cli:
    """The CLI on ``home`` (a fake clock, no controller started); a test module may define a ``cli`` of its
    own."""
    return Cli(LocalController(home, FakeClock(), start_daemon=False))
