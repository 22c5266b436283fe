"""`serve update --wait` and `serve wait` without --timeout wait a canary's longest course (600 s plus its
steps x (1 + extensions) x bake), and as long as --timeout says when it is given."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import skyserve_lite.waits as waits_module
from skyserve_lite.errors import WaitTimeoutError

from .homes import IMAGE_V1, IMAGE_V2, write
from .runner import Cli

V1, V2 = IMAGE_V1, IMAGE_V2


@pytest.fixture
def waited(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The timeout each wait was given; every wait then times out at once."""
    timeouts: list[float] = []

    def record(_controller: Any, name: str, version: int | None, timeout_seconds: float,
               **_kwargs: Callable[..., None]) -> None:
        timeouts.append(timeout_seconds)
        raise WaitTimeoutError(f"{name}: not rolled out after {timeout_seconds:g}s")

    monkeypatch.setattr(waits_module, "wait_for_rollout", record)
    return timeouts


@pytest.mark.parametrize(
    ("flags", "timeout"),
    [
        # 2 steps x (1 + 3 extensions) x 120 s = 960 s of windows, + 600 s for launching: 1560 s.
        (["--mode", "canary", "--steps", "10,50", "--bake", "2m"], 1560.0),
        (["--mode", "canary", "--steps", "10,50", "--bake", "2m", "--timeout", "30"], 30.0),
        (["--mode", "rolling"], 600.0),
    ],
)
def test_update_waits_a_canarys_longest_course_unless_told(cli: Cli, tmp_path: Path, waited: list[float],
                                                           flags: list[str], timeout: float) -> None:
    code, _, stderr = cli("serve", "update", "svc", write(tmp_path, V2), "-y", *flags)
    assert code == 1, stderr
    assert waited == [timeout]


def test_serve_wait_waits_the_stored_canarys_longest_course(cli: Cli, tmp_path: Path, waited: list[float]) -> None:
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "--steps", "20",
               "--bake", "90s", "-y")[0] == 0
    assert cli("serve", "wait", "svc")[0] == 1
    assert cli("serve", "wait", "svc", "--timeout", "7")[0] == 1
    # 1 step x (1 + 3) x 90 s + 600 s.
    assert waited == [960.0, 7.0]
