"""A controller VM on Compute Engine: what `sky-lite controller up --cloud gcp` launches and `controller down`
removes; the twin of ``aws_machine`` on ``GcpProvider``'s API path (its clients, retries and translation).

Named ``sky-lite-controller-<id>`` after the machine id recorded in the local state directory, so a rerun
finds what an interrupted one made:

- two firewall rules on the network tag ``sky-lite-controller-<id>``: ``-lb`` opens the load balancer port
  range to ``allow_cidr``, ``-ssh`` opens 22 to ``ssh_cidr``; nothing else;
- one instance (``instances.insert``, idempotent by name) with an external address, the login key in its
  ``ssh-keys`` metadata, and the project's default service account with the ``cloud-platform`` scope: the
  controller's cloud access is the VM's own identity, never credentials copied from here.

``delete`` removes them again, tolerating what is gone already.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from skyserve_lite.errors import TransientProviderError
from skyserve_lite.providers.gcp import DEFAULT_IMAGE, GcpPermanentError, GcpProvider, _as_dict, _image_url
from skyserve_lite.providers.machines import LaunchedMachine, MachineRequest, wait_until_running

LABEL_HOST = "sky-lite-controller-host"
DEFAULT_MACHINE_TYPE = "e2-small"


class GcpMachines:
    """Controller VMs; the constructor makes nothing. A machine's ``region`` here is its zone."""

    def __init__(self, provider: GcpProvider, sleep: Callable[[float], None] = time.sleep) -> None:
        self._gcp = provider
        self._sleep = sleep

    def find_zone(self, region: str, zone: str | None) -> str:
        return zone or self._gcp._list_zones(region)[0]

    def ensure(self, request: MachineRequest) -> LaunchedMachine:
        """Make (or find) the firewall rules and the instance in ``request.zone``. Idempotent."""
        zone = self.find_zone(request.region, request.zone)
        tag = request.name
        low, high = request.lb_ports
        rules = {f"{request.name}-lb": (f"{low}-{high}", request.allow_cidr),
                 f"{request.name}-ssh": ("22", request.ssh_cidr)}
        for name, (ports, cidr) in rules.items():
            self._ensure_rule(name, tag, ports, cidr)
        resources = (("firewall", f"{request.name}-lb"), ("firewall", f"{request.name}-ssh"))
        found = self.find(request.machine_id, zone)
        if found is None:
            body: dict[str, Any] = {
                "name": request.name,
                "machine_type": f"zones/{zone}/machineTypes/{request.instance_type or DEFAULT_MACHINE_TYPE}",
                "labels": {LABEL_HOST: request.machine_id},
                "tags": {"items": [tag]},
                "disks": [{"boot": True, "auto_delete": True,
                           "initialize_params": {"source_image": _image_url(request.image_id or DEFAULT_IMAGE)}}],
                "network_interfaces": [{"network": "global/networks/default",
                                        "access_configs": [{"name": "External NAT", "type_": "ONE_TO_ONE_NAT"}]}],
                "metadata": {"items": [{"key": "ssh-keys",
                                        "value": f"{request.ssh_user}:{request.public_key.strip()}"},
                                       *HOST_KEY_METADATA]},
                "service_accounts": [{"email": "default",
                                      "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}],
            }
            self._gcp._wait(self._gcp._call("instances", "insert", project=self._gcp._get_project(), zone=zone,
                                            instance_resource=body), "instances.insert")
            found = self.find(request.machine_id, zone)
            if found is None:
                raise TransientProviderError(f"the controller VM {request.name} is not visible yet")
        return LaunchedMachine(found.instance_id, zone, found.state, found.public_ip, found.private_ip, resources)

    def find(self, machine_id: str, zone: str) -> LaunchedMachine | None:
        try:
            raw = _as_dict(self._gcp._call("instances", "get", project=self._gcp._get_project(), zone=zone,
                                           instance=f"sky-lite-controller-{machine_id}"))
        except GcpPermanentError as exc:
            if _is_not_found(exc):
                return None
            raise
        interface = (raw.get("networkInterfaces") or [{}])[0]
        nat = next((a.get("natIP") for a in interface.get("accessConfigs", []) if a.get("natIP")), None)
        return LaunchedMachine(f"{zone}/{raw['name']}", zone, str(raw.get("status", "")), nat,
                               interface.get("networkIP"), ())

    def wait_running(self, machine_id: str, zone: str, timeout_seconds: float = 600) -> LaunchedMachine:
        """Poll until the machine's instance runs (``machines.wait_until_running``)."""
        return wait_until_running(lambda: self.find(machine_id, zone),
                                  f"the controller VM of {machine_id} in {zone}", "RUNNING",
                                  ("STOPPING", "TERMINATED", "SUSPENDED"), self._sleep, timeout_seconds)

    def delete(self, machine_id: str, zone: str, timeout_seconds: float = 600, poll_seconds: float = 5) -> list[str]:
        """Delete the instance (waiting until it is gone) and the firewall rules; what was deleted."""
        name = f"sky-lite-controller-{machine_id}"
        project = self._gcp._get_project()
        done: list[str] = []
        if self.find(machine_id, zone) is not None:
            self._gcp._wait(self._gcp._call("instances", "delete", project=project, zone=zone, instance=name),
                            "instances.delete")
            done.append(f"deleted instance {zone}/{name}")
            deadline = time.monotonic() + timeout_seconds
            while self.find(machine_id, zone) is not None:
                if time.monotonic() >= deadline:
                    raise TransientProviderError(f"{name} is not gone after {timeout_seconds:g}s; run "
                                                 "`controller down` again")
                self._sleep(poll_seconds)
        for rule in (f"{name}-lb", f"{name}-ssh"):
            try:
                self._gcp._wait(self._gcp._call("firewalls", "delete", project=project, firewall=rule),
                                "firewalls.delete")
                done.append(f"deleted firewall rule {rule}")
            except GcpPermanentError as exc:
                if not _is_not_found(exc):
                    raise
        return done

    def host_keys(self, instance_id: str, location: str) -> tuple[str, ...]:
        """The instance's SSH host keys from its guest attributes (``host_keys_of``)."""
        return host_keys_of(self._gcp, instance_id, location)

    def _ensure_rule(self, name: str, tag: str, ports: str, cidr: str) -> None:
        project = self._gcp._get_project()
        try:
            self._gcp._call("firewalls", "get", project=project, firewall=name)
            return
        except GcpPermanentError as exc:
            if not _is_not_found(exc):
                raise
        rule = {"name": name, "network": "global/networks/default", "direction": "INGRESS",
                "source_ranges": [cidr], "target_tags": [tag], "allowed": [{"I_p_protocol": "tcp", "ports": [ports]}],
                "description": "sky-lite controller VM"}
        self._gcp._wait(self._gcp._call("firewalls", "insert", project=project, firewall_resource=rule),
                        "firewalls.insert")


def _is_not_found(exc: GcpPermanentError) -> bool:
    from google.api_core import exceptions as core

    return exc.code == "notFound" or isinstance(exc.__cause__, core.NotFound)

# --- the VM's host keys, as the cloud saw them ------------------------------------------------------------
# The guest agent publishes the VM's host keys as guest attributes (namespace "hostkeys") only where they are
# enabled: on the instance, since a project's setting is not ours to change.
HOST_KEY_METADATA = ({"key": "enable-guest-attributes", "value": "TRUE"},)


def host_keys_of(gcp: GcpProvider, instance_id: str, zone: str) -> tuple[str, ...]:
    """The instance's SSH host keys from its ``hostkeys/`` guest attributes (``find_guest_attribute_host_keys``);
    empty until the guest agent has published them. ``instance_id`` is ``zone/name``. Raises
    ``ProviderError``."""
    try:
        raw = _as_dict(gcp._call("instances", "get_guest_attributes", request={
            "project": gcp._get_project(), "zone": zone, "instance": instance_id.rsplit("/", 1)[-1],
            "query_path": "hostkeys/"}))
    except GcpPermanentError as exc:
        if _is_not_found(exc):  # nothing published under hostkeys/ yet
            return ()
        raise
    return find_guest_attribute_host_keys((raw.get("queryValue") or {}).get("items") or [])


def find_guest_attribute_host_keys(items: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The host keys (``TYPE BASE64``, sorted) among guest attribute entries (``namespace``, ``key``,
    ``value``): each ``hostkeys`` entry names a key type and holds its base64 blob. Only the value's first
    word counts (a value with a newline must not add a line to a known_hosts file), and a blob that is not a
    key of the type named is skipped. Pure."""
    from skyserve_lite.remote.ssh import parse_public_key

    keys = set()
    for item in items:
        words = str(item.get("value") or "").split()
        if item.get("namespace") != "hostkeys" or not words:
            continue
        found = parse_public_key(str(item.get("key") or ""), words[0])
        if found is not None:
            keys.add(found)
    return tuple(sorted(keys))
