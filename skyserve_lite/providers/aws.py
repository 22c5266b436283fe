"""Replicas as EC2 instances.

Every instance carries these tags (one ``RunInstances`` call gives all of its instances the same tags)::

    sky-lite:controller    the controller id: the inventory lists exactly the instances with this tag
    sky-lite:service       sky-lite:version       sky-lite:launch-token
    sky-lite:replica-ids   "3,4,5": the instance with AmiLaunchIndex i is replica ids[i]
    sky-lite:port          the service port, so the inventory can give each instance its url

A ``launch`` call groups its requests into batches (same service, version, launch token, region, zone and
market) of at most as many replicas as fit in one 256-character tag value, and sends one ``RunInstances``
per batch with ``MinCount == MaxCount``. Before that it looks for instances already tagged with the
requests' launch tokens, one ``DescribeInstances`` per region, so a launch re-sent after a crash returns the
instances of the first attempt; the ``ClientToken`` (derived from the launch token, the zone, the market
and the replica ids) makes the same promise on AWS's side for a retry whose first answer was lost.

A batch without a zone tries the region's zones in name order and moves to the next one on a capacity
error; the instance's ``detail`` says which zones had none.

Files: replicas are built from the version's snapshot (``TaskSpec.files``, captured when the task was
submitted), never from the submitter's disk. Each blob goes once per digest to the service's bucket
``sky-lite-<controller>-<service>`` as ``blobs/<sha256>``, whatever the number of versions that hold it;
the provider remembers what it uploaded, and the first staging for a bucket learns what is there already
with one paginated ``ListObjectsV2`` of ``blobs/``, so a restarted controller uploads nothing again. Next to
the blobs, one small file list per snapshot, ``files/<snapshot digest>.tsv``, says where each entry lands;
the boot script downloads it and applies it (``aws_userdata``), so user data does not grow with the number
of files. Instances read the bucket, and any ``s3://`` source, with their own role (the constructor's
``instance_profile``). A version stored before snapshots existed (``needs_capture``) is a permanent launch
outcome: it has to be submitted again.

Secrets: each value goes to Secrets Manager in the launch's region before the instances are asked for
(``cloud_secrets.SecretKeeper``: one secret per controller, service and value digest, its bytes as
``SecretBinary``), and the user data names its ARN; the instance reads it with its own role. A service's
secrets are deleted with its bucket (``release_service``), in every region the provider wrote one to or was
asked to list.

Errors: boto3's and botocore's exceptions are translated by one function, ``translate_error``, at one
boundary, ``_translated``: every public method runs inside it (so a session that cannot be built, e.g. for
an ``AWS_PROFILE`` that names no profile, is a ``PermanentProviderError`` too), and so does each API call in
``_call``, which needs the translated error to decide: it retries throttling and 5xx answers a few times
with a short backoff before giving up with a ``TransientProviderError``, and a failure of one launch batch
becomes that batch's outcomes instead of failing the others.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import io
import json
import logging
import re
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, ParamSpec, TypeVar

import boto3
from boto3.exceptions import Boto3Error
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConfigNotFound,
    ConfigParseError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    InvalidConfigError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
    UnknownCredentialError,
)

from skyserve_lite.clock import Clock
from skyserve_lite.errors import PermanentProviderError, ProviderError, TransientProviderError
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.files.capture import is_cloud_uri, needs_capture
from skyserve_lite.providers import cloud
from skyserve_lite.providers.aws_userdata import USER_DATA_LIMIT_BYTES, render_user_data
from skyserve_lite.providers.base import Instance, InstanceState, LaunchOutcome, LaunchRequest, ReplicaLog
from skyserve_lite.providers.boot_script import (
    BootBatch,
    Fetch,
    StagedFiles,
    find_mount_destination,
    find_placements,
)
from skyserve_lite.providers.cloud import LaunchGroup, ZoneCapacityError, failed_outcome
from skyserve_lite.providers.cloud_secrets import SecretKeeper, compute_secret_prefix, find_cloud_secrets
from skyserve_lite.providers.staging import SnapshotStager
from skyserve_lite.spec.model import Pairs, Secret, TaskSpec
from skyserve_lite.spec.placement import SSM_PREFIX

log = logging.getLogger(__name__)

TAG_CONTROLLER = "sky-lite:controller"
TAG_SERVICE = "sky-lite:service"
TAG_VERSION = "sky-lite:version"
TAG_LAUNCH_TOKEN = "sky-lite:launch-token"
TAG_REPLICA_IDS = "sky-lite:replica-ids"
TAG_PORT = "sky-lite:port"

# 2 vCPUs and 8 GiB, offered in every zone of every commercial region: a task that names no type still launches.
DEFAULT_INSTANCE_TYPE = "m5.large"
DEFAULT_PORT = 8080
# EC2 tag values hold at most 256 characters: with 4-digit replica ids ("1000,1001,...") that is 51 per batch.
TAG_VALUE_LIMIT = 256
# DescribeInstances returns at most 1,000 instances a page, ListObjectsV2 1,000 keys: 1,000 instances in a region,
# or 1,000 blobs in a bucket, cost one call.
PAGE_SIZE = 1000
# Three retries of a throttled or failing call, 1.75 s in all: long enough for a token bucket to refill a few
# requests, short enough not to hold a reconcile pass up.
RETRY_DELAYS = (0.25, 0.5, 1.0)
_OPEN_TO_ALL = "0.0.0.0/0"

_TRANSIENT_CODES = frozenset({
    "Throttling", "ThrottlingException", "RequestLimitExceeded", "EC2ThrottledException", "SlowDown",
    "InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "RequestTimeout",
    "PriorRequestNotComplete",
})
# Capacity is per zone: another zone of the region may have some (AWS's own advice in these messages).
_ZONE_CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity",
    "InsufficientCapacity", "UnfulfillableCapacity", "InsufficientFreeAddressesInSubnet", "SpotMaxPriceTooLow",
    "Unsupported",
})
# Quotas are per region: every zone gives the same answer, so these are retried later, not in the next zone.
_QUOTA_CODES = frozenset({"MaxSpotInstanceCountExceeded", "InstanceLimitExceeded", "VcpuLimitExceeded"})
_CREDENTIAL_CODES = frozenset({
    "AuthFailure", "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken", "UnrecognizedClientException",
    "InvalidAccessKeyId",
})
_CREDENTIAL_CHAIN = ("configure the standard AWS credential chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                     "AWS_PROFILE or ~/.aws/credentials, SSO (aws sso login), or an instance role")
# What boto3 and botocore raise: everything ``translate_error`` turns into a ProviderError.
_VENDOR_ERRORS = (BotoCoreError, ClientError, Boto3Error)

_P = ParamSpec("_P")
_R = TypeVar("_R")


# --- errors ----------------------------------------------------------------------------------------------------
class AwsTransientError(TransientProviderError):
    """A failed AWS call worth retrying later; ``code`` is AWS's error code (or the botocore class name)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class AwsCapacityError(AwsTransientError, ZoneCapacityError):
    """The zone asked for has no capacity for this request; another zone may have some."""


class AwsPermanentError(PermanentProviderError):
    """A failed AWS call that retrying will not fix; the message says what to change."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def translate_error(exc: Exception, operation: str) -> AwsTransientError | AwsPermanentError:
    """The one translation of botocore's exceptions into sky-lite's ``ProviderError`` tree.

    Throttling, 5xx answers and lost connections are transient; capacity errors are ``AwsCapacityError``;
    missing credentials, a missing profile or unreadable configuration, permissions and invalid parameters
    are permanent with a hint of what to fix; unknown 4xx codes are permanent, unknown 5xx transient. A
    ``ValueError`` is botocore's answer to a malformed endpoint url while it builds a client.
    """
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return AwsPermanentError(f"no usable AWS credentials: {_CREDENTIAL_CHAIN}", type(exc).__name__)
    if isinstance(exc, ProfileNotFound):
        return AwsPermanentError(f"the AWS profile {exc.kwargs.get('profile')!r} (from AWS_PROFILE) is in neither "
                                 "the AWS config nor the credentials file (~/.aws/config, ~/.aws/credentials, or "
                                 "AWS_CONFIG_FILE and AWS_SHARED_CREDENTIALS_FILE): set AWS_PROFILE to a profile "
                                 f"that exists, or unset it and {_CREDENTIAL_CHAIN}", "ProfileNotFound")
    if isinstance(exc, (ConfigNotFound, ConfigParseError, InvalidConfigError, UnknownCredentialError)):
        return AwsPermanentError(f"the AWS configuration cannot be used ({exc}): fix ~/.aws/config (or "
                                 f"AWS_CONFIG_FILE) and the profile AWS_PROFILE names, or {_CREDENTIAL_CHAIN}",
                                 type(exc).__name__)
    if isinstance(exc, ValueError):
        return AwsPermanentError(f"{operation}: cannot build an AWS client ({exc}): check AWS_ENDPOINT_URL and "
                                 "the endpoint_url of the AWS profile", "InvalidEndpoint")
    if isinstance(exc, NoRegionError):
        return AwsPermanentError("no AWS region: set resources.region in the task or AWS_DEFAULT_REGION",
                                 "NoRegionError")
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError, HTTPClientError)):
        return AwsTransientError(f"{operation}: cannot reach AWS: {exc}", type(exc).__name__)
    if not isinstance(exc, ClientError):
        name = type(exc).__name__
        if "Token" in name or "Credential" in name or "SSO" in name:
            return AwsPermanentError(f"AWS credentials unusable ({exc}): {_CREDENTIAL_CHAIN}", name)
        return AwsPermanentError(f"{operation}: {exc}", name)
    error = exc.response.get("Error", {})
    code = str(error.get("Code", "Unknown"))
    message = str(error.get("Message", "")).strip()
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 400))
    said = f"({code}: {message})" if message else f"({code})"
    if code in _TRANSIENT_CODES:
        return AwsTransientError(f"{operation}: AWS is busy {said}", code)
    if code in _ZONE_CAPACITY_CODES:
        return AwsCapacityError(f"no capacity {said}", code)
    if code in _QUOTA_CODES:
        return AwsTransientError(f"an AWS quota is exhausted {said}: ask for a higher quota in the Service "
                                 "Quotas console or lower max_replicas", code)
    if code in _CREDENTIAL_CODES:
        return AwsPermanentError(f"AWS rejected the credentials {said}: {_CREDENTIAL_CHAIN}", code)
    if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
        return AwsPermanentError(f"the AWS identity in use may not call {operation} {said}: allow it in IAM "
                                 "(docs/aws.md lists the actions sky-lite needs)", code)
    if code.startswith("InvalidAMIID"):
        return AwsPermanentError(f"resources.image_id: AWS does not accept the image {said}: use an AMI id that "
                                 "exists in the region the task names", code)
    if code in ("InvalidAvailabilityZone", "InvalidZone.NotFound"):
        return AwsPermanentError(f"resources.zone: not a zone of this region {said}", code)
    if code == "InvalidBlockDeviceMapping":
        return AwsPermanentError(f"resources.disk_size: AWS refused the root disk {said}", code)
    if code == "OptInRequired":
        return AwsPermanentError(f"the AWS account has not enabled this region or service {said}: enable it, "
                                 "or pick another resources.region", code)
    if code == "IdempotentParameterMismatch":
        return AwsPermanentError(f"{operation}: AWS saw this launch token with different parameters {said}", code)
    if code.startswith(("InvalidParameter", "MissingParameter", "InvalidInstanceType")):
        return AwsPermanentError(f"AWS rejected a parameter of {operation} {said}: check resources "
                                 "(instance_type, disk_size, zone, ports)", code)
    if status >= 500:
        return AwsTransientError(f"{operation}: AWS failed {said}", code)
    return AwsPermanentError(f"{operation} failed {said}", code)


@contextlib.contextmanager
def _translated(operation: str) -> Iterator[None]:
    """The provider's error boundary: what boto3 and botocore raise inside leaves as ``translate_error``'s
    answer, ``raise ... from`` the original."""
    try:
        yield
    except _VENDOR_ERRORS as exc:
        raise translate_error(exc, operation) from exc


def _boundary(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A public method of the provider: nothing but ``ProviderError`` leaves it, whatever the step that
    failed (building the session, a client, an API call)."""

    @functools.wraps(method)
    def translated(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _translated(method.__name__):
            return method(*args, **kwargs)

    return translated


# --- pure helpers ----------------------------------------------------------------------------------------------
def fits_one_tag(batch: Sequence[LaunchRequest]) -> bool:
    """Whether one ``RunInstances`` can start ``batch``: its replica ids fit one tag value."""
    return len(format_replica_ids(r.replica_id for r in batch)) <= TAG_VALUE_LIMIT


def plan_launch_groups(requests: Sequence[LaunchRequest], default_region: str | None) -> list[LaunchGroup]:
    """``cloud.plan_launch_groups`` with AWS's limit: a batch's replica ids fit one tag value."""
    return cloud.plan_launch_groups(requests, default_region, fits_one_tag)


def compute_client_token(group: LaunchGroup, zone: str) -> str:
    """The ``ClientToken`` of ``group`` launched in ``zone``: stable across retries, distinct per batch and zone.

    AWS rejects a token reused with other parameters, so everything that differs between batches of one
    launch token goes into the digest. 24 + 1 + 32 = 57 characters, within AWS's 64.
    """
    # The placement's machine too: two candidates tried in one zone are two launches, not a retry of one.
    material = json.dumps([group.first.launch_token, group.region, zone, group.is_spot, group.replica_ids,
                           group.placement.instance_type, group.placement.image])
    return f"{group.first.launch_token[:24]}-{hashlib.sha256(material.encode()).hexdigest()[:32]}"


def format_replica_ids(replica_ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in replica_ids)


def parse_replica_ids(value: str) -> tuple[int, ...]:
    """``"3,4,5"`` -> ``(3, 4, 5)``; ValueError when it is not such a list."""
    return tuple(int(part) for part in value.split(","))


def compute_state(raw: Mapping[str, Any]) -> tuple[InstanceState, str | None]:
    """An EC2 instance's state, as sky-lite reports it, with the detail to show.

    Spot interruptions (``Server.SpotInstanceTermination``, or ``Server.SpotInstanceShutdown`` for spot
    instances that stop) are PREEMPTED whatever the state name; a stopped instance is EXITED.
    """
    name = str(raw.get("State", {}).get("Name", ""))
    reason = raw.get("StateReason") or {}
    code = str(reason.get("Code") or "")
    message = str(reason.get("Message") or code) or None
    if code.startswith("Server.Spot") and name in ("shutting-down", "terminated", "stopping", "stopped"):
        return InstanceState.PREEMPTED, message
    if name == "pending":
        return InstanceState.PENDING, None
    if name == "running":
        return InstanceState.RUNNING, None
    if name in ("stopping", "stopped"):
        return InstanceState.EXITED, f"instance stopped: {message}" if message else "instance stopped"
    return InstanceState.TERMINATED, message


def instance_from_ec2(raw: Mapping[str, Any], region: str) -> Instance:
    """An ``Instance`` from one ``DescribeInstances`` item and its tags.

    An instance whose sky-lite tags cannot be read gets replica id -1: no replica claims it, so the controller
    terminates it as an orphan.
    """
    tags = {str(t["Key"]): str(t["Value"]) for t in raw.get("Tags", [])}
    service = tags.get(TAG_SERVICE, "")
    try:
        version = int(tags.get(TAG_VERSION, ""))
        replica_id = parse_replica_ids(tags.get(TAG_REPLICA_IDS, ""))[int(raw.get("AmiLaunchIndex", 0))]
    except (ValueError, IndexError):
        version, replica_id = 0, -1
    port = tags.get(TAG_PORT, "")
    return describe_instance(raw, region, service=service, version=version, replica_id=replica_id,
                             port=int(port) if port.isdigit() else DEFAULT_PORT)


def describe_instance(raw: Mapping[str, Any], region: str, *, service: str, version: int, replica_id: int,
                      port: int, detail: str | None = None) -> Instance:
    state, state_detail = compute_state(raw)
    address = raw.get("PrivateIpAddress")
    return Instance(
        instance_id=str(raw["InstanceId"]), service=service, replica_id=replica_id, version=version, state=state,
        url=f"http://{address}:{port}" if address else None, region=region,
        zone=raw.get("Placement", {}).get("AvailabilityZone"), is_spot=raw.get("InstanceLifecycle") == "spot",
        detail=detail or state_detail,
    )


def find_service_port(spec: TaskSpec) -> int:
    return spec.service.port or DEFAULT_PORT


# --- the provider ----------------------------------------------------------------------------------------------
@dataclass
class _SecurityGroup:
    group_id: str
    vpc_cidr: str
    rules: set[tuple[int, str]] = field(default_factory=set)  # (tcp port, cidr) already allowed


class AwsProvider:
    """EC2 instances of one controller. See the module docstring for tags, batching and errors.

    Builds nothing in its constructor: the boto3 session and one client per (service, region) are created on
    first use, so a provider that is never used costs nothing and needs no credentials.
    """

    name = "aws"

    def __init__(self, controller_id: str, clock: Clock, *, blobs: BlobStore, session: Any = None,
                 default_region: str | None = None, instance_profile: str | None = None,
                 sleep: Callable[[float], None] = time.sleep, page_size: int = PAGE_SIZE) -> None:
        self._controller_id = controller_id
        self._clock = clock
        self._blobs = blobs  # where the versions' snapshots are (the controller's state directory)
        self._session = session
        self._default_region = default_region
        self._instance_profile = instance_profile
        self._sleep = sleep
        self._page_size = page_size
        self._clients: dict[tuple[str, str], Any] = {}
        self._regions_by_instance: dict[str, str] = {}
        self._gone: set[str] = set()  # terminated or shutting down at the last look: nothing left to stop
        self._zones: dict[str, tuple[str, ...]] = {}
        self._images: dict[tuple[str, str], str] = {}  # (region, ssm:PARAMETER) -> AMI id
        self._groups: dict[str, _SecurityGroup] = {}
        self._root_devices: dict[tuple[str, str], str] = {}
        self._stager = SnapshotStager(_S3Objects(self), blobs, controller_id,
                                      lambda message: AwsPermanentError(message, "MissingBlob"))
        self._secrets = SecretKeeper(_SecretsManager(self), controller_id)
        self._listed_regions: set[str] = set()  # every region an inventory was asked for: where secrets may be

    # --- Provider ------------------------------------------------------------------------------------------
    @_boundary
    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        return cloud.launch_in_batches(
            self, requests, self._find_default_region(), fits=fits_one_tag,
            no_region="resources.region: the task names no region and AWS has no default "
                      "(set AWS_DEFAULT_REGION or a region in ~/.aws/config)")

    @_boundary
    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        """Every instance tagged with this controller id in ``regions`` and the default region, in any state.

        One paginated ``DescribeInstances`` per region. Raises ``TransientProviderError`` or
        ``PermanentProviderError`` when a region cannot be read: an inventory with a hole is no inventory.
        """
        default_region = self._find_default_region()
        instances = []
        self._listed_regions.update(regions)
        for region in sorted(set(regions) | ({default_region} if default_region else set())):
            filters = [{"Name": f"tag:{TAG_CONTROLLER}", "Values": [self._controller_id]}]
            for raw in self._describe_instances(region, filters):
                instances.append(self._remember(instance_from_ec2(raw, region), raw))
        return instances

    @_boundary
    def find_instances(self, instance_ids: Sequence[str], regions: Collection[str] = ()) -> list[Instance]:
        """By id in each region (an ``instance-id`` filter, so an id unknown there is no error): EC2's
        tag-filtered listing can lag RunInstances, a lookup by id sees the instance sooner."""
        default_region = self._find_default_region()
        instances = []
        for region in sorted(set(regions) | ({default_region} if default_region else set())):
            for start in range(0, len(instance_ids), 200):  # at most 200 values per filter
                filters = [{"Name": "instance-id", "Values": list(instance_ids[start:start + 200])},
                           {"Name": f"tag:{TAG_CONTROLLER}", "Values": [self._controller_id]}]
                for raw in self._describe_instances(region, filters):
                    instances.append(self._remember(instance_from_ec2(raw, region), raw))
        return instances

    @_boundary
    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate these instances: one ``TerminateInstances`` per region.

        Ids this provider has not seen in an inventory or a launch are ignored (the controller always lists
        before it terminates), and so are ids that were already terminated at the last look.
        """
        by_region: dict[str, list[str]] = defaultdict(list)
        for instance_id in dict.fromkeys(instance_ids):
            region = self._regions_by_instance.get(instance_id)
            if region is None:
                log.debug("not terminating %s: never seen in an inventory", instance_id)
            elif instance_id not in self._gone:
                by_region[region].append(instance_id)
        for region, ids in sorted(by_region.items()):
            self._terminate_in(region, ids)

    @_boundary
    def release_service(self, service: str) -> None:
        """Delete the service's bucket and every object in it, and its secrets in every region the provider
        wrote one to or listed (the controller lists every region its services name on each pass, so a
        restarted controller knows them too). Idempotent: a missing bucket or secret is fine."""
        default_region = self._find_default_region() or "us-east-1"
        self._secrets.release(service, self._listed_regions | {default_region})
        self._stager.release(service, default_region)

    @_boundary
    def read_log(self, service: str, replica_id: int, instance_id: str | None,
                 region: str | None) -> ReplicaLog | None:
        """The instance's serial console output as EC2 last captured it (cloud-init and the replica's
        service log to it): a snapshot. None when no instance is known or EC2 has captured nothing yet."""
        if instance_id is None:
            return None
        region = region or self._find_default_region()
        if region is None:
            return None
        output = self._call("ec2", region, "get_console_output", InstanceId=instance_id).get("Output")
        if not output:
            return None
        try:
            return ReplicaLog(text=base64.b64decode(output).decode(errors="replace"))
        except ValueError:
            return ReplicaLog(text=str(output))  # some endpoints return the text undecoded

    def abandon(self) -> None:
        """Nothing to stop: every instance carries this controller's tag, so a controller with the state
        finds it (and so does `aws ec2 describe-instances` filtered on ``tag:sky-lite:controller``)."""

    # --- launching -----------------------------------------------------------------------------------------
    def find_launched(self, region: str, tokens: Collection[str]) -> dict[tuple[str, int, str], Instance]:
        """Instances already started for these launch tokens, by (service, replica id, token); one paginated
        ``DescribeInstances``. A live instance wins over a terminated one of the same replica."""
        filters = [{"Name": f"tag:{TAG_CONTROLLER}", "Values": [self._controller_id]},
                   {"Name": f"tag:{TAG_LAUNCH_TOKEN}", "Values": sorted(tokens)}]
        found: dict[tuple[str, int, str], Instance] = {}
        for raw in self._describe_instances(region, filters):
            token = next((t["Value"] for t in raw.get("Tags", []) if t["Key"] == TAG_LAUNCH_TOKEN), "")
            instance = self._remember(instance_from_ec2(raw, region), raw)
            key = (instance.service, instance.replica_id, token)
            if key not in found or found[key].state is InstanceState.TERMINATED:
                found[key] = instance
        return found

    def launch_group(self, group: LaunchGroup) -> list[LaunchOutcome]:
        """Start one batch: one ``RunInstances``, or one per zone tried while zones report no capacity."""
        try:
            params = self._run_parameters(group)
            zones = group.placement.zone_order or self._list_zones(group.region)
        except ProviderError as exc:
            return [failed_outcome(r, exc) for r in group.requests]

        def launch_in(zone: str, detail: str | None) -> list[LaunchOutcome]:
            response = self._call("ec2", group.region, "run_instances", **params,
                                  Placement={"AvailabilityZone": zone}, ClientToken=compute_client_token(group, zone))
            return self._outcomes(group, response.get("Instances", []), detail)

        return cloud.launch_across_zones(group, zones, str(params["InstanceType"]), launch_in)

    def _outcomes(self, group: LaunchGroup, raws: Sequence[Mapping[str, Any]], detail: str | None
                  ) -> list[LaunchOutcome]:
        port = find_service_port(group.first.spec)
        by_replica: dict[int, Instance] = {}
        for raw in raws:
            index = int(raw.get("AmiLaunchIndex", 0))
            if index < len(group.requests):
                instance = describe_instance(raw, group.region, service=group.first.service,
                                             version=group.first.version, replica_id=group.replica_ids[index],
                                             port=port, detail=detail)
                by_replica[instance.replica_id] = self._remember(instance, raw)
        return [LaunchOutcome(r.replica_id, instance=by_replica[r.replica_id]) if r.replica_id in by_replica
                else LaunchOutcome(r.replica_id, error="RunInstances returned no instance for this replica")
                for r in group.requests]

    def _run_parameters(self, group: LaunchGroup) -> dict[str, Any]:
        """Everything of ``RunInstances`` but the zone and the client token; creates the security group and
        uploads files on the way. Raises ``ProviderError``."""
        first = group.first
        spec = first.spec
        resources = spec.resources
        placement = group.placement
        image_id = self._find_image(group.region, placement.image)
        port = find_service_port(spec)
        fetches, files = self._stage_files(first, group.region)
        # The task's envs only: its secrets' values stay in Secrets Manager, the script names them.
        batch = BootBatch(service=first.service, version=first.version, replica_ids=group.replica_ids,
                          envs=spec.envs, setup=spec.setup, run=spec.run, port=port,
                          secrets=self._store_secrets(first, group.region), run_as_root=resources.run_as_root)
        user_data = render_user_data(batch, fetches, files)
        if len(user_data.encode()) > USER_DATA_LIMIT_BYTES:
            raise AwsPermanentError(f"setup, run and envs make {len(user_data.encode())} bytes of EC2 user data, "
                                    f"over AWS's {USER_DATA_LIMIT_BYTES}: move long scripts into workdir",
                                    "UserDataTooLong")
        # The task's labels first, so that a label cannot overwrite a tag the inventory relies on.
        tag_values = {"Name": f"sky-lite-{first.service}", **dict(resources.labels),
                      TAG_CONTROLLER: self._controller_id, TAG_SERVICE: first.service,
                      TAG_VERSION: str(first.version), TAG_LAUNCH_TOKEN: first.launch_token,
                      TAG_REPLICA_IDS: format_replica_ids(group.replica_ids), TAG_PORT: str(port)}
        tags = [{"Key": key, "Value": value} for key, value in tag_values.items()]
        params: dict[str, Any] = {
            "ImageId": image_id,
            "InstanceType": placement.instance_type or DEFAULT_INSTANCE_TYPE,
            "MinCount": len(group.requests),
            "MaxCount": len(group.requests),
            "UserData": user_data,
            "SecurityGroupIds": [self._ensure_security_group(group.region, port, resources.ports)],
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags},
                                  {"ResourceType": "volume", "Tags": tags}],
            # IMDSv2 only: the boot script asks for a session token first anyway.
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        }
        if placement.disk_size or placement.disk_type:
            ebs: dict[str, Any] = {"VolumeType": placement.disk_type or "gp3", "DeleteOnTermination": True}
            if placement.disk_size:
                ebs["VolumeSize"] = placement.disk_size
            if placement.disk_iops:
                ebs["Iops"] = placement.disk_iops
            if placement.disk_throughput and ebs["VolumeType"] == "gp3":
                ebs["Throughput"] = placement.disk_throughput
            params["BlockDeviceMappings"] = [{"DeviceName": self._root_device(group.region, image_id), "Ebs": ebs}]
        if group.is_spot:
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        if self._instance_profile:
            params["IamInstanceProfile"] = {"Name": self._instance_profile}
        return params

    def _find_image(self, region: str, image: str | None) -> str:
        """The AMI id to boot: ``image`` itself, or for a default (``ssm:PARAMETER``) the AMI id that public
        parameter names in ``region`` now (read once per region and parameter)."""
        if not image:
            raise AwsPermanentError(f"resources.image_id: AWS needs an AMI id (ami-...) of {region}", "MissingImage")
        if not image.startswith(SSM_PREFIX):
            return image
        key = (region, image)
        if key not in self._images:
            name = image.removeprefix(SSM_PREFIX)
            try:
                value = self._call("ssm", region, "get_parameter", Name=name)["Parameter"]["Value"]
            except AwsPermanentError as exc:
                raise AwsPermanentError(f"resources.image_id: the default image's parameter {name} cannot be read "
                                        f"in {region} ({exc}); name an AMI with resources.image_id",
                                        exc.code) from exc
            self._images[key] = str(value)
        return self._images[key]

    def _list_zones(self, region: str) -> tuple[str, ...]:
        if region not in self._zones:
            response = self._call("ec2", region, "describe_availability_zones",
                                  Filters=[{"Name": "state", "Values": ["available"]}])
            self._zones[region] = tuple(sorted(
                z["ZoneName"] for z in response.get("AvailabilityZones", [])
                if z.get("ZoneType", "availability-zone") == "availability-zone"))
            if not self._zones[region]:
                raise AwsTransientError(f"no available zone in {region}", "NoZone")
        return self._zones[region]

    def _root_device(self, region: str, image_id: str) -> str:
        key = (region, image_id)
        if key not in self._root_devices:
            images = self._call("ec2", region, "describe_images", ImageIds=[image_id]).get("Images", [])
            if not images or not images[0].get("RootDeviceName"):
                raise AwsPermanentError(f"resources.image_id: {image_id} is not an AMI visible in {region}",
                                        "InvalidAMIID.NotFound")
            self._root_devices[key] = str(images[0]["RootDeviceName"])
        return self._root_devices[key]

    def _ensure_security_group(self, region: str, service_port: int, open_ports: Sequence[int]) -> str:
        """The controller's security group in ``region``'s default VPC, allowing ``service_port`` from the VPC
        and ``open_ports`` from anywhere. Idempotent: found by name, created once, rules added when missing."""
        group = self._groups.get(region)
        if group is None:
            group = self._find_or_create_group(region)
            self._groups[region] = group
        wanted = {(service_port, group.vpc_cidr)} | {(port, _OPEN_TO_ALL) for port in open_ports}
        missing = sorted(wanted - group.rules)
        if missing:
            permissions = [{"IpProtocol": "tcp", "FromPort": port, "ToPort": port,
                            "IpRanges": [{"CidrIp": cidr, "Description": "sky-lite replicas"}]}
                           for port, cidr in missing]
            try:
                self._call("ec2", region, "authorize_security_group_ingress", GroupId=group.group_id,
                           IpPermissions=permissions)
            except AwsPermanentError as exc:
                if exc.code != "InvalidPermission.Duplicate":
                    raise
            group.rules |= set(missing)
        return group.group_id

    def _find_or_create_group(self, region: str) -> _SecurityGroup:
        vpcs = self._call("ec2", region, "describe_vpcs",
                          Filters=[{"Name": "isDefault", "Values": ["true"]}]).get("Vpcs", [])
        if not vpcs:
            raise AwsPermanentError(f"{region} has no default VPC, which sky-lite launches into: create one "
                                    "(aws ec2 create-default-vpc) or pick another resources.region", "NoDefaultVpc")
        vpc_id, cidr = str(vpcs[0]["VpcId"]), str(vpcs[0]["CidrBlock"])
        name = f"sky-lite-{self._controller_id}"
        filters = [{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc_id]}]
        found = self._call("ec2", region, "describe_security_groups", Filters=filters).get("SecurityGroups", [])
        if not found:
            try:
                created = self._call("ec2", region, "create_security_group", GroupName=name, VpcId=vpc_id,
                                     Description=f"sky-lite controller {self._controller_id} replicas",
                                     TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                                         {"Key": TAG_CONTROLLER, "Value": self._controller_id}]}])
                return _SecurityGroup(str(created["GroupId"]), cidr)
            except AwsPermanentError as exc:
                if exc.code != "InvalidGroup.Duplicate":  # created meanwhile by another controller process
                    raise
            found = self._call("ec2", region, "describe_security_groups", Filters=filters).get("SecurityGroups", [])
        rules = {(int(p["FromPort"]), str(r["CidrIp"])) for p in found[0].get("IpPermissions", [])
                 if p.get("IpProtocol") == "tcp" and p.get("FromPort") == p.get("ToPort")
                 for r in p.get("IpRanges", [])}
        return _SecurityGroup(str(found[0]["GroupId"]), cidr, rules)

    def _stage_files(self, request: LaunchRequest, region: str) -> tuple[tuple[Fetch, ...], StagedFiles | None]:
        """What the boot script fetches: the user's ``s3://`` mount sources, and the version's snapshot,
        uploaded on the way (``staging.SnapshotStager``). Raises ``ProviderError``."""
        spec = request.spec
        if needs_capture(spec):
            raise AwsPermanentError(f"{'workdir' if spec.workdir else 'file_mounts'}: version {request.version} "
                                    "has no snapshot of its files (it was stored by an older sky-lite): submit it "
                                    "again with `sky-lite serve update`", "NoSnapshot")
        fetches = []
        for destination, source in spec.file_mounts:
            if not is_cloud_uri(source):
                continue  # in the snapshot
            if not source.startswith("s3://"):
                raise AwsPermanentError(f"file_mounts.{destination}: {source}: AWS replicas fetch local paths "
                                        "and s3:// only", "UnsupportedSource")
            fetches.append(Fetch(source, find_mount_destination(destination)))
        files = spec.files
        try:
            placements = find_placements(files) if files is not None else []
        except ValueError as exc:
            raise AwsPermanentError(str(exc), "UnsupportedPath") from exc
        if (fetches or placements) and not self._instance_profile:
            raise AwsPermanentError("workdir/file_mounts: instances fetch files from S3 with their own role, and "
                                    "this controller has no instance profile configured (see docs/aws.md)",
                                    "NoInstanceProfile")
        staged = None
        if files is not None and placements:
            staged = self._stager.stage(request.service, region, files, placements)
        return tuple(fetches), staged

    def _store_secrets(self, request: LaunchRequest, region: str) -> Pairs:
        """The request's secrets in ``region``'s Secrets Manager; (variable, ARN) for the user data. Raises
        ``ProviderError``."""
        try:
            secrets = find_cloud_secrets(self._controller_id, request)
        except ValueError as exc:
            raise AwsPermanentError(str(exc), "NoSecretDigest") from exc
        if secrets and not self._instance_profile:
            raise AwsPermanentError("secrets: instances read their secrets from Secrets Manager with their own "
                                    "role, and this controller has no instance profile configured "
                                    "(SKY_LITE_AWS_INSTANCE_PROFILE; see docs/aws.md)", "NoInstanceProfile")
        return self._secrets.ensure(request.service, region, secrets)

    # --- inventory and termination -------------------------------------------------------------------------
    def _describe_instances(self, region: str, filters: list[dict[str, Any]]) -> Iterator[Mapping[str, Any]]:
        params: dict[str, Any] = {"Filters": filters, "MaxResults": self._page_size}
        while True:
            page = self._call("ec2", region, "describe_instances", **params)
            for reservation in page.get("Reservations", []):
                yield from reservation.get("Instances", [])
            if not page.get("NextToken"):
                return
            params["NextToken"] = page["NextToken"]

    def _terminate_in(self, region: str, instance_ids: list[str]) -> None:
        try:
            self._call("ec2", region, "terminate_instances", InstanceIds=instance_ids)
        except AwsPermanentError as exc:
            if exc.code != "InvalidInstanceID.NotFound":
                raise
            # AWS refuses the whole call for one unknown id and names the unknown ones: drop them, send the rest.
            unknown = set(re.findall(r"i-[0-9a-f]+", str(exc)))
            rest = [i for i in instance_ids if i not in unknown]
            if rest and len(rest) < len(instance_ids):
                self._terminate_in(region, rest)
        self._gone.update(instance_ids)

    def _remember(self, instance: Instance, raw: Mapping[str, Any]) -> Instance:
        """Note where an instance lives (for ``terminate``) and whether there is anything left to stop."""
        self._regions_by_instance[instance.instance_id] = instance.region or ""
        if raw.get("State", {}).get("Name") in ("shutting-down", "terminated"):
            self._gone.add(instance.instance_id)
        else:
            self._gone.discard(instance.instance_id)
        return instance

    # --- boto3 -----------------------------------------------------------------------------------------------
    def _find_default_region(self) -> str | None:
        if self._default_region is None:
            self._default_region = self._get_session().region_name or None
        return self._default_region

    def _get_session(self) -> Any:
        if self._session is None:
            self._session = boto3.Session()
        return self._session

    def _client(self, service: str, region: str) -> Any:
        key = (service, region)
        if key not in self._clients:
            # botocore's own retries are off: _call retries, so call counts and delays stay ours to bound.
            config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=10,
                            read_timeout=60)
            try:
                self._clients[key] = self._get_session().client(service, region_name=region, config=config)
            except ValueError as exc:  # a malformed endpoint url
                raise translate_error(exc, f"{service} client for {region}") from exc
        return self._clients[key]

    @_boundary
    def default_region(self) -> str | None:
        """The region of AWS's configuration (``AWS_DEFAULT_REGION``, ``~/.aws/config``), if any."""
        return self._find_default_region()

    def call(self, service: str, region: str, operation: str, **params: Any) -> dict[str, Any]:
        """One API call on this provider's path (``_call``), for the controller VM (``aws_machine``).
        Raises ``AwsTransientError`` or ``AwsPermanentError``."""
        with _translated(_api_name(operation)):
            return self._call(service, region, operation, **params)

    def _call(self, service: str, region: str, operation: str, **params: Any) -> dict[str, Any]:
        """Call ``operation`` of ``service`` in ``region`` (building the client on first use); retry transient
        failures after each of ``RETRY_DELAYS``. A file given as ``Body`` is rewound before each attempt, so
        a retried upload sends every byte again. Raises ``AwsTransientError`` or ``AwsPermanentError``."""
        body = params.get("Body")
        for delay in (*RETRY_DELAYS, None):
            if isinstance(body, io.IOBase):
                body.seek(0)
            try:
                with _translated(_api_name(operation)):
                    response: dict[str, Any] = getattr(self._client(service, region), operation)(**params)
                return response
            except AwsTransientError as error:
                if delay is None or isinstance(error, AwsCapacityError):
                    raise
                log.info("%s: %s; retrying in %.2fs", operation, error, delay)
                self._sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")


def _api_name(operation: str) -> str:
    """``run_instances`` -> ``RunInstances``, as AWS and IAM name it."""
    return "".join(part.capitalize() for part in operation.split("_"))




class _S3Objects:
    """S3 as the stager's ``ObjectStore``, through the provider's ``_call``."""

    scheme = "s3"

    def __init__(self, provider: AwsProvider) -> None:
        self._aws = provider

    def ensure_bucket(self, bucket: str, region: str) -> None:
        create: dict[str, Any] = {"Bucket": bucket}
        if region != "us-east-1":  # us-east-1 is S3's default location and refuses to be named
            create["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self._aws._call("s3", region, "create_bucket", **create)
        except AwsPermanentError as exc:
            if exc.code != "BucketAlreadyOwnedByYou":
                raise

    def list_keys(self, bucket: str, region: str, prefix: str) -> Iterator[str]:
        params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": self._aws._page_size}
        while True:
            page = self._aws._call("s3", region, "list_objects_v2", **params)
            yield from (str(item["Key"]) for item in page.get("Contents", []))
            if not page.get("IsTruncated"):
                return
            params["ContinuationToken"] = page["NextContinuationToken"]

    def put(self, bucket: str, region: str, key: str, body: BinaryIO, size: int, content_type: str) -> None:
        del size  # S3 reads the body to its end
        extra = {"ContentType": content_type} if content_type != "application/octet-stream" else {}
        self._aws._call("s3", region, "put_object", Bucket=bucket, Key=key, Body=body, **extra)

    def delete_bucket(self, bucket: str, region: str) -> None:
        try:
            while True:
                listing = self._aws._call("s3", region, "list_objects_v2", Bucket=bucket, MaxKeys=1000)
                keys = [{"Key": item["Key"]} for item in listing.get("Contents", [])]
                if keys:
                    self._aws._call("s3", region, "delete_objects", Bucket=bucket,
                                    Delete={"Objects": keys, "Quiet": True})
                if not listing.get("IsTruncated"):
                    break
            self._aws._call("s3", region, "delete_bucket", Bucket=bucket)
        except AwsPermanentError as exc:
            if exc.code != "NoSuchBucket":
                raise


class _SecretsManager:
    """Secrets Manager as the keeper's ``SecretBackend``, through the provider's ``_call``. The value is
    ``SecretBinary`` (its bytes exactly; the boot script gets them in base64), the secret tagged with the
    controller and service; the replicas' role reads it (see docs/aws.md for the policies)."""

    def __init__(self, provider: AwsProvider) -> None:
        self._aws = provider

    def put(self, name: str, value: Secret, service: str, region: str) -> str:
        controller = self._aws._controller_id
        try:
            created = self._aws._call(
                "secretsmanager", region, "create_secret", Name=name, SecretBinary=value.value.encode(),
                Description=f"sky-lite controller {controller}, service {service}",
                Tags=[{"Key": TAG_CONTROLLER, "Value": controller}, {"Key": TAG_SERVICE, "Value": service}])
            return str(created["ARN"])
        except AwsPermanentError as exc:
            if exc.code not in ("ResourceExistsException", "InvalidRequestException"):
                raise
            existing = exc
        # The name is the value's: a secret of that name holds the value already, unless it is being deleted
        # (a `serve down` of a service of the same name moments ago), which takes a little while.
        found = self._aws._call("secretsmanager", region, "describe_secret", SecretId=name)
        if found.get("DeletedDate") is not None:
            raise AwsTransientError(f"the secret {name} is being deleted in {region}; launching again later",
                                    "SecretBeingDeleted") from existing
        if existing.code != "ResourceExistsException":
            raise existing
        return str(found["ARN"])

    def list_names(self, service: str, region: str) -> Iterator[str]:
        prefix = compute_secret_prefix(self._aws._controller_id, service)
        params: dict[str, Any] = {"Filters": [{"Key": "name", "Values": [prefix]}], "MaxResults": 100}
        while True:
            page = self._aws._call("secretsmanager", region, "list_secrets", **params)
            yield from (str(item["Name"]) for item in page.get("SecretList", []))
            if not page.get("NextToken"):
                return
            params["NextToken"] = page["NextToken"]

    def delete(self, name: str, region: str) -> None:
        try:
            self._aws._call("secretsmanager", region, "delete_secret", SecretId=name,
                            ForceDeleteWithoutRecovery=True)
        except AwsPermanentError as exc:
            if exc.code != "ResourceNotFoundException":
                raise
