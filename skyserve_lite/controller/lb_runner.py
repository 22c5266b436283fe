"""Starting and stopping the per-service load balancer processes.

Every controller host runs one load balancer per service, whoever owns the service: the owner's executor
starts and stops the one of its own host (``LoadBalancerRunner``), and ``HostLoadBalancers`` keeps one running
on this host for every other service, at the port the store pins for it, on this host's address (and stops
one left at a port the service moved from). A load
balancer reads the ready replicas from the store and holds no state of its own, so any number of them serve
one service side by side; it ends by itself when its service is deleted. ``ProcessLoadBalancerRunner``
records each one it starts (``lb-pids/SERVICE.PORT`` under the home) and starts none where one runs already,
so the owner's executor and ``HostLoadBalancers`` never start two for one service on one host.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from skyserve_lite import procs

_LB_MODULE = "skyserve_lite.lb"

# Load balancer endpoints: the first free port from 30001 up.
LB_PORT_START = 30001
LB_PORT_END = 30999


def find_lb_port(used: Collection[int], is_free: Callable[[int], bool]) -> int | None:
    """The first port from ``LB_PORT_START`` that no service uses and ``is_free`` accepts; None if none."""
    for port in range(LB_PORT_START, LB_PORT_END + 1):
        if port not in used and is_free(port):
            return port
    return None


class LoadBalancerRunner(Protocol):
    def start(self, service: str, port: int) -> int:
        """Start the service's load balancer on ``port``; return its pid."""
        ...

    def is_alive(self, pid: int) -> bool:
        """Whether ``pid`` is a running load balancer (not some process that reused the pid)."""
        ...

    def is_port_free(self, port: int) -> bool:
        """Whether a load balancer could listen on ``port`` now."""
        ...

    def stop(self, pid: int) -> None:
        """Stop it (SIGTERM, then SIGKILL after a grace). Idempotent."""
        ...


def lb_log_path(home: Path, service: str) -> Path:
    return home / "logs" / f"load-balancer-{service}.log"


class ProcessLoadBalancerRunner:
    """Each load balancer is ``python -m skyserve_lite.lb`` in its own session, logging under the home."""

    def __init__(self, home: Path, host: str = "127.0.0.1") -> None:
        self._home = home
        self._host = host

    def start(self, service: str, port: int) -> int:
        """Start the service's load balancer on ``port``, or return the pid of the one that runs there
        already on this host (started by this home's owner pass or ``HostLoadBalancers``)."""
        path = lb_pid_path(self._home, service, port)
        running = self._recorded(path)
        if running is not None:
            return running
        argv = [sys.executable, "-m", _LB_MODULE, "--home", str(self._home), "--service", service,
                "--port", str(port), "--host", self._host]
        child = procs.spawn_detached(argv, cwd=self._home, env=os.environ,
                                     log_path=lb_log_path(self._home, service))
        path.parent.mkdir(mode=0o700, exist_ok=True)
        procs.write_pid_file(path, procs.RecordedProcess.of(child.pid))
        return child.pid

    def find_running(self, service: str, port: int) -> int | None:
        """The pid of the service's load balancer running on this host at ``port``; None when none does."""
        return self._recorded(lb_pid_path(self._home, service, port))

    def list_running(self) -> dict[tuple[str, int], int]:
        found: dict[tuple[str, int], int] = {}
        folder = self._home / "lb-pids"
        for path in folder.iterdir() if folder.is_dir() else ():
            service, _, port = path.name.rpartition(".")
            pid = self._recorded(path) if port.isdigit() else None
            if pid is not None:
                found[service, int(port)] = pid
        return found

    def stop_recorded(self, service: str, port: int) -> None:
        path = lb_pid_path(self._home, service, port)
        pid = self._recorded(path)
        if pid is not None:
            procs.terminate_groups([pid])
        path.unlink(missing_ok=True)

    def is_alive(self, pid: int) -> bool:
        if not procs.is_alive(pid):
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return True  # no /proc: trust the pid
        return _LB_MODULE.encode() in cmdline and str(self._home).encode() in cmdline

    def stop(self, pid: int) -> None:
        if self.is_alive(pid):
            procs.terminate_groups([pid])

    def is_port_free(self, port: int) -> bool:
        """Free, or held by a load balancer this home runs at that port (``start`` returns that one): the
        owner's executor checks the port before it starts its service's load balancer, and on a host where
        ``HostLoadBalancers`` started it already the port is the service's, not another process's."""
        if procs.is_port_free(port, self._host):
            return True
        folder = self._home / "lb-pids"
        return folder.is_dir() and any(self._recorded(path) is not None for path in folder.glob(f"*.{port}"))

    def _recorded(self, path: Path) -> int | None:
        """The pid ``path`` records when that process runs still and is this home's load balancer."""
        running = procs.read_pid_file(path)
        if running is not None and running.is_alive() and self.is_alive(running.pid):
            return running.pid
        return None


def lb_pid_path(home: Path, service: str, port: int) -> Path:
    return home / "lb-pids" / f"{service}.{port}"


def stop_host_lbs(home: Path) -> list[str]:
    """Stop every load balancer this host runs for ``home`` (those its pid files record), so that the host
    leaves the set of endpoints (`controller stop --load-balancers`, which `controller down HOST` runs);
    the services they served, as ``SERVICE.PORT``. Idempotent."""
    runner = ProcessLoadBalancerRunner(home)
    running = sorted(runner.list_running())
    for service, port in running:
        runner.stop_recorded(service, port)
    folder = home / "lb-pids"
    for path in folder.iterdir() if folder.is_dir() else ():  # of those that ended by themselves
        path.unlink(missing_ok=True)
    return [f"{service}.{port}" for service, port in running]


@dataclass(frozen=True)
class HostedService:
    """What ``plan_host_lbs`` needs of a service: its name, its endpoint port, whether it is going."""

    name: str
    port: int
    deleting: bool = False


@dataclass(frozen=True)
class HostLbPlan:
    start: tuple[HostedService, ...] = ()
    stop: tuple[tuple[str, int], ...] = ()  # (service, port) of load balancers running here to stop


def plan_host_lbs(services: Sequence[HostedService], running: Collection[tuple[str, int]],
                  is_port_free: Callable[[int], bool]) -> HostLbPlan:
    """This host's load balancer step. ``running``: the (service, port) of those running here.

    - Start one for every service not being deleted that has none here at its port, when the port is free
      on this host. A port another process holds is left to the owner's pass, which moves an unpinned one.
    - Stop those at a port that is no longer their service's (the owner moved it: 30001 taken on the
      owner's host, the service now at 30002 -> every host starts one at 30002 and stops its 30001), and
      those of services gone. One of a service being deleted ends by itself (its view is gone)."""
    ports = {service.name: service.port for service in services}
    start = tuple(service for service in services
                  if not service.deleting and (service.name, service.port) not in running
                  and is_port_free(service.port))
    stop = tuple(sorted(key for key in running if ports.get(key[0]) != key[1]))
    return HostLbPlan(start=start, stop=stop)


class HostRunner(Protocol):
    def start(self, service: str, port: int) -> int: ...

    def list_running(self) -> dict[tuple[str, int], int]:
        """The pid of each load balancer this home runs on this host, by (service, port)."""
        ...

    def stop_recorded(self, service: str, port: int) -> None:
        """Stop the one of ``service`` at ``port`` if it runs, and forget it. Idempotent."""
        ...

    def is_port_free(self, port: int) -> bool: ...


class HostLoadBalancerRunner(LoadBalancerRunner, HostRunner, Protocol):
    """A runner for both the owner's executor and ``HostLoadBalancers`` (``ProcessLoadBalancerRunner``,
    ``FakeLoadBalancerRunner``): the controller loop makes one and gives it to both."""


class ServiceLister(Protocol):
    def list_services(self) -> Sequence[HostedServiceRow]: ...


class HostedServiceRow(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def lb_port(self) -> int: ...

    @property
    def deleting(self) -> bool: ...


# How often ``HostLoadBalancers`` looks at every load balancer of the host while the services stand still: a
# look reads a pid file and /proc for each (1,000 services: about 45 ms of CPU), so at every 2 s pass it would
# cost more than the pass itself; every 10 s it is ~4.5 ms a second, and a load balancer that crashed on a host
# that does not own its service is started again within 10 s plus a pass.
HOST_LB_SWEEP_SECONDS = 10.0


class HostLoadBalancers:
    """Keeps a load balancer of every service running on this controller host (see the module docstring).
    ``reconcile_host_lbs`` once per pass: it applies ``plan_host_lbs`` when the services (names, ports,
    deleting) changed since it last did, or ``sweep_seconds`` after; else it only compares the services
    (which the store keeps while none changed) and returns an empty plan."""

    def __init__(self, store: ServiceLister, runner: HostRunner, clock: Callable[[], float],
                 sweep_seconds: float = HOST_LB_SWEEP_SECONDS) -> None:
        self._store = store
        self._runner = runner
        self._clock = clock
        self._sweep_seconds = sweep_seconds
        self._seen: frozenset[HostedService] | None = None
        self._swept_at = 0.0

    def reconcile_host_lbs(self) -> HostLbPlan:
        """Apply ``plan_host_lbs`` when due; the plan applied."""
        services = [HostedService(row.name, row.lb_port, row.deleting) for row in self._store.list_services()]
        now, seen = self._clock(), frozenset(services)
        if seen == self._seen and now - self._swept_at < self._sweep_seconds:
            return HostLbPlan()
        plan = plan_host_lbs(services, self._runner.list_running(), self._runner.is_port_free)
        for name, port in plan.stop:
            self._runner.stop_recorded(name, port)
        for service in plan.start:
            self._runner.start(service.name, service.port)
        self._seen, self._swept_at = seen, now
        return plan


class FakeLoadBalancerRunner:
    """Records starts and stops; every started pid stays alive until stopped."""

    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []
        self.stopped: list[int] = []
        self.taken_ports: set[int] = set()  # ports some other process holds
        self._alive: set[int] = set()
        self._started_by_pid: dict[int, tuple[str, int]] = {}
        self._next_pid = 50_000

    def is_port_free(self, port: int) -> bool:
        return port not in self.taken_ports

    def start(self, service: str, port: int) -> int:
        self._next_pid += 1
        self.started.append((service, port))
        self._started_by_pid[self._next_pid] = (service, port)
        self._alive.add(self._next_pid)
        return self._next_pid

    def is_alive(self, pid: int) -> bool:
        return pid in self._alive

    def find_running(self, service: str, port: int) -> int | None:
        return self.list_running().get((service, port))

    def list_running(self) -> dict[tuple[str, int], int]:
        return {started: pid for pid, started in self._started_by_pid.items() if pid in self._alive}

    def stop_recorded(self, service: str, port: int) -> None:
        pid = self.find_running(service, port)
        if pid is not None:
            self.stop(pid)

    def stop(self, pid: int) -> None:
        self.stopped.append(pid)
        self._alive.discard(pid)

    def crash(self, pid: int) -> None:
        self._alive.discard(pid)
