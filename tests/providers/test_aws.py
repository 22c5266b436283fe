"""The AWS provider against moto's in-process EC2 and S3, with every API call recorded.

``Api`` hooks botocore's events on the session the provider is given: it records each call (service,
operation, region, parameters) and can answer chosen calls with an AWS error instead of sending them,
which is how capacity and throttling errors are injected.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.credentials import CredentialResolver
from botocore.exceptions import ClientError, ConfigParseError, NoCredentialsError, ProfileNotFound
from moto import mock_aws
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends
from moto.ec2.models.instances import StateReason

from skyserve_lite.clock import FakeClock
from skyserve_lite.errors import PermanentProviderError, TransientProviderError
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.files.capture import capture_task_files
from skyserve_lite.files.manifest import EntryKind, Manifest, ManifestEntry, TaskFiles
from skyserve_lite.plan.placement import DEFAULT_IMAGES
from skyserve_lite.providers.aws import (
    DEFAULT_INSTANCE_TYPE,
    TAG_CONTROLLER,
    TAG_LAUNCH_TOKEN,
    TAG_REPLICA_IDS,
    TAG_SERVICE,
    TAG_VERSION,
    AwsCapacityError,
    AwsPermanentError,
    AwsProvider,
    AwsTransientError,
    compute_client_token,
    compute_state,
    plan_launch_groups,
    translate_error,
)
from skyserve_lite.providers.aws_userdata import AWS_BOOT, USER_DATA_LIMIT_BYTES, render_user_data
from skyserve_lite.providers.base import InstanceState, LaunchRequest
from skyserve_lite.providers.boot_script import (
    APPLY_FILES,
    EXPAND_HOME,
    WORKDIR,
    BootBatch,
    Fetch,
    StagedFiles,
    find_placements,
    render_copy_functions,
    render_file_list,
)
from skyserve_lite.providers.staging import compute_bucket_name
from skyserve_lite.spec.model import Resources, ServiceSpec, TaskSpec
from skyserve_lite.spec.placement import SSM_PREFIX, Placement, Resolution

REGION = "us-east-1"
CONTROLLER = "ctl1"
SECRET = "testing-secret-never-in-user-data"
PROFILE = "replica-reader"
# For providers of tasks without files: creating a store touches nothing, and nothing reads this one.
NO_BLOBS = BlobStore(Path("/nonexistent/sky-lite-blobs"))


# --- helpers ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ApiCall:
    service: str
    operation: str
    region: str
    params: Mapping[str, Any]


class Api:
    """Records every API call of clients made from ``session`` and injects scripted errors."""

    def __init__(self, session: boto3.Session) -> None:
        self.calls: list[ApiCall] = []
        self._failures: list[tuple[str, Callable[[Mapping[str, Any]], bool], str, int]] = []
        session.events.register("provide-client-params", self._record)
        session.events.register("before-call", self._maybe_fail)

    def _record(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        context["recorded_params"] = params
        self.calls.append(ApiCall(model.service_model.service_name, model.name, context["client_region"],
                                  dict(params)))

    def _maybe_fail(self, model: Any, context: dict[str, Any], **_: Any) -> Any:
        for index, (operation, when, code, times) in enumerate(self._failures):
            if operation == model.name and times and when(context.get("recorded_params", {})):
                self._failures[index] = (operation, when, code, times - 1)
                status = 503 if code in ("InternalError", "ServiceUnavailable") else 400
                return (SimpleNamespace(status_code=status),
                        {"Error": {"Code": code, "Message": f"injected {code}"},
                         "ResponseMetadata": {"HTTPStatusCode": status}})
        return None

    def fail(self, operation: str, code: str, *, times: int = 1,
             when: Callable[[Mapping[str, Any]], bool] = lambda params: True) -> None:
        self._failures.append((operation, when, code, times))

    def named(self, operation: str) -> list[ApiCall]:
        return [c for c in self.calls if c.operation == operation]

    def count(self, operation: str) -> int:
        return len(self.named(operation))


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        yield


@pytest.fixture
def session(aws: None) -> boto3.Session:
    return boto3.Session(region_name=REGION)


@pytest.fixture
def api(session: boto3.Session) -> Api:
    return Api(session)


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def provider(session: boto3.Session, api: Api, sleeps: list[float]) -> AwsProvider:
    return make_provider(session, sleeps)


def make_provider(session: boto3.Session, sleeps: list[float] | None = None, *, blobs: BlobStore = NO_BLOBS,
                  **kwargs: Any) -> AwsProvider:
    record = sleeps if sleeps is not None else []
    return AwsProvider(CONTROLLER, FakeClock(), blobs=blobs, session=session, sleep=record.append, **kwargs)


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "home" / "blobs")


@pytest.fixture
def profile(aws: None) -> str:
    boto3.client("iam", region_name=REGION).create_instance_profile(InstanceProfileName=PROFILE)
    return PROFILE


def write_tree(root: Path, files: Mapping[str, str | bytes]) -> Path:
    """``{"lib/x.py": "X = 1"}`` as files below ``root``."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def captured(task: TaskSpec, base: Path, blobs: BlobStore) -> TaskSpec:
    """``task`` as a controller stores it once submitted: with the snapshot of its local files."""
    return dataclasses.replace(task, files=capture_task_files(task, base, str(base / "task.yaml"), blobs))


def put_keys(api: Api) -> list[str]:
    return [str(c.params["Key"]) for c in api.named("PutObject")]


def read_object(bucket: str, key: str) -> str:
    return str(boto3.client("s3", region_name=REGION).get_object(Bucket=bucket, Key=key)["Body"].read().decode())


def ami(region: str = REGION) -> str:
    """An AMI of moto's built-in set; the same ids in every test, so looked up (slowly: 1,300 images) once."""
    if region not in _AMIS:
        images = boto3.client("ec2", region_name=region).describe_images(Owners=["amazon"])["Images"]
        _AMIS[region] = str(images[0]["ImageId"])
    return _AMIS[region]


_AMIS: dict[str, str] = {}


def spec(*, image_id: str | None = "ami-default", zone: str | None = "us-east-1a", region: str | None = REGION,
         **fields: Any) -> TaskSpec:
    resource_fields = {k: fields.pop(k) for k in ("instance_type", "disk_size", "ports", "labels", "use_spot")
                       if k in fields}
    return TaskSpec(run=fields.pop("run", "python3 -m http.server $PORT"), service=ServiceSpec(port=fields.pop(
        "port", None)), resources=Resources(region=region, zone=zone, image_id=image_id, **resource_fields), **fields)


def request(replica_id: int, task: TaskSpec, *, token: str = "tok-1", spot: bool = False, version: int = 1,
            service: str = "svc") -> LaunchRequest:
    return LaunchRequest(service=service, replica_id=replica_id, version=version, spec=task, launch_token=token,
                         is_spot=spot)


def describe(instance_id: str, region: str = REGION) -> dict[str, Any]:
    reservations = boto3.client("ec2", region_name=region).describe_instances(InstanceIds=[instance_id])
    return dict(reservations["Reservations"][0]["Instances"][0])


def tags_of(raw: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


def client_error(code: str, status: int = 400) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "RunInstances")


# --- pure: batching, tokens, states, errors ---------------------------------------------------------------------
@pytest.mark.parametrize(("requests", "expected"), [
    pytest.param([(1, "us-east-1a", False, "t"), (2, "us-east-1a", False, "t"), (3, "us-east-1a", False, "t")],
                 [(None, "us-east-1a", False, (1, 2, 3))], id="one-zone-one-batch"),
    pytest.param([(1, "us-east-1a", False, "t"), (2, "us-east-1b", False, "t")],
                 [(None, "us-east-1a", False, (1,)), (None, "us-east-1b", False, (2,))], id="two-zones"),
    pytest.param([(1, "us-east-1a", False, "t"), (2, "us-east-1a", True, "t")],
                 [(None, "us-east-1a", False, (1,)), (None, "us-east-1a", True, (2,))], id="two-markets"),
    pytest.param([(1, None, False, "t"), (2, None, False, "u")],
                 [(None, None, False, (1,)), (None, None, False, (2,))], id="two-tokens"),
])
def test_plan_launch_groups_batches_by_zone_market_and_token(
        requests: list[tuple[int, str | None, bool, str]],
        expected: list[tuple[None, str | None, bool, tuple[int, ...]]]) -> None:
    launch = [request(i, spec(zone=zone), spot=spot, token=token) for i, zone, spot, token in requests]
    groups = plan_launch_groups(launch, None)
    assert [(None, g.zone, g.is_spot, g.replica_ids) for g in groups] == expected
    assert all(g.region == REGION for g in groups)


def test_plan_launch_groups_splits_a_batch_whose_replica_ids_exceed_one_tag_value() -> None:
    # 100 ids of 5 digits: "10000,...,10099" is 599 characters; 42 ids (251 characters) fit in 256.
    launch = [request(10_000 + i, spec()) for i in range(100)]
    groups = plan_launch_groups(launch, None)
    assert [len(g.requests) for g in groups] == [42, 42, 16]
    assert [r.replica_id for g in groups for r in g.requests] == [r.replica_id for r in launch]


def test_plan_launch_groups_uses_the_default_region_and_leaves_out_requests_without_one() -> None:
    launch = [request(1, spec(region=None)), request(2, spec(region="eu-west-1", zone=None))]
    assert [(g.region, g.replica_ids) for g in plan_launch_groups(launch, "us-west-2")] == \
        [("us-west-2", (1,)), ("eu-west-1", (2,))]
    assert [g.replica_ids for g in plan_launch_groups(launch, None)] == [(2,)]


def test_client_token_is_stable_short_and_distinct_per_batch_and_zone() -> None:
    token = "f" * 32
    one = plan_launch_groups([request(1, spec(), token=token), request(2, spec(), token=token)], None)[0]
    again = plan_launch_groups([request(1, spec(), token=token), request(2, spec(), token=token)], None)[0]
    spot = plan_launch_groups([request(1, spec(), token=token, spot=True)], None)[0]
    assert compute_client_token(one, "us-east-1a") == compute_client_token(again, "us-east-1a")
    assert compute_client_token(one, "us-east-1a").startswith(token[:24])
    other_type = dataclasses.replace(one, placement=dataclasses.replace(one.placement, instance_type="g5.xlarge"))
    tokens = {compute_client_token(one, "us-east-1a"), compute_client_token(one, "us-east-1b"),
              compute_client_token(spot, "us-east-1a"), compute_client_token(other_type, "us-east-1a")}
    assert len(tokens) == 4 and all(len(t) <= 64 for t in tokens)


@pytest.mark.parametrize(("state", "reason", "expected", "detail"), [
    ("pending", None, InstanceState.PENDING, None),
    ("running", None, InstanceState.RUNNING, None),
    ("stopping", None, InstanceState.EXITED, "instance stopped"),
    ("stopped", ("Client.InstanceInitiatedShutdown", "Client.InstanceInitiatedShutdown: Instance initiated shutdown"),
     InstanceState.EXITED, "instance stopped: Client.InstanceInitiatedShutdown: Instance initiated shutdown"),
    ("shutting-down", None, InstanceState.TERMINATED, None),
    ("terminated", ("Client.UserInitiatedShutdown", "Client.UserInitiatedShutdown: User initiated shutdown"),
     InstanceState.TERMINATED, "Client.UserInitiatedShutdown: User initiated shutdown"),
    ("terminated", ("Server.SpotInstanceTermination", "Server.SpotInstanceTermination: Spot instance termination"),
     InstanceState.PREEMPTED, "Server.SpotInstanceTermination: Spot instance termination"),
    ("shutting-down", ("Server.SpotInstanceTermination", ""), InstanceState.PREEMPTED,
     "Server.SpotInstanceTermination"),
    ("stopped", ("Server.SpotInstanceShutdown", "Server.SpotInstanceShutdown: Spot instance shutdown"),
     InstanceState.PREEMPTED, "Server.SpotInstanceShutdown: Spot instance shutdown"),
])
def test_compute_state_maps_ec2_states_and_spot_interruptions(
        state: str, reason: tuple[str, str] | None, expected: InstanceState, detail: str | None) -> None:
    raw: dict[str, Any] = {"State": {"Name": state}}
    if reason:
        raw["StateReason"] = {"Code": reason[0], "Message": reason[1]}
    assert compute_state(raw) == (expected, detail)


@pytest.mark.parametrize(("exc", "kind", "hint"), [
    (client_error("Throttling"), AwsTransientError, "busy"),
    (client_error("RequestLimitExceeded"), AwsTransientError, "busy"),
    (client_error("InternalError", 500), AwsTransientError, "busy"),
    (client_error("ServiceUnavailable", 503), AwsTransientError, "busy"),
    (client_error("SomethingNew", 502), AwsTransientError, "failed"),
    (client_error("InsufficientInstanceCapacity"), AwsCapacityError, "no capacity"),
    (client_error("SpotMaxPriceTooLow"), AwsCapacityError, "no capacity"),
    (client_error("InsufficientFreeAddressesInSubnet"), AwsCapacityError, "no capacity"),
    (client_error("MaxSpotInstanceCountExceeded"), AwsTransientError, "quota"),
    (client_error("VcpuLimitExceeded"), AwsTransientError, "quota"),
    (client_error("UnauthorizedOperation", 403), AwsPermanentError, "may not call RunInstances"),
    (client_error("AuthFailure", 401), AwsPermanentError, "credential chain"),
    (client_error("InvalidAMIID.NotFound"), AwsPermanentError, "resources.image_id"),
    (client_error("InvalidAMIID.Malformed"), AwsPermanentError, "resources.image_id"),
    (client_error("InvalidParameterValue"), AwsPermanentError, "instance_type"),
    (client_error("SomethingNew"), AwsPermanentError, "SomethingNew"),
    (NoCredentialsError(), AwsPermanentError, "credential chain"),
    (ProfileNotFound(profile="missing"), AwsPermanentError, "AWS profile 'missing' (from AWS_PROFILE)"),
    (ConfigParseError(path="/root/.aws/config"), AwsPermanentError, "AWS configuration cannot be used"),
    (ValueError("Invalid endpoint: not a url"), AwsPermanentError, "AWS_ENDPOINT_URL"),
])
def test_translate_error_sorts_botocore_errors(exc: Exception, kind: type[Exception], hint: str) -> None:
    error = translate_error(exc, "RunInstances")
    assert type(error) is kind
    assert isinstance(error, TransientProviderError if kind is not AwsPermanentError else PermanentProviderError)
    assert hint in str(error)


def test_bucket_name_is_a_valid_s3_name_even_for_long_names() -> None:
    assert compute_bucket_name("ctl1", "svc") == "sky-lite-ctl1-svc"
    long = compute_bucket_name("C" * 40, "s" * 60)
    assert len(long) <= 63 and long == long.lower() and long != compute_bucket_name("C" * 40, "s" * 59)


# --- pure: user data ----------------------------------------------------------------------------------------------
BATCH = BootBatch(service="svc", version=3, replica_ids=(4, 5, 6), envs=(("GREETING", "it's 'quoted'"),),
                  setup="pip install -r requirements.txt", run="python3 app.py --port $PORT", port=9000)


STAGED = StagedFiles(file_list="s3://b/files/abc.tsv", blobs="s3://b/blobs/")


@pytest.mark.parametrize(("fetches", "files", "present", "absent"), [
    pytest.param((), None, ["replica_ids=4,5,6", "ami-launch-index", "Restart=always",
                            "systemctl enable --now sky-lite-replica.service", "X-aws-ec2-metadata-token"],
                 ["fetch ", "aws s3", "apply_files"], id="no-files"),
    pytest.param((), STAGED, ["cloud_copy s3://b/files/abc.tsv /opt/sky-lite/files.tsv",
                              'cloud_copy() { aws s3 cp --only-show-errors "$1" "$2"; }',
                              "apply_files /opt/sky-lite/files.tsv s3://b/blobs/"], ["fetch "], id="snapshot"),
    pytest.param((Fetch("s3://public/data", "/root/data"), Fetch("s3://public/it's", "/data/a b")), STAGED,
                 ["fetch s3://public/data /root/data", "fetch 's3://public/it'\"'\"'s' '/data/a b'",
                  "apply_files /opt/sky-lite/files.tsv"], [], id="snapshot-and-s3"),
])
def test_render_user_data(fetches: tuple[Fetch, ...], files: StagedFiles | None, present: list[str],
                          absent: list[str]) -> None:
    text = render_user_data(BATCH, fetches, files)
    assert text.startswith("#!/bin/bash\n# sky-lite replica bootstrap: service svc, version 3, replicas 4,5,6\n")
    for piece in present:
        assert piece in text
    for piece in absent:
        assert piece not in text
    env_file = next(line for line in text.splitlines() if line.endswith("> /opt/sky-lite/env.sh)"))
    assert env_file.startswith("(umask 077 && echo ")  # it holds the secrets: root's alone from the first byte
    env = base64.b64decode(env_file.split()[4]).decode()
    assert env.splitlines() == ["export GREETING='it'\"'\"'s '\"'\"'quoted'\"'\"''", "export PORT=9000",
                                "export SKY_LITE_SERVICE=svc"]
    assert 'echo "export SKY_LITE_REPLICA_ID=$replica_id" >> /opt/sky-lite/env.sh' in text
    # setup runs before the unit is installed; fetches before setup.
    assert text.index("setup.sh); then") < text.index("systemctl enable")
    if fetches:
        assert text.index("fetch s3://") < text.index("setup.sh); then")
    if files:  # the snapshot first: an s3:// mount into the workdir lands over it, not under it
        assert text.index("apply_files /opt") < text.index("fetch s3://" if fetches else "setup.sh); then")


def test_user_data_is_only_the_boot_script_so_a_6000_byte_run_fits() -> None:
    run = "echo " + "x" * 5995  # 6,000 bytes
    text = render_user_data(dataclasses.replace(BATCH, run=run))
    assert "emulation" not in text
    # `run` is in the script once, base64-encoded (8,000 bytes): 11,457 bytes in all (313 of them make the `sky`
    # user, the secrets file and the switch to that user, 1,525 keep it from the metadata service and make a later
    # boot only start the service). With a header that repeated envs, setup and run, the
    # same batch made 17,821 bytes, over the 16,384 EC2 accepts.
    assert text.count(base64.b64encode(run.encode()).decode()) == 1
    assert len(text.encode()) == 11_457 < USER_DATA_LIMIT_BYTES


# --- launch ---------------------------------------------------------------------------------------------------------
def test_three_requests_in_one_zone_are_one_run_instances_with_replicas_mapped_by_launch_index(
        provider: AwsProvider, api: Api) -> None:
    task = spec(image_id=ami(), labels=(("team", "ml"),))
    outcomes = provider.launch([request(3, task), request(4, task), request(5, task)])

    [run] = api.named("RunInstances")
    assert (run.params["MinCount"], run.params["MaxCount"]) == (3, 3)
    assert run.params["InstanceType"] == DEFAULT_INSTANCE_TYPE
    assert run.params["Placement"] == {"AvailabilityZone": "us-east-1a"}
    assert "KeyName" not in run.params
    assert [o.replica_id for o in outcomes] == [3, 4, 5]
    assert all(o.instance is not None and o.error is None for o in outcomes)
    for outcome in outcomes:
        assert outcome.instance is not None
        raw = describe(outcome.instance.instance_id)
        tags = tags_of(raw)
        assert tags[TAG_CONTROLLER] == CONTROLLER
        assert (tags[TAG_SERVICE], tags[TAG_VERSION], tags[TAG_LAUNCH_TOKEN]) == ("svc", "1", "tok-1")
        assert tags[TAG_REPLICA_IDS] == "3,4,5"
        assert tags["team"] == "ml"
        assert [3, 4, 5][raw["AmiLaunchIndex"]] == outcome.replica_id
        assert outcome.instance.url == f"http://{raw['PrivateIpAddress']}:8080"
        assert (outcome.instance.region, outcome.instance.zone) == (REGION, "us-east-1a")


def test_two_zones_are_two_calls_and_two_markets_are_two_calls(provider: AwsProvider, api: Api) -> None:
    image = ami()
    provider.launch([request(1, spec(image_id=image, zone="us-east-1a")),
                     request(2, spec(image_id=image, zone="us-east-1b"))])
    assert sorted(c.params["Placement"]["AvailabilityZone"] for c in api.named("RunInstances")) == \
        ["us-east-1a", "us-east-1b"]

    api.calls.clear()
    outcomes = provider.launch([request(3, spec(image_id=image), token="t2"),
                                request(4, spec(image_id=image), token="t2", spot=True)])
    runs = api.named("RunInstances")
    assert len(runs) == 2
    assert ["InstanceMarketOptions" in c.params for c in runs] == [False, True]
    assert runs[1].params["InstanceMarketOptions"]["MarketType"] == "spot"
    assert [o.instance.is_spot for o in outcomes if o.instance] == [False, True]


def test_describe_calls_per_launch_are_one_lookup_per_region(provider: AwsProvider, api: Api) -> None:
    image = ami()
    provider.launch([request(1, spec(image_id=image)), request(2, spec(image_id=image, zone="us-east-1b"))])
    assert api.count("DescribeInstances") == 1
    lookup = api.named("DescribeInstances")[0].params["Filters"]
    assert {"Name": f"tag:{TAG_LAUNCH_TOKEN}", "Values": ["tok-1"]} in lookup


def test_a_missing_image_id_is_a_permanent_error_naming_the_field(provider: AwsProvider, api: Api) -> None:
    [outcome] = provider.launch([request(1, spec(image_id=None))])
    assert outcome.permanent and outcome.instance is None
    assert outcome.error is not None and "resources.image_id" in outcome.error
    assert api.count("RunInstances") == 0


def test_disk_size_sets_the_root_device_of_the_ami(provider: AwsProvider, api: Api) -> None:
    image = ami()
    root = boto3.client("ec2", region_name=REGION).describe_images(ImageIds=[image])["Images"][0]["RootDeviceName"]
    [outcome] = provider.launch([request(1, spec(image_id=image, disk_size=120, instance_type="c5.xlarge"))])
    [run] = api.named("RunInstances")
    assert run.params["InstanceType"] == "c5.xlarge"
    assert run.params["BlockDeviceMappings"] == [
        {"DeviceName": root, "Ebs": {"VolumeSize": 120, "VolumeType": "gp3", "DeleteOnTermination": True}}]
    assert outcome.instance is not None
    volumes = boto3.client("ec2", region_name=REGION).describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [outcome.instance.instance_id]}])["Volumes"]
    assert [v["Size"] for v in volumes] == [120]


def test_user_data_has_no_credentials_and_is_exactly_the_boot_script_of_the_batch(provider: AwsProvider) -> None:
    task = spec(image_id=ami(), envs=(("MODEL", "small"),), setup="echo setup", port=9000)
    outcomes = provider.launch([request(7, task), request(8, task)])
    assert outcomes[0].instance is not None
    attribute = boto3.client("ec2", region_name=REGION).describe_instance_attribute(
        InstanceId=outcomes[0].instance.instance_id, Attribute="userData")
    user_data = base64.b64decode(attribute["UserData"]["Value"]).decode()
    for secret in (SECRET, "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN"):
        assert secret not in user_data
    assert user_data == render_user_data(BootBatch(service="svc", version=1, replica_ids=(7, 8),
                                                   envs=(("MODEL", "small"),), setup="echo setup", run=task.run,
                                                   port=9000))
    assert outcomes[0].instance.url is not None and outcomes[0].instance.url.endswith(":9000")


@pytest.mark.parametrize(("run_bytes", "accepted"), [(6_000, True), (12_500, False)])
def test_the_user_data_limit_counts_only_what_the_instance_runs(provider: AwsProvider, api: Api, run_bytes: int,
                                                                accepted: bool) -> None:
    # 6,000 bytes of `run` used to be refused (a header repeating it doubled the user data); 12,500 bytes are
    # 16,668 in base64, over 16,384 whatever else the script holds.
    [outcome] = provider.launch([request(1, spec(image_id=ami(), run="#" * run_bytes))])
    assert (outcome.instance is not None) is accepted
    assert api.count("RunInstances") == (1 if accepted else 0)
    if not accepted:
        assert outcome.permanent and outcome.error is not None
        assert "bytes of EC2 user data, over AWS's 16384: move long scripts into workdir" in outcome.error


# --- inventory ------------------------------------------------------------------------------------------------------
def test_inventory_pages_through_many_instances_with_one_paginated_call_set_per_region(
        session: boto3.Session, api: Api) -> None:
    # moto pages by reservation: 12 launch tokens make 12 reservations, 3 pages of 5.
    provider = make_provider(session, page_size=5)
    image = ami()
    for i in range(12):
        provider.launch([request(i, spec(image_id=image), token=f"t{i}")])
    boto3.client("ec2", region_name=REGION).run_instances(ImageId=image, MinCount=1, MaxCount=1)  # not ours
    api.calls.clear()

    instances = provider.list_instances([REGION])

    assert sorted(i.replica_id for i in instances) == list(range(12))
    assert [c.operation for c in api.calls] == ["DescribeInstances"] * 3
    assert all(c.params["Filters"] == [{"Name": f"tag:{TAG_CONTROLLER}", "Values": [CONTROLLER]}]
               for c in api.calls)


def test_find_instances_looks_ids_up_directly_and_only_this_controllers(provider: AwsProvider, api: Api) -> None:
    (outcome,) = provider.launch([request(1, spec(image_id=ami()))])
    assert outcome.instance is not None
    theirs = boto3.client("ec2", region_name=REGION).run_instances(ImageId=ami(), MinCount=1, MaxCount=1)
    their_id = theirs["Instances"][0]["InstanceId"]
    api.calls.clear()
    found = provider.find_instances([outcome.instance.instance_id, their_id, "i-0123456789abcdef0"], [REGION])
    assert [(i.instance_id, i.replica_id) for i in found] == [(outcome.instance.instance_id, 1)]
    (call,) = api.named("DescribeInstances")
    assert {"Name": "instance-id", "Values": [outcome.instance.instance_id, their_id, "i-0123456789abcdef0"]} in \
        call.params["Filters"]


def test_inventory_lists_the_given_regions_and_the_default_one(provider: AwsProvider, api: Api) -> None:
    provider.launch([request(1, spec(image_id=ami("eu-west-1"), region="eu-west-1", zone=None))])
    api.calls.clear()
    instances = provider.list_instances(["eu-west-1"])
    assert sorted(c.region for c in api.named("DescribeInstances")) == ["eu-west-1", REGION]
    assert [(i.replica_id, i.region, i.zone) for i in instances] == [(1, "eu-west-1", "eu-west-1a")]


def test_inventory_maps_stopped_terminated_and_spot_interrupted_instances(provider: AwsProvider) -> None:
    image = ami()
    outcomes = provider.launch([request(i, spec(image_id=image), spot=i == 3) for i in (1, 2, 3)])
    ids = [o.instance.instance_id for o in outcomes if o.instance]
    ec2 = boto3.client("ec2", region_name=REGION)
    ec2.stop_instances(InstanceIds=[ids[0]])
    ec2.terminate_instances(InstanceIds=[ids[1]])
    # A spot interruption as EC2 reports it: terminated, with the reason code Server.SpotInstanceTermination.
    interrupted = ec2_backends[DEFAULT_ACCOUNT_ID][REGION].get_instance(ids[2])
    interrupted.terminate()
    interrupted.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance termination",
                                           "Server.SpotInstanceTermination")

    by_replica = {i.replica_id: i for i in provider.list_instances()}

    assert by_replica[1].state is InstanceState.EXITED and by_replica[1].detail is not None
    assert by_replica[1].detail.startswith("instance stopped")
    assert by_replica[2].state is InstanceState.TERMINATED
    assert by_replica[3].state is InstanceState.PREEMPTED and by_replica[3].is_spot
    assert by_replica[3].detail == "Server.SpotInstanceTermination: Spot instance termination"


def test_inventory_failure_after_retries_is_transient(provider: AwsProvider, api: Api, sleeps: list[float]) -> None:
    api.fail("DescribeInstances", "RequestLimitExceeded", times=10)
    with pytest.raises(TransientProviderError, match="RequestLimitExceeded"):
        provider.list_instances()
    assert api.count("DescribeInstances") == 4
    assert sleeps == [0.25, 0.5, 1.0]


# --- errors during launch ---------------------------------------------------------------------------------------------
def test_no_capacity_in_the_first_zone_moves_to_the_next_zone(provider: AwsProvider, api: Api) -> None:
    api.fail("RunInstances", "InsufficientInstanceCapacity",
             when=lambda p: p["Placement"]["AvailabilityZone"] == "us-east-1a")
    outcomes = provider.launch([request(1, spec(image_id=ami(), zone=None)), request(2, spec(image_id=ami(),
                                                                                             zone=None))])
    zones = [c.params["Placement"]["AvailabilityZone"] for c in api.named("RunInstances")]
    assert zones == ["us-east-1a", "us-east-1b"]
    assert api.count("DescribeAvailabilityZones") == 1
    assert len({c.params["ClientToken"] for c in api.named("RunInstances")}) == 2
    for outcome in outcomes:
        assert outcome.instance is not None and outcome.instance.zone == "us-east-1b"
        assert outcome.instance.detail == "launched in us-east-1b; no capacity in us-east-1a: " \
                                          "InsufficientInstanceCapacity"


def test_no_capacity_anywhere_is_a_transient_outcome_naming_every_zone(provider: AwsProvider, api: Api) -> None:
    api.fail("RunInstances", "InsufficientInstanceCapacity", times=100)
    [outcome] = provider.launch([request(1, spec(image_id=ami(), zone=None), spot=True)])
    assert not outcome.permanent and outcome.instance is None and outcome.error is not None
    assert outcome.error.startswith("no spot capacity for m5.large in us-east-1: tried us-east-1a: Insufficient")
    assert "us-east-1f" in outcome.error
    assert api.count("RunInstances") == 6


def test_no_capacity_in_a_pinned_zone_does_not_try_another(provider: AwsProvider, api: Api) -> None:
    api.fail("RunInstances", "InsufficientInstanceCapacity")
    [outcome] = provider.launch([request(1, spec(image_id=ami(), zone="us-east-1c"))])
    assert not outcome.permanent and outcome.error is not None and "us-east-1c" in outcome.error
    assert api.count("RunInstances") == 1


def test_throttling_is_retried_inside_the_call_then_succeeds(provider: AwsProvider, api: Api,
                                                              sleeps: list[float]) -> None:
    api.fail("RunInstances", "Throttling", times=2)
    [outcome] = provider.launch([request(1, spec(image_id=ami()))])
    assert outcome.instance is not None
    assert api.count("RunInstances") == 3
    assert sleeps == [0.25, 0.5]


def test_throttling_that_persists_is_a_transient_outcome(provider: AwsProvider, api: Api) -> None:
    api.fail("RunInstances", "RequestLimitExceeded", times=10)
    [outcome] = provider.launch([request(1, spec(image_id=ami()))])
    assert not outcome.permanent and outcome.error is not None and "RequestLimitExceeded" in outcome.error
    assert api.count("RunInstances") == 4


@pytest.mark.parametrize(("code", "hint"), [
    ("UnauthorizedOperation", "may not call RunInstances"),
    ("InvalidAMIID.NotFound", "resources.image_id"),
    ("InvalidParameterValue", "check resources"),
])
def test_auth_and_parameter_errors_are_permanent_outcomes(provider: AwsProvider, api: Api, code: str,
                                                          hint: str) -> None:
    api.fail("RunInstances", code)
    [outcome] = provider.launch([request(1, spec(image_id=ami()))])
    assert outcome.permanent and outcome.error is not None and hint in outcome.error
    assert api.count("RunInstances") == 1


def test_no_credentials_is_a_permanent_outcome_about_the_credential_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing may leave this machine
    core = botocore.session.Session()
    core.register_component("credential_provider", CredentialResolver(providers=[]))
    provider = AwsProvider(CONTROLLER, FakeClock(), blobs=NO_BLOBS,
                           session=boto3.Session(botocore_session=core, region_name=REGION), sleep=lambda _: None)
    [outcome] = provider.launch([request(1, spec())])
    assert outcome.permanent and outcome.error is not None and "standard AWS credential chain" in outcome.error


# --- idempotence and crash recovery -------------------------------------------------------------------------------
def test_launch_with_the_same_token_returns_the_instances_of_the_first_launch(provider: AwsProvider,
                                                                              api: Api) -> None:
    task = spec(image_id=ami())
    first = provider.launch([request(1, task), request(2, task)])
    api.calls.clear()
    again = provider.launch([request(1, task), request(2, task)])
    assert api.count("RunInstances") == 0
    assert [o.instance.instance_id for o in again if o.instance] == \
        [o.instance.instance_id for o in first if o.instance]


def test_a_launch_whose_answer_was_lost_is_found_by_a_restarted_controller(session: boto3.Session,
                                                                           api: Api) -> None:
    task = spec(image_id=ami(), port=7000)
    make_provider(session).launch([request(5, task, version=2), request(6, task, version=2)])  # answer lost

    restarted = make_provider(session)
    instances = sorted(restarted.list_instances(), key=lambda i: i.replica_id)

    assert [(i.service, i.replica_id, i.version) for i in instances] == [("svc", 5, 2), ("svc", 6, 2)]
    assert all(i.url is not None and i.url.endswith(":7000") for i in instances)
    # Re-sent with the same token, the launch adopts them instead of starting two more.
    api.calls.clear()
    outcomes = restarted.launch([request(5, task, version=2), request(6, task, version=2)])
    assert api.count("RunInstances") == 0
    assert {o.instance.instance_id for o in outcomes if o.instance} == {i.instance_id for i in instances}


# --- files: the snapshot in S3 --------------------------------------------------------------------------------------
APP = {"server.py": "print('hi')\n", "lib/util.py": "X = 1\n", "lib/data.json": "{}\n", "README": "read me\n"}


def test_snapshot_blobs_and_file_list_go_to_the_service_bucket_and_release_deletes_it(
        session: boto3.Session, api: Api, blobs: BlobStore, profile: str, tmp_path: Path) -> None:
    write_tree(tmp_path / "app", APP)
    (tmp_path / "weights.bin").write_bytes(b"\x00\x01")
    task = captured(spec(image_id=ami(), workdir="app", file_mounts=(
        ("/data/weights.bin", "weights.bin"), ("/data/public", "s3://someone/data"))), tmp_path, blobs)
    assert task.files is not None
    shutil.rmtree(tmp_path / "app")  # replicas are built from the snapshot, not from the submitter's disk
    provider = make_provider(session, blobs=blobs, instance_profile=profile)

    outcomes = provider.launch([request(1, task), request(2, task)])

    assert all(o.instance is not None for o in outcomes)
    bucket = compute_bucket_name(CONTROLLER, "svc")
    blob_keys = sorted(f"blobs/{d}" for d in task.files.blob_digests())
    assert len(blob_keys) == 5
    list_key = f"files/{task.files.digest}.tsv"
    # Each blob once (not once per replica), then the file list.
    uploaded = put_keys(api)
    assert sorted(uploaded[:-1]) == blob_keys and uploaded[-1] == list_key
    s3 = boto3.client("s3", region_name=REGION)
    assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]) == [*blob_keys, list_key]
    readme = hashlib.sha256(APP["README"].encode()).hexdigest()
    assert read_object(bucket, f"blobs/{readme}") == APP["README"]
    [run] = api.named("RunInstances")
    assert run.params["IamInstanceProfile"] == {"Name": profile}
    user_data = run.params["UserData"]
    assert f"cloud_copy s3://{bucket}/{list_key} /opt/sky-lite/files.tsv" in user_data
    assert f"apply_files /opt/sky-lite/files.tsv s3://{bucket}/blobs/" in user_data
    assert "fetch s3://someone/data /data/public" in user_data  # referenced, not captured: fetched as before

    provider.release_service("svc")
    assert bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    provider.release_service("svc")  # idempotent
    make_provider(session).release_service("never-launched")


def test_two_versions_upload_each_shared_blob_once_and_a_changed_file_only_its_new_blob(
        session: boto3.Session, api: Api, blobs: BlobStore, profile: str, tmp_path: Path) -> None:
    write_tree(tmp_path / "app", APP)
    v1 = captured(spec(image_id=ami(), workdir="app"), tmp_path, blobs)
    (tmp_path / "app" / "server.py").write_text("print('v2')\n")
    v2 = captured(spec(image_id=ami(), workdir="app"), tmp_path, blobs)
    assert v1.files is not None and v2.files is not None and v1.files.digest != v2.files.digest
    new_blob = v2.files.blob_digests() - v1.files.blob_digests()
    provider = make_provider(session, blobs=blobs, instance_profile=profile)

    provider.launch([request(1, v1, version=1)])
    assert len(put_keys(api)) == 5  # 4 blobs, 1 file list
    api.calls.clear()
    provider.launch([request(2, v2, version=2, token="tok-2")])
    provider.launch([request(3, v1, version=1, token="tok-3")])  # a rollback: everything is there already

    assert put_keys(api) == [f"blobs/{new_blob.pop()}", f"files/{v2.files.digest}.tsv"]
    assert api.count("ListObjectsV2") == 0  # the bucket was learned once, at the first staging
    assert api.count("RunInstances") == 2


def test_a_restarted_provider_learns_the_bucket_with_one_listing_and_uploads_no_blob_again(
        session: boto3.Session, api: Api, blobs: BlobStore, profile: str, tmp_path: Path) -> None:
    write_tree(tmp_path / "app", {f"f{i}.txt": f"file {i}\n" for i in range(5)})
    task = captured(spec(image_id=ami(), workdir="app"), tmp_path, blobs)
    assert task.files is not None
    make_provider(session, blobs=blobs, instance_profile=profile).launch([request(1, task)])
    api.calls.clear()

    restarted = make_provider(session, blobs=blobs, instance_profile=profile, page_size=2)
    [outcome] = restarted.launch([request(2, task, token="tok-2")])

    assert outcome.instance is not None
    # 5 blobs at 2 keys a page: one paginated listing of blobs/ in 3 pages, then only the small file list.
    listings = api.named("ListObjectsV2")
    assert [c.params["Prefix"] for c in listings] == ["blobs/"] * 3
    assert "ContinuationToken" not in listings[0].params and all("ContinuationToken" in c.params
                                                                 for c in listings[1:])
    assert put_keys(api) == [f"files/{task.files.digest}.tsv"]


def test_the_file_list_places_every_entry_with_its_mode(session: boto3.Session, api: Api, blobs: BlobStore,
                                                         profile: str, tmp_path: Path) -> None:
    write_tree(tmp_path / "app", {"run.sh": "echo hi\n", "lib/x.py": "X = 1\n"})
    os.chmod(tmp_path / "app" / "run.sh", 0o755)
    (tmp_path / "app" / "empty").mkdir()
    os.chmod(tmp_path / "app" / "empty", 0o700)
    (tmp_path / "app" / "current").symlink_to("lib")
    write_tree(tmp_path / "conf", {"a.yaml": "a: 1\n"})
    (tmp_path / "w.bin").write_bytes(b"\x00")
    os.chmod(tmp_path / "w.bin", 0o600)
    task = captured(spec(image_id=ami(), workdir="app", file_mounts=(
        ("/data/w.bin", "w.bin"), ("~/conf", "conf"), ("extra/x.py", "app/lib/x.py"))), tmp_path, blobs)
    assert task.files is not None

    make_provider(session, blobs=blobs, instance_profile=profile).launch([request(1, task)])

    def digest(name: str) -> str:
        return hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()

    text = read_object(compute_bucket_name(CONTROLLER, "svc"), f"files/{task.files.digest}.tsv")
    assert text.splitlines() == [
        f"link\t777\tlib\t{WORKDIR}/current",
        f"dir\t700\t-\t{WORKDIR}/empty",
        f"dir\t{_mode(tmp_path / 'app' / 'lib')}\t-\t{WORKDIR}/lib",
        f"file\t644\t{digest('app/lib/x.py')}\t{WORKDIR}/lib/x.py",
        f"file\t755\t{digest('app/run.sh')}\t{WORKDIR}/run.sh",
        f"file\t600\t{digest('w.bin')}\t/data/w.bin",  # a single-file mount is the destination itself
        f"file\t644\t{digest('app/lib/x.py')}\t{WORKDIR}/extra/x.py",  # relative: below the workdir
        f"file\t644\t{digest('conf/a.yaml')}\t~/conf/a.yaml",  # the workload user's home: the boot script's
    ]
    assert put_keys(api).count(f"blobs/{digest('app/lib/x.py')}") == 1  # two entries, one blob


def _mode(path: Path) -> str:
    return f"{path.stat().st_mode & 0o7777:o}"


def test_user_data_is_the_same_size_whatever_the_number_of_files(session: boto3.Session, api: Api,
                                                                   blobs: BlobStore, profile: str,
                                                                   tmp_path: Path) -> None:
    write_tree(tmp_path / "small", {"app.py": "x\n"})
    write_tree(tmp_path / "large", {f"pkg{i // 100}/module_{i}.py": f"N = {i}\n" for i in range(500)})
    provider = make_provider(session, blobs=blobs, instance_profile=profile)
    for version, folder in ((1, "small"), (2, "large")):
        provider.launch([request(version, captured(spec(image_id=ami(), workdir=folder), tmp_path, blobs),
                                 version=version, token=f"tok-{version}")])
    small, large = (len(c.params["UserData"].encode()) for c in api.named("RunInstances"))
    assert small == large < 5_500  # the 500 files' paths alone would be 20 KB, over EC2's 16 KB


@pytest.mark.parametrize(("fields", "field"), [
    pytest.param({"workdir": "app"}, "workdir", id="workdir"),
    pytest.param({"file_mounts": (("/data/w.bin", "w.bin"),)}, "file_mounts", id="file_mounts"),
])
def test_a_version_stored_without_a_snapshot_is_a_permanent_outcome_naming_the_field(
        session: boto3.Session, api: Api, profile: str, tmp_path: Path, fields: dict[str, Any], field: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    write_tree(tmp_path, {"app/server.py": "x\n", "w.bin": "w"})  # on disk, but never read from there
    provider = make_provider(session, instance_profile=profile)
    monkeypatch.chdir(tmp_path)  # where a relative workdir would resolve, were it read from disk
    [outcome] = provider.launch([request(1, spec(image_id=ami(), **fields), version=4)])
    assert outcome.permanent and outcome.instance is None and outcome.error is not None
    assert outcome.error.startswith(f"{field}: version 4 has no snapshot of its files")
    assert "submit it again with `sky-lite serve update`" in outcome.error
    assert api.count("RunInstances") == 0 and api.count("PutObject") == 0 and api.count("CreateBucket") == 0


def test_s3_mounts_alone_need_no_bucket_of_ours(session: boto3.Session, api: Api, profile: str) -> None:
    provider = make_provider(session, instance_profile=profile)
    [outcome] = provider.launch([request(1, spec(image_id=ami(), file_mounts=(("~/d", "s3://someone/data"),)))])
    assert outcome.instance is not None
    assert "fetch s3://someone/data '~/d'" in api.named("RunInstances")[0].params["UserData"]
    assert api.count("CreateBucket") == 0 and api.count("PutObject") == 0


def test_local_files_without_an_instance_profile_are_a_permanent_error(session: boto3.Session, api: Api,
                                                                       blobs: BlobStore, tmp_path: Path) -> None:
    write_tree(tmp_path / "app", APP)
    task = captured(spec(image_id=ami(), workdir="app"), tmp_path, blobs)
    [outcome] = make_provider(session, blobs=blobs).launch([request(1, task)])
    assert outcome.permanent and outcome.error is not None and "instance profile" in outcome.error
    assert api.count("RunInstances") == 0 and api.count("PutObject") == 0


@pytest.mark.parametrize(("damage", "message"), [
    pytest.param(lambda path: path.unlink(), "is missing from the snapshot store: submit the task again",
                 id="missing"),
    pytest.param(lambda path: (path.unlink(), path.mkdir()), "cannot read its content from the snapshot store",
                 id="unreadable"),
])
def test_a_blob_the_store_cannot_give_is_a_permanent_outcome_naming_its_field(
        session: boto3.Session, api: Api, blobs: BlobStore, profile: str, tmp_path: Path,
        damage: Callable[[Path], object], message: str) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\x00")
    task = captured(spec(image_id=ami(), file_mounts=(("/data/w.bin", "weights.bin"),)), tmp_path, blobs)
    assert task.files is not None
    [digest] = task.files.blob_digests()
    damage(blobs.path_of(digest))
    [outcome] = make_provider(session, blobs=blobs, instance_profile=profile).launch([request(1, task)])
    assert outcome.permanent and outcome.instance is None and outcome.error is not None
    assert outcome.error.startswith("file_mounts./data/w.bin: /data/w.bin: ") and message in outcome.error
    assert api.count("RunInstances") == 0 and f"files/{task.files.digest}.tsv" not in put_keys(api)


def test_a_failed_upload_is_retried_with_every_byte(session: boto3.Session, api: Api, blobs: BlobStore,
                                                    profile: str, tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"w" * 10_000)
    task = captured(spec(image_id=ami(), file_mounts=(("/data/w.bin", "weights.bin"),)), tmp_path, blobs)
    assert task.files is not None
    [digest] = task.files.blob_digests()
    api.fail("PutObject", "SlowDown", when=lambda params: str(params["Key"]).startswith("blobs/"))
    [outcome] = make_provider(session, blobs=blobs, instance_profile=profile).launch([request(1, task)])
    assert outcome.instance is not None
    assert put_keys(api).count(f"blobs/{digest}") == 2
    assert read_object(compute_bucket_name(CONTROLLER, "svc"), f"blobs/{digest}") == "w" * 10_000


# --- files: the file list and the boot script's half of it ----------------------------------------------------------
def _entry(path: str, kind: EntryKind = EntryKind.FILE, **fields: Any) -> ManifestEntry:
    if kind is EntryKind.FILE:
        fields.setdefault("digest", "d" * 64)
    return ManifestEntry(path, kind, **fields)


@pytest.mark.parametrize(("files", "message"), [
    pytest.param(TaskFiles(mounts=(("/data/../../etc", Manifest((_entry(""),))),)),
                 "file_mounts./data/../../etc: '/data/../../etc' has a '..' component", id="dotdot-destination"),
    pytest.param(TaskFiles(workdir=Manifest((_entry("a/../../etc/passwd"),))),
                 "workdir: '/opt/sky-lite/workdir/a/../../etc/passwd' has a '..' component", id="dotdot-entry"),
    pytest.param(TaskFiles(workdir=Manifest((_entry("l", EntryKind.LINK, mode=0o777, target="x\ty"),))),
                 "workdir: l: link targets with tabs or newlines are not supported", id="tab-in-link"),
    pytest.param(TaskFiles(mounts=(("/a\nb", Manifest((_entry(""),))),)),
                 "file_mounts./a\nb: '/a\\nb': paths with tabs or newlines are not supported",
                 id="newline-in-destination"),
])
def test_find_placements_refuses_what_the_file_list_cannot_carry(files: TaskFiles, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        find_placements(files)
    assert str(raised.value).startswith(message)


def test_a_path_the_file_list_cannot_carry_is_a_permanent_outcome(session: boto3.Session, api: Api,
                                                                  profile: str) -> None:
    files = TaskFiles(mounts=(("/a/../b", Manifest((_entry(""),))),))
    task = dataclasses.replace(spec(image_id=ami(), file_mounts=(("/a/../b", "b"),)), files=files)
    [outcome] = make_provider(session, instance_profile=profile).launch([request(1, task)])
    assert outcome.permanent and outcome.error is not None and outcome.error.startswith("file_mounts./a/../b: ")
    assert api.count("RunInstances") == 0 and api.count("CreateBucket") == 0


def _apply(tmp_path: Path, blobs: BlobStore, file_list: str) -> subprocess.CompletedProcess[str]:
    """Run the boot script's ``apply_files`` under bash with an ``aws`` that copies from ``blobs``."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    (stubs / "aws").write_text('#!/bin/bash\n# aws s3 cp --only-show-errors s3://bucket/blobs/DIGEST PATH\n'
                               'source="${*: -2:1}" digest="${source##*/}"\n'
                               'cp "$BLOBS/${digest:0:2}/${digest:2}" "${*: -1}"\n')
    os.chmod(stubs / "aws", 0o755)
    (tmp_path / "files.tsv").write_text(file_list)
    script = (f"set -Eeuo pipefail\nfail() {{ echo \"sky-lite: $1\" >&2; exit 1; }}\n"
              f"home={tmp_path / 'home'}\n{render_copy_functions(AWS_BOOT)}\n{EXPAND_HOME}\n{APPLY_FILES}\n"
              f"apply_files {tmp_path / 'files.tsv'} s3://bucket/blobs/\n")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "BLOBS": str(blobs.root)}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_apply_files_writes_the_snapshot_where_the_file_list_says(blobs: BlobStore, tmp_path: Path) -> None:
    source = write_tree(tmp_path / "src", {"bin/start": "#!/bin/sh\n", "it's a file.txt": "quoted\n"})
    os.chmod(source / "bin" / "start", 0o750)
    (source / "empty").mkdir()
    (source / "link").symlink_to("../elsewhere")
    (tmp_path / "one.txt").write_text("one\n")
    target = tmp_path / "out dir"
    task = spec(file_mounts=((f"{target}/tree", "src"), (f"{target}/single.txt", "one.txt"),
                             ("~/conf/one.txt", "one.txt")))
    files = capture_task_files(task, tmp_path, "t", blobs)
    assert files is not None

    done = _apply(tmp_path, blobs, render_file_list(find_placements(files)))

    assert done.returncode == 0, done.stderr
    assert (target / "tree" / "bin" / "start").read_text() == "#!/bin/sh\n"
    assert (target / "tree" / "bin" / "start").stat().st_mode & 0o777 == 0o750
    assert (target / "tree" / "it's a file.txt").read_text() == "quoted\n"
    assert (target / "tree" / "empty").is_dir() and not any((target / "tree" / "empty").iterdir())
    assert os.readlink(target / "tree" / "link") == "../elsewhere"
    assert (target / "single.txt").read_text() == "one\n"
    assert (tmp_path / "home" / "conf" / "one.txt").read_text() == "one\n"  # ~: the home the script was given


@pytest.mark.parametrize("line", [
    pytest.param("file\t644\t{digest}\t{root}/a/../escaped", id="dotdot"),
    pytest.param("file\t644\t{digest}\t{root}/..", id="dotdot-last"),
    pytest.param("file\t644\t{digest}\trelative/path", id="relative"),
    pytest.param("file\t6x4\t{digest}\t{root}/bad-mode", id="bad-mode"),
    pytest.param("socket\t644\t-\t{root}/s", id="unknown-kind"),
])
def test_apply_files_refuses_a_file_list_line_that_could_land_anywhere(blobs: BlobStore, tmp_path: Path,
                                                                     line: str) -> None:
    digest, _ = blobs.put(io.BytesIO(b"x"))
    root = tmp_path / "root" / "inner"
    done = _apply(tmp_path, blobs, line.format(digest=digest, root=root) + "\n")
    assert done.returncode != 0 and "sky-lite: file list: " in done.stderr
    assert not (tmp_path / "root" / "escaped").exists() and not (tmp_path / "escaped").exists()


# --- security group -----------------------------------------------------------------------------------------------
def test_security_group_is_created_once_and_opens_only_the_service_port_to_the_vpc(session: boto3.Session,
                                                                                    api: Api) -> None:
    image = ami()
    provider = make_provider(session)
    provider.launch([request(1, spec(image_id=image, port=9000))])
    provider.launch([request(2, spec(image_id=image, port=9000), token="t2")])
    make_provider(session).launch([request(3, spec(image_id=image, port=9000), token="t3")])  # restarted

    assert api.count("CreateSecurityGroup") == 1
    assert api.count("AuthorizeSecurityGroupIngress") == 1
    ec2 = boto3.client("ec2", region_name=REGION)
    [group] = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [f"sky-lite-{CONTROLLER}"]}])[
        "SecurityGroups"]
    vpc_cidr = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["CidrBlock"]
    rules = [(p["FromPort"], r["CidrIp"]) for p in group["IpPermissions"] for r in p["IpRanges"]]
    assert rules == [(9000, vpc_cidr)]
    assert all(c.params["SecurityGroupIds"] == [group["GroupId"]] for c in api.named("RunInstances"))


def test_resources_ports_are_opened_to_everyone_only_when_asked(provider: AwsProvider) -> None:
    provider.launch([request(1, spec(image_id=ami(), ports=(443,)))])
    ec2 = boto3.client("ec2", region_name=REGION)
    [group] = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [f"sky-lite-{CONTROLLER}"]}])[
        "SecurityGroups"]
    world = sorted(p["FromPort"] for p in group["IpPermissions"] for r in p["IpRanges"]
                   if r["CidrIp"] == "0.0.0.0/0")
    assert world == [443]


# --- terminate -------------------------------------------------------------------------------------------------------
def test_terminate_is_one_call_per_region_and_ignores_unknown_and_gone_instances(provider: AwsProvider,
                                                                                   api: Api) -> None:
    east = provider.launch([request(1, spec(image_id=ami())), request(2, spec(image_id=ami()))])
    west = provider.launch([request(3, spec(image_id=ami("us-west-2"), region="us-west-2", zone=None))])
    ids = [o.instance.instance_id for o in east + west if o.instance]
    api.calls.clear()

    provider.terminate([*ids, "i-0000000000000dead"])

    calls = api.named("TerminateInstances")
    assert sorted((c.region, len(c.params["InstanceIds"])) for c in calls) == [(REGION, 2), ("us-west-2", 1)]
    assert {i.state for i in provider.list_instances(["us-west-2"])} == {InstanceState.TERMINATED}
    api.calls.clear()
    provider.terminate(ids)  # all gone at the last look: nothing to ask
    assert api.count("TerminateInstances") == 0


def test_terminate_drops_ids_aws_does_not_know(provider: AwsProvider, api: Api) -> None:
    [outcome] = provider.launch([request(1, spec(image_id=ami()))])
    assert outcome.instance is not None
    # An id seen once but since forgotten by EC2: AWS refuses the whole call and names it.
    provider._regions_by_instance["i-0000000000000beef"] = REGION
    provider.terminate([outcome.instance.instance_id, "i-0000000000000beef"])
    assert [c.params["InstanceIds"] for c in api.named("TerminateInstances")] == [
        [outcome.instance.instance_id, "i-0000000000000beef"], [outcome.instance.instance_id]]
    assert describe(outcome.instance.instance_id)["State"]["Name"] in ("shutting-down", "terminated")


# --- crash recovery through the controller ------------------------------------------------------------------
def _controller(tmp_path: Path, provider: AwsProvider) -> tuple[Any, Any]:
    from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
    from skyserve_lite.controller.probe import FakeProber
    from skyserve_lite.controller.reconcile import Reconciler
    from skyserve_lite.controller.settings import ControllerSettings
    from skyserve_lite.spec.model import SubmittedTask
    from skyserve_lite.spec.parse import parse_task
    from skyserve_lite.state.store import Store

    store = Store.open(tmp_path / "home")
    text = (f"resources:\n  cloud: aws\n  region: {REGION}\n  zone: us-east-1a\n  image_id: {ami()}\n"
            "service:\n  replicas: 2\nrun: python -m http.server 8080\n")
    store.create_service("svc", SubmittedTask(text, "/svc.yaml", parse_task(text)), 30001, 0.0)
    reconciler = Reconciler(store, {"aws": provider}, FakeProber(), FakeLoadBalancerRunner(), FakeClock(),
                            ControllerSettings())
    return store, reconciler


def _intent(store: Any) -> list[Any]:
    """What the executor writes before it calls RunInstances: PROVISIONING rows with the batch's token."""
    from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus

    template = ReplicaRecord(service="svc", replica_id=0, version=1, status=ReplicaStatus.PROVISIONING, cloud="aws",
                             launched_at=FakeClock().now(), status_since=FakeClock().now(), launch_token="tok-crash")
    return list(store.add_replicas("svc", 2, template))


def test_crash_between_intent_and_launch_launches_once(tmp_path: Path, provider: AwsProvider, api: Api) -> None:
    store, reconciler = _controller(tmp_path, provider)
    rows = _intent(store)  # ... and the controller died before RunInstances
    reconciler.reconcile_once()
    reconciler.reconcile_once()
    assert api.count("RunInstances") == 1
    adopted = {r.replica_id: r.instance_id for r in store.list_replicas("svc")}
    assert sorted(adopted) == [r.replica_id for r in rows] and all(adopted.values())
    assert api.count("TerminateInstances") == 0


def test_crash_between_launch_and_recording_adopts_without_launching_again(tmp_path: Path, provider: AwsProvider,
                                                                         api: Api) -> None:
    store, reconciler = _controller(tmp_path, provider)
    rows = _intent(store)
    version = store.get_version("svc", 1)
    outcomes = provider.launch([request(r.replica_id, version.spec, token=r.launch_token) for r in rows])
    launched = {o.replica_id: o.instance.instance_id for o in outcomes if o.instance}
    # ... and the controller died before writing the instance ids.
    assert all(r.instance_id is None for r in store.list_replicas("svc"))
    reconciler.reconcile_once()
    assert api.count("RunInstances") == 1
    assert {r.replica_id: r.instance_id for r in store.list_replicas("svc")} == launched
    assert api.count("TerminateInstances") == 0


def test_instances_no_row_claims_are_terminated(tmp_path: Path, provider: AwsProvider, api: Api) -> None:
    store, reconciler = _controller(tmp_path, provider)
    rows = _intent(store)
    version = store.get_version("svc", 1)
    provider.launch([request(r.replica_id, version.spec, token=r.launch_token) for r in rows])
    store.delete_replicas([("svc", r.replica_id) for r in rows])  # the rows are gone: nothing claims them
    reconciler.reconcile_once()
    terminated = {i for call in api.named("TerminateInstances") for i in call.params["InstanceIds"]}
    assert len(terminated) == 2


def test_read_log_is_the_console_output_of_the_instance(tmp_path: Path, provider: AwsProvider, api: Api) -> None:
    store, reconciler = _controller(tmp_path, provider)
    reconciler.reconcile_once()
    (row, *_rest) = store.list_replicas("svc")
    assert row.instance_id is not None
    log = provider.read_log("svc", row.replica_id, row.instance_id, row.region)
    assert log is not None and log.path is None
    assert log.text  # moto answers with a fixed text; EC2 with the serial console
    assert provider.read_log("svc", row.replica_id, None, None) is None  # no instance: nothing to ask
    assert [c.params["InstanceId"] for c in api.named("GetConsoleOutput")] == [row.instance_id]

    from skyserve_lite.api import LocalController

    assert LocalController(tmp_path / "home", FakeClock(), start_daemon=False).find_log("svc", row.replica_id) == log


def test_abandon_leaves_the_instances_and_calls_nothing(provider: AwsProvider, api: Api) -> None:
    provider.launch([request(1, spec(image_id=ami()))])
    api.calls.clear()
    provider.abandon()
    assert api.calls == []
    assert [i.state for i in provider.list_instances()] == [InstanceState.RUNNING]


# --- configuration errors at the boundary ------------------------------------------------------------------------
@pytest.fixture
def missing_profile(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """AWS_PROFILE names a profile that no configuration file has; nothing may leave this machine."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")


@pytest.mark.parametrize("call", [
    pytest.param(lambda p: p.list_instances([REGION]), id="list_instances"),
    pytest.param(lambda p: p.launch([request(1, spec())]), id="launch"),
    pytest.param(lambda p: p.release_service("svc"), id="release_service"),
    pytest.param(lambda p: p.read_log("svc", 1, "i-0123456789abcdef0", REGION), id="read_log"),
])
def test_a_missing_aws_profile_is_a_permanent_error_naming_it_from_every_method(
        missing_profile: None, call: Callable[[AwsProvider], object]) -> None:
    provider = AwsProvider(CONTROLLER, FakeClock(), blobs=NO_BLOBS, sleep=lambda _: None)  # builds its own session
    with pytest.raises(PermanentProviderError) as raised:
        call(provider)
    message = str(raised.value)
    assert "AWS_PROFILE" in message and "'no-such-profile'" in message and "credential chain" in message
    assert isinstance(raised.value.__cause__, ProfileNotFound)


def test_terminate_and_abandon_need_no_session(missing_profile: None) -> None:
    provider = AwsProvider(CONTROLLER, FakeClock(), blobs=NO_BLOBS, sleep=lambda _: None)
    provider.terminate(["i-0123456789abcdef0"])  # never seen: nothing to ask, no session built
    provider.abandon()


def test_a_malformed_endpoint_url_is_a_permanent_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "not a url")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    provider = AwsProvider(CONTROLLER, FakeClock(), blobs=NO_BLOBS, default_region=REGION, sleep=lambda _: None)
    with pytest.raises(PermanentProviderError, match="AWS_ENDPOINT_URL"):
        provider.list_instances()


# --- placements: candidates, default images, disk tiers ---------------------------------------------------------------
def placed(*placements: Placement, **fields: Any) -> TaskSpec:
    """A task whose version resolved to ``placements`` (what `serve up` stores), on-demand."""
    return dataclasses.replace(spec(image_id=None, zone=None, **fields), resolution=Resolution(ondemand=placements))


def test_no_capacity_for_the_first_candidate_launches_the_next_on_moto(provider: AwsProvider, api: Api) -> None:
    first = Placement(cloud="aws", candidate=0, region=REGION, zones=("us-east-1a", "us-east-1b"),
                      instance_type="g6.xlarge", image=ami(), need="L4:1", price_per_hour=0.8048)
    second = Placement(cloud="aws", candidate=1, region=REGION, zones=("us-east-1a",), instance_type="g5.xlarge",
                       image=ami(), need="A10G:1", price_per_hour=1.006)
    api.fail("RunInstances", "InsufficientInstanceCapacity", times=100,
             when=lambda p: p["InstanceType"] == "g6.xlarge")
    [outcome] = provider.launch([request(1, placed(first, second))])
    assert [c.params["InstanceType"] for c in api.named("RunInstances")] == ["g6.xlarge", "g6.xlarge", "g5.xlarge"]
    assert outcome.instance is not None
    assert describe(outcome.instance.instance_id)["InstanceType"] == "g5.xlarge"
    assert outcome.instance.detail is not None
    assert outcome.instance.detail.startswith("landed on candidate 2: A10G:1 -> g5.xlarge")


def test_a_default_image_is_read_from_its_public_parameter_once_per_region(provider: AwsProvider, api: Api) -> None:
    import datetime

    from moto.ssm.models import Parameter, ssm_backends

    # AWS publishes these parameters and refuses PutParameter under /aws/: placed in moto's backend directly.
    name = DEFAULT_IMAGES[("aws", "x86_64", False)].removeprefix(SSM_PREFIX)
    ssm_backends[DEFAULT_ACCOUNT_ID][REGION]._parameters[name].append(Parameter(  # type: ignore[abstract]
        account_id=DEFAULT_ACCOUNT_ID, name=name, value=ami(), parameter_type="String", description=None,
        allowed_pattern=None, keyid=None, last_modified_date=datetime.datetime.now(datetime.timezone.utc),
        version=1, data_type="text"))
    placement = Placement(cloud="aws", region=REGION, zones=("us-east-1a",), instance_type="m5.large",
                          image=SSM_PREFIX + name, image_is_default=True)
    outcomes = provider.launch([request(1, placed(placement)), request(2, placed(placement), token="tok-2")])
    assert all(o.instance is not None for o in outcomes)
    assert {c.params["ImageId"] for c in api.named("RunInstances")} == {ami()}
    assert api.count("GetParameter") == 1


def test_a_missing_default_image_parameter_fails_naming_image_id(provider: AwsProvider, api: Api) -> None:
    placement = Placement(cloud="aws", region=REGION, zones=("us-east-1a",), instance_type="m5.large",
                          image=SSM_PREFIX + "/aws/service/nothing/here", image_is_default=True)
    [outcome] = provider.launch([request(1, placed(placement))])
    assert outcome.permanent and outcome.error is not None
    assert outcome.error.startswith("resources.image_id: the default image's parameter /aws/service/nothing/here")
    assert api.count("RunInstances") == 0


def test_a_disk_tier_becomes_the_root_volume_type_iops_and_throughput(provider: AwsProvider, api: Api) -> None:
    placement = Placement(cloud="aws", region=REGION, zones=("us-east-1a",), instance_type="m5.large", image=ami(),
                          disk_size=100, disk_type="gp3", disk_iops=7000, disk_throughput=437)
    [outcome] = provider.launch([request(1, placed(placement))])
    assert outcome.instance is not None
    [mapping] = api.named("RunInstances")[0].params["BlockDeviceMappings"]
    assert mapping["Ebs"] == {"VolumeType": "gp3", "DeleteOnTermination": True, "VolumeSize": 100, "Iops": 7000,
                              "Throughput": 437}
