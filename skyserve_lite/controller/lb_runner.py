"""Starting and stopping the per-service load balancer processes (the controller's executor calls this)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection
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
        argv = [sys.executable, "-m", _LB_MODULE, "--home", str(self._home), "--service", service,
                "--port", str(port), "--host", self._host]
        child = procs.spawn_detached(argv, cwd=self._home, env=os.environ,
                                     log_path=lb_log_path(self._home, service))
        return child.pid

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
        return procs.is_port_free(port, self._host)


class FakeLoadBalancerRunner:
    """Records starts and stops; every started pid stays alive until stopped."""

    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []
        self.stopped: list[int] = []
        self.taken_ports: set[int] = set()  # ports some other process holds
        self._alive: set[int] = set()
        self._next_pid = 50_000

    def is_port_free(self, port: int) -> bool:
        return port not in self.taken_ports

    def start(self, service: str, port: int) -> int:
        self._next_pid += 1
        self.started.append((service, port))
        self._alive.add(self._next_pid)
        return self._next_pid

    def is_alive(self, pid: int) -> bool:
        return pid in self._alive

    def stop(self, pid: int) -> None:
        self.stopped.append(pid)
        self._alive.discard(pid)

    def crash(self, pid: int) -> None:
        self._alive.discard(pid)
