"""A controller VM as a cloud-independent request and result (``aws_machine``, ``gcp_machine``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from skyserve_lite.errors import PermanentProviderError, TransientProviderError


@dataclass(frozen=True)
class MachineRequest:
    machine_id: str  # recorded in the local state directory; names and tags everything below
    region: str
    image_id: str
    public_key: str  # OpenSSH public key text, for the login user
    allow_cidr: str  # who may reach the load balancers
    ssh_cidr: str  # who may reach sshd
    lb_ports: tuple[int, int]
    instance_type: str | None = None  # None: the cloud's default for a controller
    zone: str | None = None
    ssh_user: str = "ubuntu"  # the login user (GCE makes it from the key's metadata)

    @property
    def name(self) -> str:
        return f"sky-lite-controller-{self.machine_id}"


@dataclass(frozen=True)
class LaunchedMachine:
    instance_id: str
    region: str
    state: str  # the cloud's: pending/running (EC2), PROVISIONING/RUNNING (GCE), ...
    public_ip: str | None
    private_ip: str | None
    resources: tuple[tuple[str, str], ...]  # (kind, id) made for it: role, instance-profile, key-pair, security-group


def wait_until_running(find: Callable[[], LaunchedMachine | None], what: str, running: str,
                       stopped: Collection[str], sleep: Callable[[float], None], timeout_seconds: float = 600,
                       poll_seconds: float = 5) -> LaunchedMachine:
    """Poll ``find`` until the machine's state is ``running``. Raises ``PermanentProviderError`` when it is
    gone or in one of ``stopped``, ``TransientProviderError`` on timeout. ``what`` names it in messages."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        found = find()
        if found is None or found.state in stopped:
            raise PermanentProviderError(f"{what} is {found.state.lower() if found else 'gone'}")
        if found.state == running:
            return found
        if time.monotonic() >= deadline:
            raise TransientProviderError(f"{what} is still {found.state.lower()} after {timeout_seconds:g}s")
        sleep(poll_seconds)
