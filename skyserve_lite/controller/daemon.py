"""The background controller of a state directory: started by `serve up`, stopped by the last `serve down`."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from skyserve_lite import procs
from skyserve_lite.controller.pidfile import is_controller_running, read_controller_pid
from skyserve_lite.errors import ControllerError


def controller_log_path(home: Path) -> Path:
    return home / "logs" / "controller.log"


def ensure_controller(home: Path, timeout_seconds: float = 15.0) -> int:
    """Make sure a controller loop runs for ``home``; return its pid. Idempotent.

    Two callers racing both spawn, and the second controller exits at once because the lock is held.
    """
    if is_controller_running(home):
        pid = _wait_for_pid(home, timeout_seconds)
        if pid is not None:
            return pid
    env = dict(os.environ, SKY_LITE_HOME=str(home))
    procs.spawn_detached([sys.executable, "-m", "skyserve_lite", "controller", "run"], cwd=home, env=env,
                         log_path=controller_log_path(home))
    pid = _wait_for_pid(home, timeout_seconds)
    if pid is None:
        raise ControllerError(
            f"the controller did not start within {timeout_seconds:g}s; see {controller_log_path(home)}")
    return pid


def stop_controller(home: Path, timeout_seconds: float = 30.0) -> bool:
    """Stop the controller loop of ``home`` (SIGTERM, then SIGKILL); True if one was running."""
    if not is_controller_running(home):
        return False
    pid = read_controller_pid(home)
    if pid is None:
        raise ControllerError(f"a controller holds the lock of {home} but wrote no pid file")
    procs.terminate_groups([pid], grace_seconds=timeout_seconds)
    deadline = time.monotonic() + 5.0
    while is_controller_running(home) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def _wait_for_pid(home: Path, timeout_seconds: float) -> int | None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        pid = read_controller_pid(home)
        if pid is not None and procs.is_alive(pid) and is_controller_running(home):
            return pid
        time.sleep(0.05)
    return None
