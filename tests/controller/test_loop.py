"""At most one controller per state directory; a tick waits for the lock."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from skyserve_lite.controller.loop import controller_lock, is_controller_running, run_loop, run_tick
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.errors import ControllerError, UsageError


def test_second_controller_is_refused_while_one_holds_the_lock(tmp_path: Path) -> None:
    with controller_lock(tmp_path, timeout_seconds=0):
        assert is_controller_running(tmp_path)
        with pytest.raises(ControllerError, match="only one may run per state directory"):
            run_loop(tmp_path, ControllerSettings(interval_seconds=0.1))
    assert not is_controller_running(tmp_path)


def test_loop_runs_passes_until_stopped_and_releases_the_lock(tmp_path: Path) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=run_loop, args=(tmp_path, ControllerSettings(interval_seconds=0.05), stop))
    thread.start()
    try:
        for _ in range(100):
            if (tmp_path / "controller.pid").exists():
                break
            stop.wait(0.05)
        assert is_controller_running(tmp_path)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert not is_controller_running(tmp_path)
    assert not (tmp_path / "controller.pid").exists()


def test_tick_refuses_while_a_loop_runs(tmp_path: Path) -> None:
    with controller_lock(tmp_path, timeout_seconds=0):
        (tmp_path / "controller.pid").write_text("4242\n")
        with pytest.raises(ControllerError, match=r"a controller loop \(pid 4242\) is running"):
            run_tick(tmp_path, ControllerSettings())


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
