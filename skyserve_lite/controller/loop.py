"""The controller process: at most one per state directory, running reconcile passes on an interval."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from skyserve_lite import procs
from skyserve_lite.clock import SystemClock
from skyserve_lite.controller.host import HostSettings, load_host_settings
from skyserve_lite.controller.lb_runner import HostLoadBalancerRunner, HostLoadBalancers, ProcessLoadBalancerRunner
from skyserve_lite.controller.leases import LeaseHolder, LeaseSettings, new_loop_id
from skyserve_lite.controller.memory import PassCollector
from skyserve_lite.controller.metrics import start_metrics
from skyserve_lite.controller.pidfile import (
    PID_FILE,
    ControllerProcess,
    find_controller,
    is_controller_running,
    read_controller_pid,
)
from skyserve_lite.controller.probe import HttpProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.errors import ControllerError
from skyserve_lite.files.blobs import blob_store_of
from skyserve_lite.providers import make_providers
from skyserve_lite.remote.listener import RpcListener
from skyserve_lite.state.secrets import SecretStore
from skyserve_lite.state.store import Store, prepare_home

log = logging.getLogger(__name__)

LOCK_FILE = "controller.lock"


@contextmanager
def controller_lock(home: Path, timeout_seconds: float,
                    give_up: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Hold the state directory's controller lock; at most one holder (a loop or a tick) at a time.

    Raises ``ControllerError`` if it is still held by someone else after ``timeout_seconds`` (0: do not
    wait), or as soon as ``give_up()`` says waiting is pointless (a loop holds it for its whole life).
    Nothing else ever takes this lock: liveness probes read the pid file (``is_controller_running``).
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
                if time.monotonic() >= deadline or give_up():
                    raise ControllerError(
                        f"another controller holds {home / LOCK_FILE}; only one may run per state directory"
                    ) from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)


@dataclass(frozen=True)
class LoopParts:
    """What a controller of ``home`` runs each pass: the reconciler of the services it owns, and the load
    balancers this host keeps for every service, both starting them through one runner."""

    reconciler: Reconciler
    host_lbs: HostLoadBalancers


def build_loop_parts(home: Path, store: Store, settings: ControllerSettings, *,
                     read_host_settings: Callable[[Path], HostSettings] = load_host_settings,
                     make_lb_runner: Callable[[Path, str], HostLoadBalancerRunner] = ProcessLoadBalancerRunner,
                     ) -> LoopParts:
    """The controller of ``home`` wired to the real providers, prober and load balancer processes, holding
    the leases of the services it reconciles under a loop id of its own (several controllers may share the
    database; alone, it holds every lease). Cloud resources are tagged with the database's
    ``controller_id``, the same for every loop, so whichever loop owns a service adopts its instances.

    The host settings are read once, and one load balancer runner serves the owner's executor and
    ``HostLoadBalancers``: both start the one load balancer a service has on this host, at this host's
    address. Raises ``ControllerError`` for a damaged host settings file."""
    clock = SystemClock()
    host = read_host_settings(home)
    # The controller row names the address this host's endpoints answer on (`controller status`, and the
    # endpoints `serve status` lists); the loop id names the machine.
    leases = LeaseHolder(store, clock, new_loop_id(), host.endpoint_host,
                         LeaseSettings(settings.lease_ttl_seconds, settings.lease_renew_seconds))
    providers = make_providers(home, clock, store.controller_id, find_version=store.find_version)
    secrets = SecretStore(home)
    prober = HttpProber(read_secret=secrets.read_value)
    runner = make_lb_runner(home, host.lb_host)
    reconciler = Reconciler(store, providers, prober, runner, clock, settings, blobs=blob_store_of(home),
                            secrets=secrets, leases=leases)
    # A load balancer of every service on this host, not only of the services this loop owns.
    return LoopParts(reconciler, HostLoadBalancers(store, runner, time.monotonic))


def run_tick(home: Path, settings: ControllerSettings, lock_timeout_seconds: float = 10.0) -> None:
    """One pass under the lock. A running loop holds the lock for its whole life, so a tick then refuses
    at once (``ControllerError``); another tick in progress is waited for up to ``lock_timeout_seconds``."""
    running = find_controller(home)
    if running is not None:
        raise ControllerError(f"a controller loop (pid {running.pid}) is running for {home} and "
                              "already reconciles on its interval; `controller tick` is for when none runs")
    with controller_lock(home, lock_timeout_seconds):
        store = Store.open(home)
        try:
            reconciler = build_loop_parts(home, store, settings).reconciler
            try:
                reconciler.reconcile_once()
            finally:
                reconciler.release_leases()  # the next tick (or a loop) claims them again at once
        finally:
            store.close()


def run_loop(home: Path, settings: ControllerSettings, stop: threading.Event | None = None,
             lock_timeout_seconds: float = 10.0) -> None:
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
    # A tick may hold the lock for a moment: wait for it, but not for another loop (it never lets go).
    with controller_lock(home, timeout_seconds=lock_timeout_seconds, give_up=lambda: is_controller_running(home)):
        me = ControllerProcess(os.getpid(), procs.process_start_time(os.getpid()))
        _write_atomically(home / PID_FILE, me.to_text())
        store = Store.open(home)
        parts = build_loop_parts(home, store, settings)
        reconciler, host_lbs = parts.reconciler, parts.host_lbs
        listener = RpcListener(home)  # calls from `controller rpc` (a remote client's) are served here
        listener.start()
        metrics = start_metrics(home)  # SKY_LITE_METRICS_ADDR; None when off or its port is taken (logged)
        log.info("controller %s running for %s, every %.1fs", store.controller_id, home,
                 settings.interval_seconds)
        collector = PassCollector(time.monotonic)
        try:
            while not stop.is_set():
                if not store.is_current():
                    # The state directory was deleted under us: nothing can be reconciled any more, and
                    # relaunching "vanished" replicas into a deleted directory would only leak processes.
                    # Each provider stops what only it can find: the local one, every replica process of
                    # this home by its tag, whichever controller started it (before a restart too).
                    log.error("%s was deleted or replaced; stopping, with every replica process of %s",
                              store.path, home)
                    reconciler.abandon()
                    break
                started = time.monotonic()
                try:
                    reconciler.reconcile_once()
                    host_lbs.reconcile_host_lbs()
                except Exception:  # the top-level loop: log with context, keep going
                    log.exception("reconcile pass failed; retrying in %.1fs", settings.interval_seconds)
                collector.after_pass()
                if metrics is not None:
                    metrics.observe_pass(time.monotonic() - started)
                stop.wait(max(0.0, settings.interval_seconds - (time.monotonic() - started)))
        finally:
            listener.close()
            if metrics is not None:
                metrics.close()
            try:
                reconciler.release_leases()
            except Exception:  # the top-level loop: stopping goes on; the leases then lapse after their TTL
                log.exception("could not hand the services over; other controllers take them after the lease TTL")
            store.close()
            if read_controller_pid(home) == os.getpid():
                (home / PID_FILE).unlink(missing_ok=True)
            log.info("controller stopped")


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
