"""Starting and stopping the per-service load balancer processes.

Every controller host runs one load balancer per service, whoever owns the service: the owner's executor
starts and stops the one of its own host (``LoadBalancerRunner``), and ``HostLoadBalancers`` keeps one running
on this host for every other service, at the port the store pins for it, on this host's address. A load
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
    stopped = []
    folder = home / "lb-pids"
    for path in sorted(folder.iterdir()) if folder.is_dir() else ():
        if path.name.endswith(".tmp"):
            continue
        running = procs.read_pid_file(path)
        if running is not None and running.is_alive() and runner.is_alive(running.pid):
            procs.terminate_groups([running.pid])
            stopped.append(path.name)
        path.unlink(missing_ok=True)
    return stopped


@dataclass(frozen=True)
class HostedService:
    """What ``plan_host_lbs`` needs of a service: its name, its endpoint port, whether it is going."""

    name: str
    port: int
    deleting: bool = False


def plan_host_lbs(services: Sequence[HostedService], running: Collection[tuple[str, int]],
                  is_port_free: Callable[[int], bool]) -> tuple[HostedService, ...]:
    """The services whose load balancer this host should start now: every service not being deleted that has
    none ``running`` here at its port ((service, port) pairs), when the port is free on this host. A port
    another process holds is left to the owner's pass, which moves an unpinned one (this host's then
    follows, its load balancer at the old port ending with the service's next port change: it serves
    the same replicas meanwhile)."""
    return tuple(service for service in services
                 if not service.deleting and (service.name, service.port) not in running
                 and is_port_free(service.port))


class HostRunner(Protocol):
    def start(self, service: str, port: int) -> int: ...

    def find_running(self, service: str, port: int) -> int | None: ...

    def is_port_free(self, port: int) -> bool: ...


class ServiceLister(Protocol):
    def list_services(self) -> Sequence[HostedServiceRow]: ...


class HostedServiceRow(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def lb_port(self) -> int: ...

    @property
    def deleting(self) -> bool: ...


class HostLoadBalancers:
    """Keeps a load balancer of every service running on this controller host (see the module docstring).
    ``reconcile_host_lbs`` once per pass; a steady pass reads the services (cached by the store while
    none changed) and one pid file per service."""

    def __init__(self, store: ServiceLister, runner: HostRunner) -> None:
        self._store = store
        self._runner = runner

    def reconcile_host_lbs(self) -> list[tuple[str, int, int]]:
        """Start what ``plan_host_lbs`` says; the (service, port, pid) of each started."""
        services = [HostedService(row.name, row.lb_port, row.deleting) for row in self._store.list_services()]
        running = {(service.name, service.port) for service in services
                   if self._runner.find_running(service.name, service.port) is not None}
        return [(service.name, service.port, self._runner.start(service.name, service.port))
                for service in plan_host_lbs(services, running, self._runner.is_port_free)]


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
        pids = [pid for pid, started in self._started_by_pid.items()
                if started == (service, port) and pid in self._alive]
        return pids[-1] if pids else None

    def stop(self, pid: int) -> None:
        self.stopped.append(pid)
        self._alive.discard(pid)

    def crash(self, pid: int) -> None:
        self._alive.discard(pid)
