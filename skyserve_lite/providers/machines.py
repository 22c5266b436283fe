"""A controller VM as a cloud-independent request and result (``aws_machine``, ``gcp_machine``)."""

from __future__ import annotations

from dataclasses import dataclass


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
