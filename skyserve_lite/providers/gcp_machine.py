"""A controller VM on Compute Engine: what `sky-lite controller up --cloud gcp` launches and `controller down`
removes; the twin of ``aws_machine`` on ``GcpProvider``'s API path (its clients, retries and translation).

Named ``sky-lite-controller-<id>`` after the machine id recorded in the local state directory, so a rerun
finds what an interrupted one made:

- a service account ``sky-lite-ctl-<id>``, the VM's own identity: the controller's cloud access is never
  credentials copied from here;
- a service account ``sky-lite-rep-<id>`` for the replicas that VM's controller launches (the host settings
  name it, so its GCP provider gives it to every replica: ``SKY_LITE_GCP_SERVICE_ACCOUNT`` there still wins);
  a task's secrets need an account of the replicas' own (``gcp.py``), and the project's default one often
  holds Editor;
- two firewall rules on the network tag ``sky-lite-controller-<id>``: ``-lb`` opens the load balancer port
  range to ``allow_cidr``, ``-ssh`` opens 22 to ``ssh_cidr``; nothing else (a rule an earlier run made for
  another block is replaced);
- one instance (``instances.insert``, idempotent by name) with an external address, the login key in its
  ``ssh-keys`` metadata, running as that service account with the ``cloud-platform`` scope (IAM, not the
  scope, is what limits it).

Both accounts get their roles afterwards, from ``grant``, once the VM's controller has said its controller
id: ``plan_controller_grants`` and ``plan_replica_grants`` are pure functions of a ``GcpScope`` giving each
role on the narrowest resource that can hold it (the project only for Compute Engine, whose instances and
firewall rules have nothing narrower before they exist; buckets and secrets by a condition on their names;
acting as the replicas' service account on that account alone). Each kind of resource is one small function
in ``CONTROLLER_GRANTS`` or ``REPLICA_GRANTS``; granting a new kind adds a function there.

``delete`` removes them again, tolerating what is gone already.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skyserve_lite.errors import TransientProviderError
from skyserve_lite.providers.cloud_secrets import check_controller_id, compute_secret_prefix
from skyserve_lite.providers.gcp import (
    CLOUD_PLATFORM_SCOPE,
    DEFAULT_IMAGE,
    GcpPermanentError,
    GcpProvider,
    _as_dict,
    _image_url,
)
from skyserve_lite.providers.gcp_iam import Condition, GcpIam, Grant
from skyserve_lite.providers.machines import LaunchedMachine, MachineRequest, wait_until_running
from skyserve_lite.providers.staging import compute_bucket_prefix

LABEL_HOST = "sky-lite-controller-host"
DEFAULT_MACHINE_TYPE = "e2-small"
# A new service account takes a few seconds to be usable by Compute Engine (IAM is eventually consistent).
ACCOUNT_WAIT_ATTEMPTS = 12
ACCOUNT_WAIT_SECONDS = 5.0


# IAM's rule for a service account id: 6 to 30 characters. A machine id is 12 hex digits (``hosting``), so
# "sky-lite-ctl-" or "sky-lite-rep-" and the id are 13 + 12 = 25; "sky-lite-controller-<id>" (32) would not fit.
_ACCOUNT_ID = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]")


def _account_id(prefix: str, machine_id: str) -> str:
    account = f"{prefix}-{machine_id}"
    if not _ACCOUNT_ID.fullmatch(account):
        raise GcpPermanentError(f"the machine id {machine_id!r} of controller.json makes {account!r}, which is not a "
                                "service account id (6 to 30 lowercase letters, digits and -)", "InvalidAccountId")
    return account


def controller_account_id(machine_id: str) -> str:
    """The controller VM's service account id. Raises ``GcpPermanentError`` for a machine id that makes none."""
    return _account_id("sky-lite-ctl", machine_id)


def controller_account_email(project: str, machine_id: str) -> str:
    return f"{controller_account_id(machine_id)}@{project}.iam.gserviceaccount.com"


def replica_account_id(machine_id: str) -> str:
    """The service account id of the replicas the VM's controller launches. Raises ``GcpPermanentError`` as
    ``controller_account_id`` does."""
    return _account_id("sky-lite-rep", machine_id)


def replica_account_email(project: str, machine_id: str) -> str:
    return f"{replica_account_id(machine_id)}@{project}.iam.gserviceaccount.com"


def default_compute_account(project_number: str) -> str:
    """The project's default compute service account: what replicas ran as on a VM an older sky-lite made."""
    return f"{project_number}-compute@developer.gserviceaccount.com"


def _default_account_resource(project: str, project_number: str) -> str:
    return f"projects/{project}/serviceAccounts/{default_compute_account(project_number)}"


@dataclass(frozen=True)
class GcpScope:
    """What a controller VM's service account and its replicas' one are granted roles on."""

    project: str
    project_number: str  # what IAM's resource names of secrets carry instead of the project id
    controller_id: str  # of the VM's own state directory: the prefix of its buckets and secrets
    replica_account: str  # the service account its replicas run as (``replica_account_email``)

    def __post_init__(self) -> None:
        # The id lands in IAM conditions, where a pattern or a quote would reach other controllers' resources.
        check_controller_id(self.controller_id)

    @property
    def project_resource(self) -> str:
        return f"projects/{self.project}"


def _compute_grants(scope: GcpScope) -> list[Grant]:
    """Instances in any zone, their disks, and the replicas' firewall rules: Compute Engine grants on a project
    or on a resource that exists, and these are created by the calls themselves, so the project it is."""
    return [Grant(scope.project_resource, "roles/compute.instanceAdmin.v1"),
            Grant(scope.project_resource, "roles/compute.securityAdmin")]


def _buckets_condition(scope: GcpScope) -> Condition:
    """The controller's own buckets (``staging.compute_bucket_prefix``) and their objects, by name: a bucket to
    be created has no policy of its own to grant on."""
    prefix = compute_bucket_prefix(scope.controller_id)
    return Condition(title=f"sky-lite controller {scope.controller_id} buckets",
                     expression=f'resource.name.startsWith("projects/_/buckets/{prefix}")')


def _bucket_grants(scope: GcpScope) -> list[Grant]:
    """The snapshot buckets, created, written and deleted by ``staging.SnapshotStager``."""
    return [Grant(scope.project_resource, "roles/storage.admin", _buckets_condition(scope))]


def _act_as_grants(scope: GcpScope) -> list[Grant]:
    """Launching an instance that runs as a service account needs acting as it: the replicas' one only."""
    return [Grant(f"projects/{scope.project}/serviceAccounts/{scope.replica_account}", "roles/iam.serviceAccountUser")]


def _secret_grants(scope: GcpScope) -> list[Grant]:
    """Secret Manager, for ``gcp._SecretManager``: create and list secrets (permissions on the project itself,
    where a secret to be created has no policy yet), and on the secrets ``sky-lite_<controller id>_*`` only:
    add a version, list versions, set the policy, delete. Only ``secretmanager.admin`` holds create and
    setIamPolicy among Google's roles; the condition keeps it to the project resource (create, list: names and
    labels, never values) and to this controller's secrets. IAM names a secret by the project number."""
    prefix = compute_secret_prefix(scope.controller_id)
    return [Grant(scope.project_resource, "roles/secretmanager.admin", Condition(
        title=f"sky-lite controller {scope.controller_id} secrets",
        expression=('resource.type == "cloudresourcemanager.googleapis.com/Project" || '
                    f'resource.name.startsWith("projects/{scope.project_number}/secrets/{prefix}")')))]


def _replica_file_grants(scope: GcpScope) -> list[Grant]:
    """The startup script copies the snapshot's file list and blobs from the service's bucket (objects.get);
    ``objectViewer`` is the narrowest role a project can hold for it (the legacy bucket roles are granted
    on a bucket, which does not exist yet)."""
    return [Grant(scope.project_resource, "roles/storage.objectViewer", _buckets_condition(scope))]


GrantGroup = Callable[[GcpScope], list[Grant]]
CONTROLLER_GRANTS: tuple[GrantGroup, ...] = (_compute_grants, _bucket_grants, _act_as_grants, _secret_grants)
# The secrets are not here: each secret's own policy names the replicas' account (``gcp._SecretManager``).
REPLICA_GRANTS: tuple[GrantGroup, ...] = (_replica_file_grants,)


def plan_controller_grants(scope: GcpScope) -> tuple[Grant, ...]:
    """Every grant of ``CONTROLLER_GRANTS`` for ``scope``: the VM's own account's. Pure."""
    return tuple(grant for group in CONTROLLER_GRANTS for grant in group(scope))


def plan_replica_grants(scope: GcpScope) -> tuple[Grant, ...]:
    """Every grant of ``REPLICA_GRANTS`` for ``scope``: the replicas' account's. Pure."""
    return tuple(grant for group in REPLICA_GRANTS for grant in group(scope))


class GcpMachines:
    """Controller VMs; the constructor makes nothing. A machine's ``region`` here is its zone."""

    def __init__(self, provider: GcpProvider, sleep: Callable[[float], None] = time.sleep,
                 iam: GcpIam | None = None) -> None:
        self._gcp = provider
        self._sleep = sleep
        self._iam = iam or GcpIam(provider)

    def find_zone(self, region: str, zone: str | None) -> str:
        return zone or self._gcp._list_zones(region)[0]

    def ensure(self, request: MachineRequest) -> LaunchedMachine:
        """Make (or find) the two service accounts, the firewall rules and the instance in ``request.zone``;
        the accounts' roles are ``grant``'s. Idempotent: a rerun makes only what is missing."""
        zone = self.find_zone(request.region, request.zone)
        project = self._gcp._get_project()
        account = str(self._iam.create_service_account(project, controller_account_id(request.machine_id),
                                                       f"sky-lite controller VM {request.machine_id}")["email"])
        replicas = str(self._iam.create_service_account(project, replica_account_id(request.machine_id),
                                                        f"replicas of sky-lite controller VM {request.machine_id}"
                                                        )["email"])
        tag = request.name
        low, high = request.lb_ports
        rules = {f"{request.name}-lb": (f"{low}-{high}", request.allow_cidr),
                 f"{request.name}-ssh": ("22", request.ssh_cidr)}
        for name, (ports, cidr) in rules.items():
            self._ensure_rule(name, tag, ports, cidr)
        # The host settings name "replica-service-account" (``hosting.host_settings_of``).
        resources = (("service-account", account), ("replica-service-account", replicas),
                     ("firewall", f"{request.name}-lb"), ("firewall", f"{request.name}-ssh"))
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
                "service_accounts": [{"email": account, "scopes": [CLOUD_PLATFORM_SCOPE]}],
            }
            self._insert_as(account, lambda: self._gcp._wait(self._gcp._call(
                "instances", "insert", project=project, zone=zone, instance_resource=body), "instances.insert"))
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

    def grant(self, machine_id: str, zone: str, controller_id: str) -> list[str]:
        """Give the VM's service account the roles of ``plan_controller_grants`` and the replicas' one those of
        ``plan_replica_grants`` for ``controller_id``, the id of the VM's own state directory, and no others
        (the VM's account leaves the project's default compute account, which an older sky-lite had it act
        as); what was granted, one line each. Idempotent. Raises ``ProviderError``."""
        project = self._gcp._get_project()
        email = controller_account_email(project, machine_id)
        replicas = replica_account_email(project, machine_id)
        for account in (email, replicas):
            if self._iam.find_service_account(project, account) is None:
                raise GcpPermanentError(f"the service account {account} of the controller VM is gone; run "
                                        "`sky-lite controller up` again", "notFound")
        scope = GcpScope(project=project, project_number=self._iam.project_number(project),
                         controller_id=controller_id.lower(), replica_account=replicas)
        done = self._bind(email, plan_controller_grants(scope)) + self._bind(replicas, plan_replica_grants(scope))
        done += self._unbind(email, (_default_account_resource(project, scope.project_number),))
        raw = _as_dict(self._gcp._call("instances", "get", project=project, zone=zone,
                                       instance=f"sky-lite-controller-{machine_id}"))
        running_as = str(((raw.get("serviceAccounts") or [{}])[0]).get("email") or "")
        if running_as != email:
            # A VM's service account can be changed only while it is stopped: it is not done behind your back.
            done.append(f"the VM runs as {running_as or 'no service account'} (an older sky-lite launched it), with "
                        f"that account's permissions; `sky-lite controller down --force` and `controller up` make "
                        f"a VM that runs as {email}")
        return done

    def wait_running(self, machine_id: str, zone: str, timeout_seconds: float = 600) -> LaunchedMachine:
        """Poll until the machine's instance runs (``machines.wait_until_running``)."""
        return wait_until_running(lambda: self.find(machine_id, zone),
                                  f"the controller VM of {machine_id} in {zone}", "RUNNING",
                                  ("STOPPING", "TERMINATED", "SUSPENDED"), self._sleep, timeout_seconds)

    def delete(self, machine_id: str, zone: str, timeout_seconds: float = 600, poll_seconds: float = 5) -> list[str]:
        """Delete the instance (waiting until it is gone), the firewall rules, and the two service accounts
        after taking each out of its bindings (the replicas' first: its own policy goes with it); what was deleted, one
        line each. Idempotent."""
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
            if self._delete_rule(project, rule):
                done.append(f"deleted firewall rule {rule}")
        email = controller_account_email(project, machine_id)
        replicas = replica_account_email(project, machine_id)
        if self._iam.find_service_account(project, replicas) is not None:
            done += self._unbind(replicas, (f"projects/{project}",))
            if self._iam.delete_service_account(project, replicas):
                done.append(f"deleted service account {replicas}")
        if self._iam.find_service_account(project, email) is not None:
            done += self._unbind(email, (f"projects/{project}", _default_account_resource(
                project, self._iam.project_number(project))))
            if self._iam.delete_service_account(project, email):
                done.append(f"deleted service account {email}")
        return done

    def host_keys(self, instance_id: str, location: str) -> tuple[str, ...]:
        """The instance's SSH host keys from its guest attributes (``host_keys_of``)."""
        return host_keys_of(self._gcp, instance_id, location)

    def _bind(self, account: str, grants: Sequence[Grant]) -> list[str]:
        """``account`` in exactly ``grants`` on each resource they name (``GcpIam.bind``); a line each."""
        done = []
        for resource in dict.fromkeys(g.resource for g in grants):
            mine = [g for g in grants if g.resource == resource]
            changed = self._iam.bind(resource, f"serviceAccount:{account}", mine)
            roles = ", ".join(g.role + (f" ({g.condition.title})" if g.condition else "") for g in mine)
            done.append(f"{'granted' if changed else 'kept'} {account} {roles} on {resource}")
        return done

    def _unbind(self, account: str, resources: Sequence[str]) -> list[str]:
        """``account`` out of every binding on ``resources``; a line for each it was in. A resource that is gone
        has none (the default compute service account may have been deleted)."""
        done = []
        for resource in resources:
            try:
                if self._iam.bind(resource, f"serviceAccount:{account}", []):
                    done.append(f"removed the roles of {account} on {resource}")
            except GcpPermanentError as exc:
                if not _is_not_found(exc):
                    raise
        return done

    def _insert_as(self, account: str, insert: Callable[[], None]) -> None:
        for attempt in range(ACCOUNT_WAIT_ATTEMPTS):
            try:
                insert()
                return
            except GcpPermanentError as exc:
                if account not in str(exc) or attempt == ACCOUNT_WAIT_ATTEMPTS - 1:
                    raise
                self._sleep(ACCOUNT_WAIT_SECONDS)

    def _delete_rule(self, project: str, rule: str) -> bool:
        try:
            self._gcp._wait(self._gcp._call("firewalls", "delete", project=project, firewall=rule),
                            "firewalls.delete")
            return True
        except GcpPermanentError as exc:
            if not _is_not_found(exc):
                raise
            return False

    def _ensure_rule(self, name: str, tag: str, ports: str, cidr: str) -> None:
        project = self._gcp._get_project()
        try:
            found = _as_dict(self._gcp._call("firewalls", "get", project=project, firewall=name))
        except GcpPermanentError as exc:
            if not _is_not_found(exc):
                raise
        else:
            if list(found.get("sourceRanges") or []) == [cidr]:
                return
            self._delete_rule(project, name)  # made for another block (an earlier --ssh-cidr): replaced
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
