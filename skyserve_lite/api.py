"""What the CLI (and tests, and scripts) call: up, status, down, logs, against "a controller".

``Controller`` is the one boundary between the CLI and whatever holds the state: ``LocalController``
is the state directory on this machine with its background controller process; a controller VM reached
over SSH is another implementation of the same protocol. The CLI never opens the store itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from skyserve_lite import procs
from skyserve_lite.clock import Clock, SystemClock, format_timestamp
from skyserve_lite.controller.daemon import controller_log_path, ensure_controller, stop_controller
from skyserve_lite.controller.lb_runner import lb_log_path
from skyserve_lite.errors import NotFoundError, SpecError, UsageError, WaitTimeoutError
from skyserve_lite.providers import AVAILABLE_CLOUDS
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import is_valid_service_name
from skyserve_lite.state.models import EventRecord, ReplicaRecord, ServiceRecord, ServiceStatus
from skyserve_lite.state.store import Store

LB_PORT_START = 30001
LB_PORT_END = 30999


@dataclass(frozen=True)
class ServiceView:
    """Everything `serve status` shows of one service."""

    service: ServiceRecord
    policy: str
    load_balancing_policy: str
    replicas: tuple[ReplicaRecord, ...]
    events: tuple[EventRecord, ...]

    @property
    def active_versions(self) -> list[int]:
        """Versions the load balancer sends traffic to: those with a READY replica (else the current)."""
        ready = sorted({r.version for r in self.replicas if r.status.value == "READY"})
        return ready or [self.service.current_version]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.service.name,
            "status": self.service.status.value,
            "status_reason": self.service.status_reason,
            "version": self.service.current_version,
            "active_versions": self.active_versions,
            "endpoint": self.service.endpoint,
            "policy": self.policy,
            "load_balancing_policy": self.load_balancing_policy,
            "replicas": [
                {
                    "replica_id": r.replica_id, "version": r.version, "status": r.status.value,
                    "status_reason": r.status_reason, "cloud": r.cloud, "region": r.region, "zone": r.zone,
                    "instance_id": r.instance_id, "url": r.url, "is_spot": r.is_spot,
                    "launched_at": format_timestamp(r.launched_at),
                }
                for r in self.replicas
            ],
        }


class Controller(Protocol):
    """The CLI's one door to a controller. Every method is safe to retry."""

    def create_service(self, name: str, task: SubmittedTask) -> ServiceRecord:
        """Store ``task`` as version 1 of a new service and make sure a controller acts on it."""
        ...

    def get_status(self, names: Sequence[str] = ()) -> list[ServiceView]:
        """Views of the named services (all when empty). Raises ``NotFoundError`` for an unknown name."""
        ...

    def request_down(self, names: Sequence[str]) -> None:
        """Ask for the services to be taken down; returns at once. Raises ``NotFoundError`` first."""
        ...

    def finish_down(self, names: Sequence[str], timeout_seconds: float) -> None:
        """Wait until the services are gone; stop the background controller when none is left."""
        ...

    def log_path(self, name: str, replica_id: int | None, *, controller: bool = False,
                 load_balancer: bool = False) -> Path:
        """The log file of a replica, the service's load balancer, or the controller."""
        ...


class LocalController:
    """The controller of a state directory on this machine (``$SKY_LITE_HOME``)."""

    def __init__(self, home: Path, clock: Clock | None = None, *, start_daemon: bool = True) -> None:
        self.home = home
        self._clock = clock or SystemClock()
        self._start_daemon = start_daemon

    def _open(self) -> Store:
        return Store.open(self.home)

    def create_service(self, name: str, task: SubmittedTask) -> ServiceRecord:
        check_service_name(name)
        cloud = task.spec.resources.cloud.value
        if cloud not in AVAILABLE_CLOUDS:
            raise SpecError(task.source, "resources.cloud",
                            f"cloud {cloud!r} is not available in this version; available: "
                            + ", ".join(AVAILABLE_CLOUDS))
        store = self._open()
        try:
            port = _pick_lb_port(store.used_lb_ports())
            service = store.create_service(name, task, port, self._clock.now())
            store.add_events([(self._clock.now(), name, None, "service", f"version 1 submitted from "
                               f"{task.source}")])
        finally:
            store.close()
        if self._start_daemon:
            ensure_controller(self.home)
        return service

    def get_status(self, names: Sequence[str] = ()) -> list[ServiceView]:
        store = self._open()
        try:
            services = [store.get_service(n) for n in names] if names else store.list_services()
            views = []
            for service in services:
                spec = store.get_version(service.name, service.current_version).spec
                views.append(ServiceView(
                    service=service, policy=spec.service.replica_policy.describe(),
                    load_balancing_policy=spec.service.load_balancing_policy.value,
                    replicas=tuple(store.list_replicas(service.name)),
                    events=tuple(store.list_events(service.name, limit=20)),
                ))
            return views
        finally:
            store.close()

    def request_down(self, names: Sequence[str]) -> None:
        store = self._open()
        try:
            for name in names:
                store.get_service(name)  # every name must exist before anything changes
            store.mark_deleting(names)
        finally:
            store.close()
        if self._start_daemon and names:
            ensure_controller(self.home)

    def finish_down(self, names: Sequence[str], timeout_seconds: float) -> None:
        deadline = time.monotonic() + timeout_seconds
        while True:
            store = self._open()
            try:
                left = [n for n in names if store.find_service(n) is not None]
                anything_left = bool(store.list_services())
            finally:
                store.close()
            if not left:
                break
            if time.monotonic() >= deadline:
                raise WaitTimeoutError(f"still shutting down after {timeout_seconds:g}s: {', '.join(left)}; "
                                       "the controller keeps working on it (see `sky-lite serve logs "
                                       f"{left[0]} --controller`)")
            time.sleep(0.2)
        if not anything_left:
            stop_controller(self.home)

    def log_path(self, name: str, replica_id: int | None, *, controller: bool = False,
                 load_balancer: bool = False) -> Path:
        if controller:
            return controller_log_path(self.home)
        self.get_status([name])  # NotFoundError for an unknown service
        if load_balancer:
            return lb_log_path(self.home, name)
        if replica_id is None:
            raise UsageError("name a replica id, or pass --controller or --load-balancer")
        from skyserve_lite.providers.local import LocalProvider

        path = LocalProvider(self.home, self._clock).replica_log(name, replica_id)
        if path is None:
            raise NotFoundError(f"service {name!r} has no log for replica {replica_id}")
        return path


def check_service_name(name: str) -> None:
    if not is_valid_service_name(name):
        raise UsageError(f"invalid service name {name!r}: use lowercase letters, digits and '-', starting "
                         "with a letter and at most 63 characters (pass one with -n NAME)")


def default_service_name(task: SubmittedTask) -> str:
    """The YAML's `name`, else the file's stem (``minimal.yaml`` -> ``minimal``)."""
    return task.spec.name or Path(task.source).stem.lower().replace("_", "-")


def _pick_lb_port(used: set[int]) -> int:
    for port in range(LB_PORT_START, LB_PORT_END + 1):
        if port not in used and procs.is_port_free(port):
            return port
    raise UsageError(f"no free port for a load balancer between {LB_PORT_START} and {LB_PORT_END}")


@dataclass(frozen=True)
class WaitOutcome:
    view: ServiceView
    ready: bool


def wait_until_ready(controller: Controller, name: str, timeout_seconds: float,
                     on_progress: Callable[[ServiceView], None] = lambda _view: None,
                     poll_seconds: float = 0.5) -> ServiceView:
    """Poll until the service is READY. Raises ``WaitTimeoutError`` (with what is stuck and why) on
    timeout, and ``WaitTimeoutError`` too when the service became FAILED (waiting longer cannot help)."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        (view,) = controller.get_status([name])
        on_progress(view)
        if view.service.status is ServiceStatus.READY:
            return view
        if view.service.status is ServiceStatus.FAILED:
            raise WaitTimeoutError(f"service {name} FAILED: {view.service.status_reason}. "
                                   f"See `sky-lite serve logs {name} REPLICA_ID`.")
        if time.monotonic() >= deadline:
            raise WaitTimeoutError(f"service {name} is not READY after {timeout_seconds:g}s: "
                                   + describe_stuck(view))
        time.sleep(poll_seconds)


def describe_stuck(view: ServiceView) -> str:
    """Which replica holds the service back, and why, in one sentence."""
    name = view.service.name
    live = [r for r in view.replicas if r.status.is_live]
    if not live:
        failed = [r for r in view.replicas if r.status.is_terminal]
        if failed:
            last = failed[-1]
            return (f"replica {last.replica_id} is {last.status.value} ({last.status_reason}); "
                    f"see `sky-lite serve logs {name} {last.replica_id}`")
        return (f"no replica launched yet (service status {view.service.status.value}); "
                f"see `sky-lite serve logs {name} --controller`")
    parts = []
    for r in live:
        reason = f": {r.status_reason}" if r.status_reason else ""
        parts.append(f"replica {r.replica_id} is {r.status.value}{reason}")
    return "; ".join(parts) + f" (see `sky-lite serve logs {name} {live[0].replica_id}`)"
