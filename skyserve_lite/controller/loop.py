"""The controller process: at most one per state directory, running reconcile passes on an interval."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from skyserve_lite.clock import SystemClock
from skyserve_lite.controller.lb_runner import ProcessLoadBalancerRunner
from skyserve_lite.controller.probe import HttpProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.errors import ControllerError
from skyserve_lite.providers import make_providers
from skyserve_lite.providers.base import Provider
from skyserve_lite.providers.local import LocalProvider
from skyserve_lite.state.store import Store, prepare_home

log = logging.getLogger(__name__)

LOCK_FILE = "controller.lock"
PID_FILE = "controller.pid"


@contextmanager
def controller_lock(home: Path, timeout_seconds: float) -> Iterator[None]:
    """Hold the state directory's controller lock; at most one holder (a loop or a tick) at a time.

    Raises ``ControllerError`` if it is still held by someone else after ``timeout_seconds``
    (0: do not wait).
    """
    prepare_home(home)
    fd = os.open(home / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ControllerError(
                        f"another controller holds {home / LOCK_FILE}; only one may run per state directory"
                    ) from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)


def is_controller_running(home: Path) -> bool:
    """True while some process holds the controller lock."""
    path = home / LOCK_FILE
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def build_reconciler(home: Path, store: Store, settings: ControllerSettings,
                     providers: Mapping[str, Provider] | None = None) -> Reconciler:
    clock = SystemClock()
    providers = make_providers(home, clock, store.controller_id) if providers is None else providers
    return Reconciler(store, providers, HttpProber(), ProcessLoadBalancerRunner(home), clock, settings)


def run_tick(home: Path, settings: ControllerSettings, lock_timeout_seconds: float = 10.0) -> None:
    """One pass under the lock. A running loop holds the lock for its whole life, so a tick then refuses
    at once (``ControllerError``); another tick in progress is waited for up to ``lock_timeout_seconds``."""
    if is_controller_running(home) and read_controller_pid(home) is not None:
        raise ControllerError(f"a controller loop (pid {read_controller_pid(home)}) is running for {home} and "
                              "already reconciles on its interval; `controller tick` is for when none runs")
    with controller_lock(home, lock_timeout_seconds):
        store = Store.open(home)
        try:
            build_reconciler(home, store, settings).reconcile_once()
        finally:
            store.close()


def run_loop(home: Path, settings: ControllerSettings, stop: threading.Event | None = None) -> None:
    """Reconcile every ``settings.interval_seconds`` until SIGTERM/SIGINT (or ``stop``) asks to end.

    A failing pass is logged with its context and the loop goes on: the next pass sees the same level.
    """
    stop = stop or threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping after the current pass", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
    with controller_lock(home, timeout_seconds=0):
        (home / PID_FILE).write_text(f"{os.getpid()}\n")
        store = Store.open(home)
        providers = make_providers(home, SystemClock(), store.controller_id)
        reconciler = build_reconciler(home, store, settings, providers)
        log.info("controller %s running for %s, every %.1fs", store.controller_id, home,
                 settings.interval_seconds)
        try:
            while not stop.is_set():
                if not store.is_current():
                    # The state directory was deleted under us: nothing can be reconciled any more, and
                    # relaunching "vanished" replicas into a deleted directory would only leak processes.
                    log.error("%s was deleted or replaced; stopping, with the processes this controller started",
                              store.path)
                    local = providers.get("local")
                    if isinstance(local, LocalProvider):
                        local.terminate_started()
                    break
                started = time.monotonic()
                try:
                    reconciler.reconcile_once()
                except Exception:  # the top-level loop: log with context, keep going
                    log.exception("reconcile pass failed; retrying in %.1fs", settings.interval_seconds)
                stop.wait(max(0.0, settings.interval_seconds - (time.monotonic() - started)))
        finally:
            store.close()
            (home / PID_FILE).unlink(missing_ok=True)
            log.info("controller stopped")


def read_controller_pid(home: Path) -> int | None:
    try:
        return int((home / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
