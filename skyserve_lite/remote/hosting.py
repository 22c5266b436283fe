"""Putting the controller on a host and taking it off: what `controller up`, `upgrade` and `down` do.

``bring_up`` adopts an SSH host (``--ssh``) or first launches a controller VM (``--cloud aws|gcp``, through
the cloud's ``Machines``: ``aws_machine``, ``gcp_machine``), then pins the host keys, bootstraps the host
(``bootstrap``) and records it (``config``). The keys pinned are those the host proves on a strict
connection that trusts only the cloud's word (for a VM sky-lite launched), the key the user named, the keys
pinned before, or on first contact with an ``--ssh`` host the key it presents (``ssh.plan_host_keys``);
a key scan never decides what is trusted. A VM's identity gets its permissions last, once its controller
has said its controller id (what they are scoped to). That id is the VM's word, and a VM may be compromised
by the time of a later `controller up`: the id must have the form a store makes (never a pattern such as
``*``), and the first one a VM says is pinned in the record, so a later `controller up` refuses another
(``find_controller_id``) rather than re-scope the VM's permissions to what it asks for. The record is written
as soon as a VM exists, so a failed bootstrap leaves something `controller down` can remove; running
`controller up` again resumes from it. ``take_down_machine`` is the reverse.
"""

from __future__ import annotations

import getpass
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from skyserve_lite.controller.host import HostSettings
from skyserve_lite.controller.lb_runner import LB_PORT_END, LB_PORT_START
from skyserve_lite.errors import ControllerError, StateConflictError, UsageError
from skyserve_lite.remote import bootstrap, config, ssh
from skyserve_lite.remote.config import CloudMachine, ControllerRecord
from skyserve_lite.remote.ssh import SshTarget
from skyserve_lite.remote.ssh import is_loopback_address as is_loopback_address  # where it lived first

if TYPE_CHECKING:
    from skyserve_lite.providers.machines import LaunchedMachine, MachineRequest
    from skyserve_lite.state.dburl import DatabaseUrl

Say = Callable[[str], None]
DEFAULT_ALLOW_CIDR = "0.0.0.0/0"
SSH_WAIT_SECONDS = 300.0
# A new VM's host keys reach the cloud's console output (EC2) or guest attributes (GCE) within a few minutes of
# boot; the cloud is asked every HOST_KEYS_POLL_SECONDS until then.
HOST_KEYS_WAIT_SECONDS = 600.0
HOST_KEYS_POLL_SECONDS = 10.0


@dataclass(frozen=True)
class CloudRequest:
    """`controller up --cloud ...`."""

    cloud: str
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    image_id: str | None = None
    ssh_user: str = "ubuntu"
    allow_cidr: str = DEFAULT_ALLOW_CIDR
    ssh_cidr: str | None = None  # required: who may reach sshd is never a default


@dataclass(frozen=True)
class UpRequest:
    target: SshTarget | None  # --ssh
    cloud: CloudRequest | None  # --cloud
    remote_home: str | None = None
    remote_python: str = "python3"
    extras: tuple[str, ...] = ()
    host_key_fingerprint: str | None = None
    # --db-url: the PostgreSQL database the host's state lives in (its password goes to the host's libpq
    # password file through ssh's stdin, never a command line); with hosts recorded already, the host is
    # added beside them, sharing that database.
    database: DatabaseUrl | None = None


def bring_up(home: Path, request: UpRequest, say: Say) -> ControllerRecord:
    """See the module docstring. Raises ``UsageError``, ``StateConflictError``, ``HostKeyError``,
    ``ControllerError`` or ``ProviderError``, each naming the step."""
    records = config.load_records(home)
    previous = records[0] if records else None
    machine, extras, cloud_keys = None, request.extras, None
    adding = False
    if request.database is not None:
        extras = tuple(sorted({*extras, "postgres"}))
    if request.cloud is not None:
        if previous is not None and previous.machine is None:
            raise StateConflictError(f"this machine's controller is recorded at {previous.target.url}; take it "
                                     "down first with `sky-lite controller down`")
        target, machine, cloud_keys = launch_machine(home, previous, request.cloud, say)
        extras = tuple(sorted({*extras, request.cloud.cloud}))
    else:
        assert request.target is not None
        target = request.target
        same = [record for record in records if config.is_same_host(record.target, target)]
        if previous is not None and not same and request.database is None:
            raise StateConflictError(f"this machine's controller is recorded at {previous.target.url}; take it "
                                     "down first with `sky-lite controller down`, or add this host beside it "
                                     "with --db-url (both sharing one PostgreSQL database)")
        adding = previous is not None and (not same or same[0] is not previous)
        previous = same[0] if same else None
        machine = previous.machine if previous is not None else None
    same_host = previous is not None and config.is_same_host(previous.target, target)
    pinned = previous.host_keys if previous is not None and same_host else ()
    keys = establish_host_keys(home, target, pinned=pinned, cloud=cloud_keys, expected=request.host_key_fingerprint,
                               say=say)
    pinned_id = find_pinned_controller_id(previous, machine)
    record = ControllerRecord(target=target, remote_home=previous.remote_home if previous and same_host else "",
                              host_keys=tuple(keys), fingerprint=ssh.fingerprint(keys[0]), machine=machine,
                              controller_id=pinned_id)
    config.save_pinned_keys(home, record, add=adding)
    if machine is not None:
        config.save_record(home, record)  # a VM exists: record it before anything else can fail
    from skyserve_lite.remote.connect import record_shell

    shell = record_shell(home, record)
    remote_home = request.remote_home or record.remote_home or None
    home_there = bootstrap.find_remote_home(shell, remote_home)
    plan = bootstrap.HostPlan(remote_home=home_there, python=request.remote_python, extras=extras,
                              settings=host_settings_of(record), database=request.database)
    install_wheel(shell, plan, home_there, restart=False, say=say)
    record = ControllerRecord(target=target, remote_home=home_there, host_keys=tuple(keys),
                              fingerprint=record.fingerprint, machine=machine, controller_id=pinned_id)
    config.save_record(home, record, add=adding)
    if machine is not None:
        record = grant_machine(home, record, say)
    return record


def find_pinned_controller_id(previous: ControllerRecord | None, machine: CloudMachine | None) -> str:
    """The controller id pinned for ``machine``: the previous record's when it is of this very instance, else ""
    (an instance new to this record: its first bootstrap pins one). An instance that replaced the recorded
    one booted from the image, not from the old disk, so its new state directory has a new id; a VM cannot
    make itself a new instance (powered off, it stays the same one)."""
    if previous is None or previous.machine is None or machine is None:
        return ""
    if (previous.machine.cloud, previous.machine.instance_id) != (machine.cloud, machine.instance_id):
        return ""
    return previous.controller_id


def find_controller_id(record: ControllerRecord, reported: str | None) -> str:
    """The controller id to scope ``record``'s VM permissions to, from what its controller ``reported``: it
    must be a store's (``cloud_secrets.check_controller_id``) and the one pinned in ``record`` if any. Raises
    ``ControllerError`` saying which, and that nothing was granted."""
    from skyserve_lite.providers.cloud_secrets import check_controller_id

    where = record.target.url
    if not reported:
        raise ControllerError(f"the controller on {where} did not say its controller id; run "
                              "`sky-lite controller up` again")
    try:
        controller_id = check_controller_id(reported)
    except ValueError as exc:
        raise ControllerError(f"the controller on {where} says its controller id is {reported[:40]!r}, which is not "
                              "one a sky-lite store makes (12 lowercase hex digits); nothing was granted: the VM "
                              "may be compromised") from exc
    if record.controller_id and controller_id != record.controller_id:
        raise ControllerError(
            f"the controller on {where} says its controller id is {controller_id}, but {record.controller_id} "
            "was pinned when this VM was first set up; nothing was granted: its state directory was replaced, "
            "or the VM is compromised. If you replaced it, `sky-lite controller down` and `controller up` make a "
            "new VM")
    return controller_id


def establish_host_keys(home: Path, target: SshTarget, *, pinned: Sequence[str], cloud: Sequence[str] | None,
                        expected: str | None, say: Say) -> list[str]:
    """The host keys to pin for ``target`` (known_hosts lines): what the host proves on a strict login that
    trusts only what ``ssh.plan_host_keys`` decides from ``pinned``, ``cloud`` and ``expected`` (see there).
    Writes nothing but a scratch file. Raises ``HostKeyError`` or ``ControllerError``."""
    plan = ssh.plan_host_keys(target, pinned=pinned, cloud=cloud, expected=expected)
    trusted = plan.trust
    if plan.scan_for is not None:
        trusted = tuple(ssh.pick_expected(ssh.scan_host_keys(target), plan.scan_for, target))
    say(f"checking the host key against {plan.source}")
    return ssh.prove_host_keys(target, plan, trusted, home / "ssh")


def install_wheel(shell: bootstrap.RemoteShell, plan: bootstrap.HostPlan, home_there: str, *, restart: bool,
                  say: Say) -> None:
    from skyserve_lite.remote.wheel import build_wheel

    with tempfile.TemporaryDirectory(prefix="sky-lite-wheel-") as folder:
        bootstrap.install(shell, plan, home_there, build_wheel(Path(folder)), restart=restart, say=say)


def host_settings_of(record: ControllerRecord) -> HostSettings:
    """Where the recorded host's load balancers listen and what its endpoints show: its interfaces and the
    address clients reach (a VM's public one); loopback only for a host on 127.0.0.1 (an emulated VM)."""
    target = record.target
    if record.machine is not None and record.machine.address:
        emulated = target.is_loopback
        # A VM an older sky-lite launched has no replica profile or account: its replicas keep getting none.
        made = dict(record.machine.resources)
        cloud = record.machine.cloud
        return HostSettings(lb_host="127.0.0.1" if emulated else "0.0.0.0",
                            endpoint_host="127.0.0.1" if emulated else record.machine.address,
                            aws_instance_profile=made.get("replica-instance-profile") if cloud == "aws" else None,
                            gcp_service_account=made.get("replica-service-account") if cloud == "gcp" else None)
    if is_loopback_address(target.host):
        # A host on a loopback address of this machine (127.0.0.2, 127.0.0.3 ... one per controller, as tests
        # run several; or ::1): its load balancers bind that address only, so each host has its own
        # endpoints, and they answer at the address the endpoints show.
        return HostSettings(lb_host=target.host, endpoint_host=target.host)
    return HostSettings(lb_host="127.0.0.1" if target.is_loopback else "0.0.0.0", endpoint_host=target.host)


class Machines(Protocol):
    """A cloud's controller VMs (``aws_machine.AwsMachines``, ``gcp_machine.GcpMachines``). ``location`` is
    where the machine is: the region on AWS, the zone on GCP."""

    def ensure(self, request: MachineRequest) -> LaunchedMachine: ...

    def wait_running(self, machine_id: str, location: str) -> LaunchedMachine: ...

    def grant(self, machine_id: str, location: str, controller_id: str) -> list[str]: ...

    def delete(self, machine_id: str, location: str) -> list[str]: ...

    def host_keys(self, instance_id: str, location: str) -> tuple[str, ...]:
        """The instance's SSH host keys as the cloud's API reports them (``TYPE BASE64`` each), which the
        cloud had from the instance itself at boot; empty when it reports none (yet)."""
        ...


def launch_machine(home: Path, previous: ControllerRecord | None, request: CloudRequest, say: Say
                   ) -> tuple[SshTarget, CloudMachine, tuple[str, ...]]:
    """Launch (or find) the controller VM and wait until its sshd answers; where to log in, what was
    made, and the host keys the cloud reports for it (waited for unless keys pinned for this same instance
    can be checked instead; empty when the cloud showed none)."""
    from skyserve_lite.providers import available_clouds

    if request.cloud not in available_clouds():
        package = {"aws": "aws", "gcp": "gcp"}.get(request.cloud, request.cloud)
        raise UsageError(f"--cloud {request.cloud} needs its library: pip install 'skyserve-lite[{package}]'")
    from skyserve_lite.providers.emulated_host import EmulatedHosts, make_key
    from skyserve_lite.providers.machines import MachineRequest

    old = previous.machine if previous is not None else None
    if old is not None and old.cloud != request.cloud:
        raise StateConflictError(f"this machine's controller VM is on {old.cloud}; take it down first with "
                                 "`sky-lite controller down`")
    machine_id = old.machine_id if old is not None and old.machine_id else secrets.token_hex(6)
    key = make_key(home / "ssh" / f"controller-{machine_id}")
    region = request.region or (old.region if old else None)
    if request.cloud == "aws" and not request.image_id and old is None:
        raise UsageError("--image-id: the controller VM needs an AMI of the region (Ubuntu 22.04 or later, or "
                         "any Linux with python3 >= 3.10 and OpenSSH)")
    if not request.ssh_cidr:
        raise UsageError("--ssh-cidr: say who may reach the controller VM's sshd (your address, e.g. "
                         "203.0.113.7/32)")
    machines, region = _machines(home, request.cloud, machine_id, region)
    say(f"launching the controller VM in {region}")
    launched = machines.ensure(MachineRequest(
        machine_id=machine_id, region=region, image_id=request.image_id or "", public_key=key.with_suffix(
            ".pub").read_text(), allow_cidr=request.allow_cidr, ssh_cidr=request.ssh_cidr,
        lb_ports=(LB_PORT_START, LB_PORT_END), instance_type=request.instance_type,
        zone=request.zone or (old.zone if old else None), ssh_user=request.ssh_user))
    location = launched.region  # the zone on GCP
    running = machines.wait_running(machine_id, location)
    address = running.public_ip or running.private_ip
    if address is None:
        raise ControllerError(f"the controller VM {running.instance_id} has no address")
    machine = CloudMachine(cloud=request.cloud, region=region, instance_id=running.instance_id,
                           resources=launched.resources, machine_id=machine_id, address=address,
                           zone=location if request.cloud == "gcp" else None)
    if os.environ.get("SKY_LITE_EMULATE_INSTANCES") == "1":
        # The emulator's instance cannot be reached: boot it here, as an sshd on 127.0.0.1 (see emulated_host).
        host = EmulatedHosts(home).boot(_host_folder(running.instance_id), key.with_suffix(".pub").read_text())
        target = SshTarget("127.0.0.1", host.port, getpass.getuser(), key)
    else:
        target = SshTarget(address, 22, request.ssh_user, key)
    say(f"waiting for ssh on {target.url} ({running.instance_id})")
    _wait_for_sshd(target)
    if os.environ.get("SKY_LITE_EMULATE_INSTANCES") == "1":
        return target, machine, _emulated_host_keys(home, running.instance_id)
    pinned_here = old is not None and old.instance_id == running.instance_id and previous is not None and bool(
        previous.host_keys)
    say("reading the VM's host keys from the cloud")
    keys = wait_for_cloud_host_keys(machines, running.instance_id, location,
                                    timeout_seconds=0 if pinned_here else HOST_KEYS_WAIT_SECONDS)
    return target, machine, keys


def wait_for_cloud_host_keys(machines: Machines, instance_id: str, location: str, *, timeout_seconds: float,
                             sleep: Callable[[float], None] = time.sleep,
                             now: Callable[[], float] = time.monotonic) -> tuple[str, ...]:
    """Ask the cloud for the instance's host keys until it reports some or ``timeout_seconds`` pass (0:
    ask once); what it last reported. Raises ``ProviderError``."""
    deadline = now() + timeout_seconds
    while True:
        keys = machines.host_keys(instance_id, location)
        if keys or now() >= deadline:
            return keys
        sleep(HOST_KEYS_POLL_SECONDS)


def _emulated_host_keys(home: Path, instance_id: str) -> tuple[str, ...]:
    """What the cloud reports for an emulated VM: the key its sshd was made with (the cloud emulator knows
    no console or guest attributes of an instance it does not run)."""
    from skyserve_lite.providers.emulated_host import EmulatedHosts

    path = EmulatedHosts(home).root / _host_folder(instance_id) / "host_ed25519.pub"
    return (path.read_text().strip(),)


def grant_machine(home: Path, record: ControllerRecord, say: Say) -> ControllerRecord:
    """Give the recorded VM's identity the permissions its controller needs, scoped to the controller id its
    state directory has (asked over the protocol: a VM an older sky-lite set up has its own), through
    ``apply_grant``. Idempotent; the record as saved."""
    from skyserve_lite.remote.connect import open_remote

    machine = record.machine
    assert machine is not None
    reported = open_remote(home, record).describe().controller_id
    machines, _region = _machines(home, machine.cloud, machine.machine_id, machine.region)
    return apply_grant(home, record, reported, machines, say)


def apply_grant(home: Path, record: ControllerRecord, reported: str | None, machines: Machines, say: Say
                ) -> ControllerRecord:
    """Grant ``record``'s VM what its controller needs for the id it ``reported`` (``find_controller_id``
    decides; refused, nothing is granted or saved), pinning that id in the record first if none is.
    Idempotent; the record as saved. Raises ``ControllerError`` or ``ProviderError``."""
    machine = record.machine
    assert machine is not None
    controller_id = find_controller_id(record, reported)
    if record.controller_id != controller_id:
        record = replace(record, controller_id=controller_id)
        config.save_record(home, record)
        say(f"pinned controller id {controller_id}: a later `controller up` refuses this VM saying another")
    for line in machines.grant(machine.machine_id, machine.zone or machine.region, controller_id):
        say(line)
    return record


def take_down_machine(home: Path, machine: CloudMachine, say: Say) -> None:
    """Terminate the controller VM and delete what was made for it (idempotent)."""
    from skyserve_lite.providers.emulated_host import EmulatedHosts

    machines, _region = _machines(home, machine.cloud, machine.machine_id, machine.region)
    for line in machines.delete(machine.machine_id, machine.zone or machine.region):
        say(line)
    EmulatedHosts(home).stop(_host_folder(machine.instance_id))
    (home / "ssh" / f"controller-{machine.machine_id}").unlink(missing_ok=True)
    (home / "ssh" / f"controller-{machine.machine_id}.pub").unlink(missing_ok=True)


def _host_folder(instance_id: str) -> str:
    """An emulated host's folder name (a GCE instance id is ``zone/name``)."""
    return instance_id.replace("/", "_")


def _machines(home: Path, cloud: str, machine_id: str, region: str | None) -> tuple[Machines, str]:
    from skyserve_lite.clock import SystemClock
    from skyserve_lite.files.blobs import blob_store_of

    if cloud == "gcp":
        from skyserve_lite.providers.gcp import REGION_SETTING, GcpProvider
        from skyserve_lite.providers.gcp_machine import GcpMachines

        found = region or os.environ.get(REGION_SETTING)
        if not found:
            raise UsageError(f"--region: no region given and {REGION_SETTING} is not set")
        gcp = GcpProvider.from_env(machine_id, SystemClock(), blob_store_of(home))
        return GcpMachines(gcp), found
    from skyserve_lite.providers.aws import AwsProvider
    from skyserve_lite.providers.aws_machine import AwsMachines

    provider = AwsProvider(machine_id, SystemClock(), blobs=blob_store_of(home), default_region=region)
    found = region or provider.default_region()
    if not found:
        raise UsageError("--region: no region given and AWS has no default (set AWS_DEFAULT_REGION)")
    return AwsMachines(provider), found


def _wait_for_sshd(target: SshTarget, timeout_seconds: float = SSH_WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            ssh.scan_host_keys(target, timeout_seconds=5)
            return
        except ControllerError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(3)
