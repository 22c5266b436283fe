"""Fixtures the CLI tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..controller.conftest import Harness


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
