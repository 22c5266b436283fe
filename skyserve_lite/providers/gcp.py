"""Replicas as Compute Engine instances, through google-cloud-compute's REST transport.

Every instance carries these labels (GCE label values: lowercase letters, digits, ``-`` and ``_``, at most
63 characters; the controller id, service names, versions and launch tokens all are)::

    sky-lite-controller    the controller id: the inventory lists exactly the instances with this label
    sky-lite-service       sky-lite-version       sky-lite-launch-token       sky-lite-port

and its name says its replica id: ``sky-<controller>-<batch>-r<replica id>``, where ``<batch>`` is a digest of
the service and launch token. A ``launch`` call is ``cloud.launch_in_batches``: instances an earlier attempt
of the same launch token started are adopted (one ``aggregatedList`` filtered by its token label), the rest
are grouped by region, zone and market and each group is one ``instances.bulkInsert`` naming every instance
(``perInstanceProperties``), which GCE treats as idempotent by name: a bulkInsert re-sent after a crash
creates nothing twice. A zoneless group tries the region's zones in order (``zones.list``, once per region)
and moves on when one has no capacity (ZONE_RESOURCE_POOL_EXHAUSTED, STOCKOUT, QUOTA_EXCEEDED).

The instance boots from the startup script (``boot_script`` with ``GCP_BOOT``: its replica id from its own
name on the metadata server, ``gcloud storage`` copies under the instance's own service account). Spot
instances are ``provisioningModel: SPOT`` with ``instanceTerminationAction: DELETE``; a spot instance that
disappears is reported PREEMPTED when its zone has a ``compute.instances.preempted`` operation for it.
A firewall rule per controller (``sky-lite-<controller>``) opens the service ports to the network's own
range for instances with the network tag ``sky-lite-<controller>``.

The inventory is one paginated ``instances.aggregatedList`` with a label filter per pass, whatever the
number of zones and replicas; ``terminate`` is one ``instances.delete`` per instance, sent concurrently and
not waited on.

Errors: google-api-core's exceptions (and google-auth's, for credentials) are translated by one function,
``translate_error``, at one boundary (``_call``): 429 and 5xx are retried a few times with a short backoff,
then a ``TransientProviderError``; permissions, invalid arguments and missing credentials are permanent
with a message naming what to fix.

Files: the version's snapshot is staged in the service's Cloud Storage bucket by ``staging.SnapshotStager``
(the same stager as AWS's S3: each blob once per digest, a file list per snapshot), and the startup script
applies it with the instance's own service account.

Secrets: each value goes to Secret Manager before the instances are asked for (``cloud_secrets.SecretKeeper``,
the same keeper as AWS's), readable by the replicas' service account alone (the secret's own IAM policy),
and the startup script names it; the instance reads it with ``gcloud`` under its own identity. Secret
Manager takes only the ``cloud-platform`` scope, so a task with secrets needs a service account of its own
for its replicas (``service_account``, from ``SKY_LITE_GCP_SERVICE_ACCOUNT``): the project's default one with
that scope could do whatever the default account's roles allow (often Editor). Google's Secret Manager
client library is not a dependency: its six REST calls go through google-auth's ``AuthorizedSession`` with
the provider's credentials, endpoint and error translation (``_SecretManager``).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, BinaryIO, ParamSpec, TypeVar

from skyserve_lite.clock import Clock
from skyserve_lite.errors import (
    PermanentProviderError,
    ProviderError,
    ProviderNotConfiguredError,
    TransientProviderError,
)
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.files.capture import needs_capture
from skyserve_lite.providers import cloud
from skyserve_lite.providers.base import Instance, InstanceState, LaunchOutcome, LaunchRequest, ReplicaLog
from skyserve_lite.providers.boot_script import (
    BootBatch,
    BootCloud,
    Fetch,
    find_mount_destination,
    find_placements,
    render_boot_script,
)
from skyserve_lite.providers.cloud import LaunchGroup, ZoneCapacityError, failed_outcome
from skyserve_lite.providers.cloud_secrets import SecretKeeper, compute_secret_prefix, find_cloud_secrets
from skyserve_lite.providers.staging import SnapshotStager
from skyserve_lite.spec.model import Pairs, Secret

log = logging.getLogger(__name__)

LABEL_CONTROLLER = "sky-lite-controller"
LABEL_SERVICE = "sky-lite-service"
LABEL_VERSION = "sky-lite-version"
LABEL_TOKEN = "sky-lite-launch-token"
LABEL_PORT = "sky-lite-port"
DEFAULT_MACHINE_TYPE = "e2-medium"
DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
DEFAULT_PORT = 8080
BULK_INSERT_LIMIT = 1000  # instances one bulkInsert may create
PAGE_SIZE = 500
RETRY_DELAYS = (0.25, 0.5, 1.0)
OPERATION_TIMEOUT_SECONDS = 300.0
CALL_TIMEOUT_SECONDS = 60.0
TERMINATE_CONCURRENCY = 16
PROJECT_SETTING = "SKY_LITE_GCP_PROJECT"
REGION_SETTING = "SKY_LITE_GCP_REGION"
ENDPOINT_SETTING = "SKY_LITE_GCP_ENDPOINT"  # e.g. a local fake of the API: http://127.0.0.1:PORT
SERVICE_ACCOUNT_SETTING = "SKY_LITE_GCP_SERVICE_ACCOUNT"  # the replicas' own service account (an email)
SECRET_MANAGER_URL = "https://secretmanager.googleapis.com"
SECRET_ACCESSOR = "roles/secretmanager.secretAccessor"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
STORAGE_READ_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
SECRETS_REGION = "global"  # Secret Manager's secrets are the project's, replicated by Google: one "region"
_CAPACITY_CODES = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                             "STOCKOUT", "QUOTA_EXCEEDED", "RESOURCE_POOL_EXHAUSTED"})
_NAME = re.compile(r"sky-[a-z0-9]+-[a-f0-9]{8}-r(?P<replica>\d+)")

GCP_BOOT = BootCloud(
    name="gcp",
    find_replica_id=(
        'name=$(curl -fsS -H "Metadata-Flavor: Google" '
        "http://metadata.google.internal/computeMetadata/v1/instance/name)",
        'replica_id="${name##*-r}"',
        'case ",$replica_ids," in *",$replica_id,"*) ;; *) replica_id="" ;; esac',
    ),
    copy_object='gcloud storage cp --quiet "$1" "$2"',
    copy_tree='gcloud storage cp --quiet --recursive "$1" "$2"',
    # gcloud prints the payload in URL-safe base64 (Google's own recipe turns it into the standard alphabet).
    read_secret="gcloud secrets versions access latest --secret=\"$1\" --format='get(payload.data)' | tr '_-' '/+'",
)

_P = ParamSpec("_P")
_R = TypeVar("_R")


class GcpTransientError(TransientProviderError):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class GcpCapacityError(GcpTransientError, ZoneCapacityError):
    """The zone has no capacity (or quota) for this request; another zone may."""


class GcpPermanentError(PermanentProviderError):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class GcpNotConfiguredError(GcpPermanentError, ProviderNotConfiguredError):
    """No Google Cloud credentials here at all."""


def translate_error(exc: Exception, operation: str) -> GcpTransientError | GcpPermanentError:
    """The one translation of google-api-core's and google-auth's exceptions into ``ProviderError``s."""
    from google.api_core import exceptions as core
    from google.auth import exceptions as auth

    if isinstance(exc, auth.DefaultCredentialsError):
        return GcpNotConfiguredError(f"{operation}: no Google Cloud credentials: set GOOGLE_APPLICATION_CREDENTIALS "
                                     "to a service account key file, or run `gcloud auth application-default login` "
                                     "(on a VM: give it a service account)", "NoCredentials")
    if isinstance(exc, auth.GoogleAuthError):
        return GcpPermanentError(f"{operation}: Google Cloud credentials were refused ({exc}); renew them",
                                 "BadCredentials")
    if isinstance(exc, core.GoogleAPICallError):
        reason = _reason(exc)
        message = f"{operation}: {exc.message or exc}"
        if reason in _CAPACITY_CODES:
            return GcpCapacityError(f"no capacity ({reason}: {exc.message})", reason)
        if isinstance(exc, (core.TooManyRequests, core.ServerError)):
            return GcpTransientError(f"{message} (Compute Engine busy; will retry)", reason or type(exc).__name__)
        if isinstance(exc, (core.Forbidden, core.PermissionDenied, core.Unauthorized)):
            return GcpPermanentError(f"{message}: the credentials lack a permission (grant the service account "
                                     "roles/compute.instanceAdmin.v1 on the project)", reason or "Forbidden")
        if isinstance(exc, core.NotFound):
            return GcpPermanentError(f"{message} (check the project, zone, image and machine type)",
                                     reason or "NotFound")
        return GcpPermanentError(message, reason or type(exc).__name__)
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)) or type(exc).__module__.startswith("requests"):
        return GcpTransientError(f"{operation}: cannot reach Compute Engine ({exc}); will retry", "Connection")
    return GcpPermanentError(f"{operation}: {exc}", type(exc).__name__)


def _reason(exc: Any) -> str:
    for error in getattr(exc, "errors", None) or ():
        if isinstance(error, Mapping):
            value = error.get("reason") or error.get("code")
            if value:
                return str(value)
    return ""


def _boundary(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run a public method inside the translation: whatever google raises leaves as a ``ProviderError``."""
    @functools.wraps(method)
    def translated(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except ProviderError:
            raise
        except Exception as exc:  # the provider boundary: every vendor error is translated here
            raise translate_error(exc, method.__name__) from exc
    return translated


def instance_name(controller_id: str, group: LaunchGroup, replica_id: int) -> str:
    """``sky-<controller>-<batch>-r<replica id>``: a valid GCE name (lowercase, at most 63 characters)."""
    batch = hashlib.sha256(f"{group.first.service}\0{group.first.launch_token}".encode()).hexdigest()[:8]
    return f"sky-{controller_id.lower()}-{batch}-r{replica_id}"


def parse_replica_id(name: str) -> int | None:
    match = _NAME.fullmatch(name)
    return int(match.group("replica")) if match else None


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def compute_state(raw: Mapping[str, Any]) -> tuple[InstanceState, str | None]:
    """What an instance's ``status`` means to the controller."""
    status = str(raw.get("status", ""))
    if status in ("PROVISIONING", "STAGING", "REPAIRING"):
        return InstanceState.PENDING, None
    if status == "RUNNING":
        return InstanceState.RUNNING, None
    spot = raw.get("scheduling", {}).get("provisioningModel") == "SPOT"
    if status in ("STOPPING", "TERMINATED", "SUSPENDING", "SUSPENDED"):
        if spot:
            return InstanceState.PREEMPTED, f"spot instance {status.lower()}"
        return InstanceState.EXITED, f"instance {status.lower()} (setup failed, or stopped from outside)"
    return InstanceState.PENDING, status.lower() or None


def describe_instance(raw: Mapping[str, Any], zone: str) -> Instance | None:
    """The ``Instance`` of a listed raw instance; None when it is not one of ours (no replica id in its name)."""
    name = str(raw.get("name", ""))
    replica_id = parse_replica_id(name)
    labels = raw.get("labels", {}) or {}
    if replica_id is None or LABEL_SERVICE not in labels:
        return None
    state, detail = compute_state(raw)
    address = next((n.get("networkIP") for n in raw.get("networkInterfaces", []) if n.get("networkIP")), None)
    port = str(labels.get(LABEL_PORT, ""))
    return Instance(instance_id=f"{zone}/{name}", service=str(labels[LABEL_SERVICE]), replica_id=replica_id,
                    version=int(labels.get(LABEL_VERSION, "0") or 0), state=state,
                    url=f"http://{address}:{port or DEFAULT_PORT}" if address and state is InstanceState.RUNNING
                    else None, region=region_of(zone), zone=zone,
                    is_spot=raw.get("scheduling", {}).get("provisioningModel") == "SPOT", detail=detail)


class GcpProvider:
    """Compute Engine instances of one controller. See the module docstring.

    Builds nothing in its constructor: credentials, the project and the clients come on first use.
    ``api_endpoint`` points the clients elsewhere (``SKY_LITE_GCP_ENDPOINT``: a local fake of the API).
    ``service_account`` (an email) is what replicas run as; None: the project's default one, which cannot
    carry secrets (see the module docstring).
    """

    name = "gcp"

    def __init__(self, controller_id: str, clock: Clock, *, blobs: BlobStore, project: str | None = None,
                 credentials: Any = None, api_endpoint: str | None = None, default_region: str | None = None,
                 sleep: Callable[[float], None] = time.sleep, page_size: int = PAGE_SIZE,
                 service_account: str | None = None) -> None:
        self._controller_id = controller_id.lower()
        self._clock = clock
        self._project = project
        self._credentials = credentials
        self._endpoint = api_endpoint
        self._default_region = default_region
        self._sleep = sleep
        self._page_size = page_size
        self._clients: dict[str, Any] = {}
        self._zones: dict[str, tuple[str, ...]] = {}
        self._firewall_ports: set[int] = set()
        self._stager = SnapshotStager(_GcsObjects(self), blobs, self._controller_id,
                                      lambda message: GcpPermanentError(message, "MissingBlob"))
        self._service_account = service_account
        self._secrets = SecretKeeper(_SecretManager(self), self._controller_id)

    @classmethod
    def from_env(cls, controller_id: str, clock: Clock, blobs: BlobStore, env: Mapping[str, str] | None = None,
                 *, host_service_account: str | None = None) -> GcpProvider:
        """A provider configured by ``env``. Replicas run as ``SKY_LITE_GCP_SERVICE_ACCOUNT``, else as
        ``host_service_account`` (on a controller VM: the account made for its replicas), else as the
        project's default one."""
        env = os.environ if env is None else env
        return cls(controller_id, clock, blobs=blobs, project=env.get(PROJECT_SETTING) or None,
                   api_endpoint=env.get(ENDPOINT_SETTING) or None, default_region=env.get(REGION_SETTING) or None,
                   service_account=env.get(SERVICE_ACCOUNT_SETTING) or host_service_account or None)

    # --- Provider ------------------------------------------------------------------------------------------
    @_boundary
    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        return cloud.launch_in_batches(
            self, requests, self._default_region, fits=lambda batch: len(batch) <= BULK_INSERT_LIMIT,
            no_region=f"resources.region: the task names no region and {REGION_SETTING} is not set")

    @_boundary
    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        """Every instance labelled with this controller id, in every zone: one paginated aggregatedList."""
        return [i for zone, raw in self._list_raw() if (i := describe_instance(raw, zone)) is not None]

    @_boundary
    def find_instances(self, instance_ids: Sequence[str], regions: Collection[str] = ()) -> list[Instance]:
        """Each instance by id (``instances.get``). One that is gone but whose zone has a
        ``compute.instances.preempted`` operation for it is reported PREEMPTED: a spot VM deleted on
        preemption (``instanceTerminationAction: DELETE``) leaves nothing else behind. The zone's operations
        are read only for zones where something is missing, so a steady pass costs nothing extra."""
        from google.api_core import exceptions as core

        found = []
        missing: dict[str, list[str]] = {}
        for instance_id in instance_ids:
            zone, _, name = instance_id.partition("/")
            try:
                raw = self._call("instances", "get", project=self._get_project(), zone=zone, instance=name)
            except GcpPermanentError as exc:
                if exc.code == "notFound" or isinstance(exc.__cause__, core.NotFound):
                    missing.setdefault(zone, []).append(name)
                    continue
                raise
            instance = describe_instance(_as_dict(raw), zone)
            if instance is not None:
                found.append(instance)
        for zone, names in sorted(missing.items()):
            preempted = self._find_preempted(zone)
            for name in names:
                replica_id = parse_replica_id(name)
                if name in preempted and replica_id is not None:
                    found.append(Instance(instance_id=f"{zone}/{name}", service="", replica_id=replica_id, version=0,
                                          state=InstanceState.PREEMPTED, region=region_of(zone), zone=zone,
                                          is_spot=True, detail=f"spot instance preempted at {preempted[name]}"))
        return found

    def _find_preempted(self, zone: str) -> dict[str, str]:
        """Instance name -> time of its ``compute.instances.preempted`` operation in ``zone``."""
        operations = self._call("zone_operations", "list", request={
            "project": self._get_project(), "zone": zone, "filter": 'operationType="compute.instances.preempted"'})
        return {op.target_link.rsplit("/", 1)[-1]: op.insert_time or "an unknown time" for op in operations
                if op.operation_type == "compute.instances.preempted"}

    @_boundary
    def terminate(self, instance_ids: Sequence[str]) -> None:
        """One ``instances.delete`` per instance (Compute Engine has no bulk delete), sent concurrently and
        not waited on: the inventory sees them go. An instance that is gone already is fine; the first other
        failure is raised once every delete was tried."""
        from concurrent.futures import ThreadPoolExecutor

        from google.api_core import exceptions as core

        def delete(instance_id: str) -> ProviderError | None:
            zone, _, name = instance_id.partition("/")
            try:
                self._call("instances", "delete", project=self._get_project(), zone=zone, instance=name)
            except GcpPermanentError as exc:
                if not (exc.code == "notFound" or isinstance(exc.__cause__, core.NotFound)):
                    return exc
            except ProviderError as exc:
                return exc
            return None

        if not instance_ids:
            return
        self._get_project()
        self._client("instances")  # built once, before the threads share it
        with ThreadPoolExecutor(max_workers=min(TERMINATE_CONCURRENCY, len(instance_ids))) as pool:
            failures = [f for f in pool.map(delete, instance_ids) if f is not None]
        if failures:
            raise failures[0]

    @_boundary
    def release_service(self, service: str) -> None:
        """Delete the service's secrets, its bucket and everything in it. Idempotent."""
        self._secrets.release(service, (SECRETS_REGION,))
        self._stager.release(service, self._default_region or "us-central1")

    @_boundary
    def read_log(self, service: str, replica_id: int, instance_id: str | None,
                 region: str | None) -> ReplicaLog | None:
        """The instance's serial console (where the startup script's output goes)."""
        if instance_id is None:
            return None
        zone, _, name = instance_id.partition("/")
        output = self._call("instances", "get_serial_port_output", project=self._get_project(), zone=zone,
                            instance=name)
        return ReplicaLog(text=str(getattr(output, "contents", "") or ""))

    def abandon(self) -> None:
        """Instances are found by their labels (`serve down --force`), so there is nothing only this object
        knows about."""

    # --- cloud.BatchCloud ----------------------------------------------------------------------------------
    def find_launched(self, region: str, tokens: Collection[str]) -> dict[tuple[str, int, str], Instance]:
        """One aggregatedList per launch token, filtered by its label (a launch call has one token, and a new
        one matches nothing: one short answer), whatever the number of instances the controller has."""
        found: dict[tuple[str, int, str], Instance] = {}
        for token in sorted(tokens):
            for zone, raw in self._list_raw({LABEL_TOKEN: token.lower()}):
                instance = describe_instance(raw, zone)
                if instance is not None and region_of(zone) == region:
                    found[(instance.service, instance.replica_id, token)] = instance
        return found

    def launch_group(self, group: LaunchGroup) -> list[LaunchOutcome]:
        try:
            properties = self._instance_properties(group)
            zones = group.placement.zone_order or self._list_zones(group.region)
        except ProviderError as exc:
            return [failed_outcome(r, exc) for r in group.requests]
        except Exception as exc:  # the provider boundary (a callback of launch_in_batches)
            return [failed_outcome(r, translate_error(exc, "launch")) for r in group.requests]

        def launch_in(zone: str, detail: str | None) -> list[LaunchOutcome]:
            names = {instance_name(self._controller_id, group, r.replica_id): r for r in group.requests}
            body = {"count": len(names), "instance_properties": properties,
                    "per_instance_properties": {name: {} for name in names}}
            operation = self._call("instances", "bulk_insert", project=self._get_project(), zone=zone,
                                   bulk_insert_instance_resource_resource=body)
            self._wait(operation, "bulkInsert")
            spot = group.is_spot
            return [LaunchOutcome(r.replica_id, instance=Instance(
                instance_id=f"{zone}/{name}", service=r.service, replica_id=r.replica_id, version=r.version,
                state=InstanceState.PENDING, region=group.region, zone=zone, is_spot=spot, detail=detail))
                for name, r in names.items()]

        machine_type = group.placement.instance_type or DEFAULT_MACHINE_TYPE
        try:
            return cloud.launch_across_zones(group, zones, machine_type, launch_in)
        except Exception as exc:  # the provider boundary: never raise out of a batch
            return [failed_outcome(r, translate_error(exc, "bulkInsert")) for r in group.requests]

    # --- pieces ------------------------------------------------------------------------------------------
    def _instance_properties(self, group: LaunchGroup) -> dict[str, Any]:
        first = group.first
        spec = first.spec
        resources = spec.resources
        if needs_capture(spec):
            raise GcpPermanentError(f"{'workdir' if spec.workdir else 'file_mounts'}: version {first.version} has "
                                    "no snapshot of its files: submit it again with `sky-lite serve update`",
                                    "NoSnapshot")
        port = spec.service.port or DEFAULT_PORT
        self._ensure_firewall(port, resources.ports)
        fetches = tuple(Fetch(source, find_mount_destination(destination)) for destination, source
                        in spec.file_mounts if source.startswith("gs://"))
        try:
            placements = find_placements(spec.files) if spec.files is not None else []
        except ValueError as exc:
            raise GcpPermanentError(str(exc), "UnsupportedPath") from exc
        staged = (self._stager.stage(first.service, group.region, spec.files, placements)
                  if spec.files is not None and placements else None)
        secrets = self._store_secrets(first)
        # The task's envs only: its secrets' values stay in Secret Manager, the script names them.
        script = render_boot_script(GCP_BOOT, BootBatch(
            service=first.service, version=first.version, replica_ids=group.replica_ids, envs=spec.envs,
            setup=spec.setup, run=spec.run, port=port, secrets=secrets, run_as_root=resources.run_as_root),
            fetches, staged)
        labels = {**{k.lower(): v.lower() for k, v in resources.labels},
                  LABEL_CONTROLLER: self._controller_id, LABEL_SERVICE: first.service,
                  LABEL_VERSION: str(first.version), LABEL_TOKEN: first.launch_token.lower(), LABEL_PORT: str(port)}
        placement = group.placement
        image = placement.image or DEFAULT_IMAGE
        disk: dict[str, Any] = {"boot": True, "auto_delete": True,
                                "initialize_params": {"source_image": _image_url(image)}}
        if placement.disk_size:
            disk["initialize_params"]["disk_size_gb"] = placement.disk_size
        if placement.disk_type:
            disk["initialize_params"]["disk_type"] = placement.disk_type
        if placement.disk_iops:
            disk["initialize_params"]["provisioned_iops"] = placement.disk_iops
        properties: dict[str, Any] = {
            "machine_type": placement.instance_type or DEFAULT_MACHINE_TYPE,
            "labels": labels,
            "tags": {"items": [self._network_tag]},
            "disks": [disk],
            "network_interfaces": [{"network": "global/networks/default"}],
            "metadata": {"items": [{"key": "startup-script", "value": script}]},
            # The instance reads its snapshot and gs:// sources with its own service account; Secret Manager
            # takes cloud-platform only, which secrets get with an account of their own (_store_secrets).
            "service_accounts": [{"email": self._service_account or "default",
                                  "scopes": [CLOUD_PLATFORM_SCOPE if secrets else STORAGE_READ_SCOPE]}],
        }
        scheduling: dict[str, Any] = {}
        if placement.accelerator_type and placement.accelerator:
            count = int(placement.accelerator.rpartition(":")[2])
            properties["guest_accelerators"] = [{"accelerator_type": placement.accelerator_type,
                                                 "accelerator_count": count}]
        if placement.accelerator:  # GPU machines cannot live-migrate
            scheduling["on_host_maintenance"] = "TERMINATE"
        if group.is_spot:
            scheduling |= {"provisioning_model": "SPOT", "instance_termination_action": "DELETE"}
        if scheduling:
            properties["scheduling"] = scheduling
        return properties

    def _store_secrets(self, request: LaunchRequest) -> Pairs:
        """The request's secrets in Secret Manager, readable by the replicas' service account; (variable,
        secret id) for the startup script. Raises ``ProviderError``."""
        try:
            secrets = find_cloud_secrets(self._controller_id, request)
        except ValueError as exc:
            raise GcpPermanentError(str(exc), "NoSecretDigest") from exc
        if secrets and not self._service_account:
            raise GcpPermanentError(f"secrets: instances read their secrets from Secret Manager with a service "
                                    f"account of their own, and this controller has none configured "
                                    f"({SERVICE_ACCOUNT_SETTING}, or a controller VM of `sky-lite controller up "
                                    f"--cloud gcp`, which makes one; see docs/gcp.md)", "NoServiceAccount")
        return self._secrets.ensure(request.service, SECRETS_REGION, secrets)

    @property
    def _network_tag(self) -> str:
        return f"sky-lite-{self._controller_id}"

    def _ensure_firewall(self, port: int, open_ports: Sequence[int]) -> None:
        """The controller's firewall rule: the service port from the default network's range to instances
        with its tag. Created once; an existing rule is found by name."""
        from google.api_core import exceptions as core

        if port in self._firewall_ports:
            return
        name = f"sky-lite-{self._controller_id}-{port}"
        try:
            self._call("firewalls", "get", project=self._get_project(), firewall=name)
        except GcpPermanentError as exc:
            if not isinstance(exc.__cause__, core.NotFound):
                raise
            rule = {"name": name, "network": "global/networks/default", "direction": "INGRESS",
                    "source_ranges": ["10.128.0.0/9"], "target_tags": [self._network_tag],
                    "allowed": [{"I_p_protocol": "tcp", "ports": [str(port)]}],
                    "description": f"sky-lite controller {self._controller_id}: service port {port}"}
            try:
                self._wait(self._call("firewalls", "insert", project=self._get_project(), firewall_resource=rule),
                           "firewalls.insert")
            except GcpPermanentError as exists:
                if not isinstance(exists.__cause__, core.Conflict):
                    raise
        self._firewall_ports.add(port)
        del open_ports  # ports the task opens to everyone: not on GCP yet (docs/gcp.md)

    def _list_zones(self, region: str) -> tuple[str, ...]:
        if region not in self._zones:
            # One zones.list for the project (a few dozen zones), filtered here and kept per region.
            zones = self._call("zones", "list", project=self._get_project())
            self._zones[region] = tuple(sorted(z.name for z in zones
                                               if z.region.endswith(f"/{region}") and z.status == "UP"))
            if not self._zones[region]:
                raise GcpTransientError(f"no zone of {region} is up", "NoZone")
        return self._zones[region]

    def _list_raw(self, labels: Mapping[str, str] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """This controller's instances (and ``labels``), every page of one aggregatedList."""
        wanted = {LABEL_CONTROLLER: self._controller_id, **(labels or {})}
        text = " AND ".join(f'labels.{key} = "{value}"' for key, value in wanted.items())
        request = {"project": self._get_project(), "filter": text, "max_results": self._page_size}
        for scope, scoped in self._call("instances", "aggregated_list", request=request):
            zone = scope.rsplit("/", 1)[-1]
            for raw in scoped.instances:
                yield zone, _as_dict(raw)

    def _wait(self, operation: Any, what: str) -> None:
        """Wait for an operation; its error translated (a zone without capacity: ``GcpCapacityError``)."""
        from google.api_core import exceptions as core

        try:
            operation.result(timeout=OPERATION_TIMEOUT_SECONDS)
        except core.GoogleAPICallError as exc:
            codes = [e.code for e in getattr(getattr(operation, "error", None), "errors", []) or []]
            capacity = [c for c in codes if c in _CAPACITY_CODES]
            if capacity:
                raise GcpCapacityError(f"no capacity ({capacity[0]}: {exc.message})", capacity[0]) from exc
            raise translate_error(exc, what) from exc

    # --- google-cloud-compute ------------------------------------------------------------------------------
    def _get_project(self) -> str:
        if self._project is None:
            import google.auth

            credentials, project = google.auth.default(scopes=["https://www.googleapis.com/auth/compute"])
            self._credentials = self._credentials or credentials
            if not project:
                raise GcpPermanentError(f"no Google Cloud project: set {PROJECT_SETTING} (or GOOGLE_CLOUD_PROJECT)",
                                        "NoProject")
            self._project = project
        return self._project

    def _client(self, kind: str) -> Any:
        if kind not in self._clients:
            from google.api_core.client_options import ClientOptions
            from google.cloud import compute_v1

            classes = {"instances": compute_v1.InstancesClient, "zones": compute_v1.ZonesClient,
                       "firewalls": compute_v1.FirewallsClient, "zone_operations": compute_v1.ZoneOperationsClient}
            if self._credentials is None:
                import google.auth

                self._credentials, project = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/compute"])
                self._project = self._project or project
            options = ClientOptions(api_endpoint=self._endpoint) if self._endpoint else None
            self._clients[kind] = classes[kind](credentials=self._credentials, client_options=options,
                                                transport="rest")
        return self._clients[kind]

    def _call(self, kind: str, method: str, **params: Any) -> Any:
        """Call ``method`` of the ``kind`` client (a pager is walked inside the retry, so a page that fails
        is fetched again). See ``_retrying``."""
        def call() -> Any:
            # The library's own retries are off: _retrying retries, so call counts and delays stay ours.
            result = getattr(self._client(kind), method)(**params, retry=None, timeout=CALL_TIMEOUT_SECONDS)
            return list(result) if method in ("aggregated_list", "list") else result

        return self._retrying(method, call)

    def _retrying(self, what: str, call: Callable[[], _R]) -> _R:
        """``call()``, retried after each of ``RETRY_DELAYS`` on 429 and 5xx. Raises ``GcpTransientError`` or
        ``GcpPermanentError``."""
        for delay in (*RETRY_DELAYS, None):
            try:
                return call()
            except Exception as exc:  # the provider boundary: translated here, once
                error = exc if isinstance(exc, ProviderError) else translate_error(exc, what)
                if not isinstance(error, GcpTransientError) or isinstance(error, GcpCapacityError) or delay is None:
                    raise error from exc
                log.info("%s: %s; retrying in %.2fs", what, error, delay)
                self._sleep(delay)
        raise AssertionError("unreachable")

    def _storage(self) -> Any:
        if "storage" not in self._clients:
            from google.cloud import storage  # type: ignore[attr-defined]

            self._client("instances")  # credentials and project, once
            options = {"api_endpoint": self._endpoint} if self._endpoint else None
            self._clients["storage"] = storage.Client(project=self._get_project(), credentials=self._credentials,
                                                      client_options=options)
        return self._clients["storage"]


class _GcsObjects:
    """Cloud Storage as the stager's ``ObjectStore``, through google-cloud-storage on the provider's path."""

    scheme = "gs"

    def __init__(self, provider: GcpProvider) -> None:
        self._gcp = provider

    def ensure_bucket(self, bucket: str, region: str) -> None:
        from google.api_core import exceptions as core

        def create() -> None:
            # A Conflict is ours already (bucket names are global: another owner's would be Forbidden).
            with contextlib.suppress(core.Conflict):
                self._gcp._storage().create_bucket(bucket, location=region, retry=None)

        self._gcp._retrying("buckets.insert", create)

    def list_keys(self, bucket: str, region: str, prefix: str) -> list[str]:
        return self._gcp._retrying("objects.list", lambda: [
            b.name for b in self._gcp._storage().list_blobs(bucket, prefix=prefix, retry=None)])

    def put(self, bucket: str, region: str, key: str, body: BinaryIO, size: int, content_type: str) -> None:
        def upload() -> None:
            body.seek(0)
            blob = self._gcp._storage().bucket(bucket).blob(key)
            blob.upload_from_file(body, size=size, content_type=content_type, retry=None, checksum=None)

        self._gcp._retrying("objects.insert", upload)

    def delete_bucket(self, bucket: str, region: str) -> None:
        from google.api_core import exceptions as core

        def delete() -> None:
            client = self._gcp._storage()
            try:
                for blob in client.list_blobs(bucket, retry=None):
                    blob.delete(retry=None)
                client.bucket(bucket).delete(retry=None)
            except core.NotFound:
                pass

        self._gcp._retrying("buckets.delete", delete)



class CloudPlatformApi:
    """JSON calls to the Google APIs the Compute client library does not cover (Secret Manager, IAM,
    Resource Manager), on the provider's path: its credentials under the cloud-platform scope those APIs
    take (the provider's own carry the compute scope), its retries and its one translation of errors
    (``_retrying``). Builds nothing until the first call."""

    def __init__(self, provider: GcpProvider) -> None:
        self._gcp = provider
        self._session: Any = None

    def request(self, what: str, verb: str, url: str, *, params: Mapping[str, str] | None = None,
                body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One call; its JSON answer ({} for an empty one). Raises ``GcpTransientError`` or
        ``GcpPermanentError`` (the google-api-core exception of the answer as its cause)."""
        def call() -> dict[str, Any]:
            from google.api_core import exceptions as core

            response = self._authorized().request(verb, url, params=params, json=body, timeout=CALL_TIMEOUT_SECONDS)
            if response.status_code >= 400:
                raise core.from_http_response(response)  # type: ignore[no-untyped-call]
            return dict(response.json()) if response.content else {}

        return self._gcp._retrying(what, call)

    def _authorized(self) -> Any:
        if self._session is None:
            import google.auth.credentials
            from google.auth.transport.requests import AuthorizedSession

            self._gcp._get_project()  # the credentials and the project, once
            self._gcp._client("instances")
            credentials = self._gcp._credentials
            if isinstance(credentials, google.auth.credentials.Scoped):
                credentials = credentials.with_scopes([CLOUD_PLATFORM_SCOPE])  # type: ignore[no-untyped-call]
            self._session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
        return self._session


class _SecretManager:
    """Secret Manager's REST API as the keeper's ``SecretBackend``, on the provider's path: its credentials
    and endpoint (a local fake when set), its retries and its one translation of errors (``_retrying``).
    A secret is created with automatic replication and the controller's labels, gets its value as version
    1, and an IAM policy of one binding: the replicas' service account may read it."""

    def __init__(self, provider: GcpProvider) -> None:
        self._gcp = provider
        self._api = CloudPlatformApi(provider)

    def put(self, name: str, value: Secret, service: str, region: str) -> str:
        from google.api_core import exceptions as core

        project = self._gcp._get_project()
        secret = f"projects/{project}/secrets/{name}"
        labels = {LABEL_CONTROLLER: self._gcp._controller_id, LABEL_SERVICE: service}
        try:
            self._request("secrets.create", "POST", f"projects/{project}/secrets", params={"secretId": name},
                          body={"replication": {"automatic": {}}, "labels": labels})
            has_value = False
        except GcpPermanentError as exc:
            if not isinstance(exc.__cause__, core.Conflict):
                raise
            # Made by an earlier attempt: its value may not have been added yet.
            versions = self._request("secrets.versions.list", "GET", f"{secret}/versions",
                                     params={"filter": "state:ENABLED"})
            has_value = bool(versions.get("versions"))
        if not has_value:
            data = base64.b64encode(value.value.encode()).decode("ascii")
            self._request("secrets.addVersion", "POST", f"{secret}:addVersion", body={"payload": {"data": data}})
        self._request("secrets.setIamPolicy", "POST", f"{secret}:setIamPolicy", body={"policy": {"bindings": [
            {"role": SECRET_ACCESSOR, "members": [f"serviceAccount:{self._gcp._service_account}"]}]}})
        return name

    def list_names(self, service: str, region: str) -> Iterator[str]:
        project = self._gcp._get_project()
        params = {"filter": f"labels.{LABEL_CONTROLLER}={self._gcp._controller_id} AND "
                            f"labels.{LABEL_SERVICE}={service}", "pageSize": str(self._gcp._page_size)}
        prefix = compute_secret_prefix(self._gcp._controller_id, service)
        while True:
            page = self._request("secrets.list", "GET", f"projects/{project}/secrets", params=params)
            for secret in page.get("secrets", []):
                name = str(secret.get("name", "")).rsplit("/", 1)[-1]
                if name.startswith(prefix):
                    yield name
            if not page.get("nextPageToken"):
                return
            params["pageToken"] = str(page["nextPageToken"])

    def delete(self, name: str, region: str) -> None:
        from google.api_core import exceptions as core

        try:
            self._request("secrets.delete", "DELETE", f"projects/{self._gcp._get_project()}/secrets/{name}")
        except GcpPermanentError as exc:
            if not isinstance(exc.__cause__, core.NotFound):
                raise

    def _request(self, what: str, verb: str, path: str, *, params: Mapping[str, str] | None = None,
                 body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One call of ``v1/<path>`` (``CloudPlatformApi.request``)."""
        url = f"{self._gcp._endpoint or SECRET_MANAGER_URL}/v1/{path}"
        return self._api.request(what, verb, url, params=params, body=body)


def _image_url(image: str) -> str:
    """An image as GCE takes it: a full or partial URL as given, a bare family name under debian-cloud."""
    if "/" in image:
        return image
    return f"projects/debian-cloud/global/images/family/{image}" if not image.startswith("image-") else image


def _as_dict(raw: Any) -> dict[str, Any]:
    """A proto-plus message as the JSON dict of the REST API (camelCase keys)."""
    if isinstance(raw, dict):
        return raw
    import json

    return dict(json.loads(type(raw).to_json(raw)))
