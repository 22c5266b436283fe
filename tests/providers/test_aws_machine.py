"""The controller VM on EC2 (moto in-process): one tagged instance with an instance profile, a key pair and
a security group that opens only the load balancer range and SSH to the given blocks; found again rather
than launched twice; and nothing left after ``delete``.

Its policies are values (``compute_controller_policy``, ``compute_replica_policy``) read statement by statement
here: moto evaluates no IAM condition, so what a statement allows is checked as what it says."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.core.models import DEFAULT_ACCOUNT_ID

from skyserve_lite.clock import FakeClock
from skyserve_lite.files.blobs import blob_store_of
from skyserve_lite.providers.aws import TAG_CONTROLLER, AwsPermanentError, AwsProvider
from skyserve_lite.providers.aws_machine import (
    TAG_HOST,
    AwsMachines,
    AwsScope,
    compute_controller_policy,
    compute_replica_policy,
    parse_role_arn,
    plan_ingress,
)
from skyserve_lite.providers.cloud_secrets import compute_secret_name
from skyserve_lite.providers.machines import MachineRequest
from skyserve_lite.providers.staging import compute_bucket_name
from tests.providers.test_aws import REGION, Api, ami

PUBLIC_KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKqkl7S0+1G4GD/J3s7Fk5kbWeZ8gm1N4x1ys4W3gTST sky-lite")


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[boto3.Session]:
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL_IAM"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        yield boto3.Session(region_name=REGION)


@pytest.fixture
def api(session: boto3.Session) -> Api:
    return Api(session)


@pytest.fixture
def machines(session: boto3.Session, tmp_path: Path) -> AwsMachines:
    provider = AwsProvider("m1", FakeClock(), blobs=blob_store_of(tmp_path), session=session,
                           sleep=lambda _s: None)
    return AwsMachines(provider, sleep=lambda _s: None)


def request(**changes: Any) -> MachineRequest:
    values: dict[str, Any] = {"machine_id": "abc123", "region": REGION, "image_id": ami(), "public_key": PUBLIC_KEY,
                              "allow_cidr": "198.51.100.0/24", "ssh_cidr": "203.0.113.7/32",
                              "lb_ports": (30001, 30999)} | changes
    return MachineRequest(**values)


def _ingress(group_id: str) -> set[tuple[int, int, str]]:
    group = boto3.client("ec2", region_name=REGION).describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]
    return {(p["FromPort"], p["ToPort"], r["CidrIp"]) for p in group["IpPermissions"] for r in p["IpRanges"]}


def test_one_tagged_instance_with_its_identity_and_a_narrow_group(machines: AwsMachines, api: Api) -> None:
    launched = machines.ensure(request())
    ec2, iam = boto3.client("ec2", region_name=REGION), boto3.client("iam", region_name=REGION)
    (raw,) = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags[TAG_HOST] == "abc123" and raw["InstanceId"] == launched.instance_id
    assert raw["KeyName"] == "sky-lite-controller-abc123"
    assert raw["IamInstanceProfile"]["Arn"].endswith("instance-profile/sky-lite-controller-abc123")
    resources = dict(launched.resources)
    assert _ingress(resources["security-group"]) == {(30001, 30999, "198.51.100.0/24"), (22, 22, "203.0.113.7/32")}
    profile = iam.get_instance_profile(InstanceProfileName="sky-lite-controller-abc123")["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == ["sky-lite-controller-abc123"]
    trust = iam.get_role(RoleName="sky-lite-controller-abc123")["Role"]["AssumeRolePolicyDocument"]
    trust = json.loads(trust) if isinstance(trust, str) else trust
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    replicas = iam.get_instance_profile(InstanceProfileName="sky-lite-replica-abc123")["InstanceProfile"]
    assert [r["RoleName"] for r in replicas["Roles"]] == ["sky-lite-replica-abc123"]
    assert resources["replica-instance-profile"] == "sky-lite-replica-abc123"
    # No permission yet: they come from `grant`, once the VM's controller says its id.
    assert not iam.list_role_policies(RoleName="sky-lite-controller-abc123")["PolicyNames"]
    assert api.count("RunInstances") == 1


def test_ensuring_again_finds_the_machine_instead_of_launching_another(machines: AwsMachines, api: Api) -> None:
    first = machines.ensure(request())
    again = machines.ensure(request())
    assert again.instance_id == first.instance_id and api.count("RunInstances") == 1
    assert machines.wait_running("abc123", REGION).state == "running"
    assert _ingress(dict(again.resources)["security-group"]) == {(30001, 30999, "198.51.100.0/24"),
                                                                 (22, 22, "203.0.113.7/32")}


def test_delete_leaves_no_instance_group_key_or_role(machines: AwsMachines) -> None:
    machines.ensure(request())
    done = machines.delete("abc123", REGION)
    ec2, iam = boto3.client("ec2", region_name=REGION), boto3.client("iam", region_name=REGION)
    states = {i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
    assert states == {"terminated"}
    assert not ec2.describe_security_groups(Filters=[{"Name": "group-name",
                                                      "Values": ["sky-lite-controller-abc123"]}])["SecurityGroups"]
    assert not ec2.describe_key_pairs()["KeyPairs"]
    assert not iam.list_instance_profiles()["InstanceProfiles"] and not iam.list_roles()["Roles"]
    assert any(line.startswith("terminated instance") for line in done)
    assert machines.delete("abc123", REGION) == []  # idempotent: nothing left to delete


def test_delete_takes_policies_the_owner_attached_off_the_roles_it_deletes(machines: AwsMachines) -> None:
    machines.ensure(request())
    machines.grant("abc123", REGION, CONTROLLER_ID)
    iam = boto3.client("iam", region_name=REGION)
    arn = iam.create_policy(PolicyName="mine", PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::my-data/*"}]}))["Policy"]["Arn"]
    iam.attach_role_policy(RoleName="sky-lite-replica-abc123", PolicyArn=arn)
    done = machines.delete("abc123", REGION)
    assert "deleted role sky-lite-replica-abc123" in done and not iam.list_roles()["Roles"]
    assert [p["Arn"] for p in iam.list_policies(Scope="Local")["Policies"]] == [arn]  # the policy itself stays


# --- the policies, statement by statement --------------------------------------------------------------------
CONTROLLER_ID = "0123456789ab"
ACCOUNT = "210987654321"
SCOPE = AwsScope(partition="aws", account=ACCOUNT, controller_id=CONTROLLER_ID, replica_role="sky-lite-replica-m1")
TAGGED = {"StringEquals": {f"aws:ResourceTag/{TAG_CONTROLLER}": CONTROLLER_ID}}
TAGGING = {"StringEquals": {f"aws:RequestTag/{TAG_CONTROLLER}": CONTROLLER_ID}}
EC2 = f"arn:aws:ec2:*:{ACCOUNT}:"
BUCKETS = "arn:aws:s3:::sky-lite-0123456789ab-*"
SECRETS = f"arn:aws:secretsmanager:*:{ACCOUNT}:secret:sky-lite_0123456789ab_*"

CONTROLLER_STATEMENTS = [
    ("Describe", ["ec2:DescribeInstances", "ec2:DescribeAvailabilityZones", "ec2:DescribeImages",
                  "ec2:DescribeVpcs", "ec2:DescribeSecurityGroups"], ["*"], None),
    ("LaunchTagged", ["ec2:RunInstances"], [EC2 + "instance/*", EC2 + "volume/*"], TAGGING),
    ("LaunchUsing", ["ec2:RunInstances"], ["arn:aws:ec2:*::image/*", "arn:aws:ec2:*::snapshot/*", EC2 + "subnet/*",
                                          EC2 + "network-interface/*", EC2 + "security-group/*", EC2 + "key-pair/*",
                                          EC2 + "spot-instances-request/*"], None),
    ("TagOnCreate", ["ec2:CreateTags"], [EC2 + "instance/*", EC2 + "volume/*", EC2 + "security-group/*"],
     {"StringEquals": {"ec2:CreateAction": ["RunInstances", "CreateSecurityGroup"]}}),
    ("ActOnTagged", ["ec2:TerminateInstances", "ec2:GetConsoleOutput"], [EC2 + "instance/*"], TAGGED),
    ("GroupCreate", ["ec2:CreateSecurityGroup"], [EC2 + "security-group/*"], TAGGING),
    ("GroupInVpc", ["ec2:CreateSecurityGroup"], [EC2 + "vpc/*"], None),
    ("GroupIngress", ["ec2:AuthorizeSecurityGroupIngress"], [EC2 + "security-group/*"], TAGGED),
    ("PublicImages", ["ssm:GetParameter"], ["arn:aws:ssm:*::parameter/aws/service/*"], None),
    ("Buckets", ["s3:CreateBucket", "s3:ListBucket", "s3:DeleteBucket"], [BUCKETS], None),
    ("Objects", ["s3:PutObject", "s3:DeleteObject"], [BUCKETS + "/*"], None),
    ("PassReplicaRole", ["iam:PassRole"], [f"arn:aws:iam::{ACCOUNT}:role/sky-lite-replica-m1"],
     {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}),
    ("Secrets", ["secretsmanager:CreateSecret", "secretsmanager:DescribeSecret", "secretsmanager:DeleteSecret",
                 "secretsmanager:TagResource"], [SECRETS], None),
    ("ListSecrets", ["secretsmanager:ListSecrets"], ["*"], None),
]


def _statements(policy: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["Sid"]: s for s in policy["Statement"]}


@pytest.mark.parametrize(("sid", "actions", "resources", "condition"), CONTROLLER_STATEMENTS,
                         ids=[row[0] for row in CONTROLLER_STATEMENTS])
def test_each_statement_of_the_controller_policy(sid: str, actions: list[str], resources: list[str],
                                                 condition: dict[str, Any] | None) -> None:
    statement = _statements(compute_controller_policy(SCOPE))[sid]
    assert (statement["Effect"], statement["Action"], statement["Resource"], statement.get("Condition")) == (
        "Allow", actions, resources, condition)


def test_the_controller_policy_has_those_statements_and_no_other() -> None:
    assert list(_statements(compute_controller_policy(SCOPE))) == [row[0] for row in CONTROLLER_STATEMENTS]


def test_only_describe_and_list_secrets_are_granted_on_every_resource() -> None:
    # Describe* and ListSecrets have no resource-level permissions; every other action names what it may touch.
    assert [s["Sid"] for s in compute_controller_policy(SCOPE)["Statement"] if "*" in s["Resource"]] == [
        "Describe", "ListSecrets"]


def test_every_action_that_changes_or_reads_an_existing_instance_is_held_to_the_controller_tag() -> None:
    for statement in compute_controller_policy(SCOPE)["Statement"]:
        acts = set(statement["Action"]) & {"ec2:TerminateInstances", "ec2:GetConsoleOutput", "ec2:StopInstances",
                                           "ec2:AuthorizeSecurityGroupIngress", "ec2:CreateTags"}
        if acts:
            assert statement.get("Condition"), statement["Sid"]


def test_the_replica_policy_reads_the_objects_of_the_controller_buckets_and_its_secrets_only() -> None:
    assert compute_replica_policy(SCOPE) == {"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadSnapshots", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [BUCKETS + "/*"]},
        {"Sid": "ReadSecrets", "Effect": "Allow", "Action": ["secretsmanager:GetSecretValue"],
         "Resource": [SECRETS]}]}


@pytest.mark.parametrize("service", ["web", "a-very-long-service-name-that-gets-its-bucket-name-shortened", "x1"])
def test_the_bucket_grant_covers_this_controller_buckets_and_not_another_one(service: str) -> None:
    granted = BUCKETS.removeprefix("arn:aws:s3:::")
    assert fnmatch.fnmatchcase(compute_bucket_name(CONTROLLER_ID, service), granted)
    assert not fnmatch.fnmatchcase(compute_bucket_name("ba9876543210", service), granted)


def test_the_secret_grants_cover_this_controller_secrets_and_not_another_ones() -> None:
    # Secrets Manager appends "-" and six random characters to a secret's ARN.
    def arn(controller_id: str, service: str) -> str:
        name = compute_secret_name(controller_id, service, "0123456789abcdef" * 2)
        return f"arn:aws:secretsmanager:eu-west-1:{ACCOUNT}:secret:{name}-AbCdEf"

    assert fnmatch.fnmatchcase(arn(CONTROLLER_ID, "web"), SECRETS)
    assert not fnmatch.fnmatchcase(arn("0123456789abc", "web"), SECRETS)  # an id that starts with this one
    assert not fnmatch.fnmatchcase(arn("ba9876543210", "web"), SECRETS)


def test_the_policies_follow_the_partition_and_account() -> None:
    scope = AwsScope(partition="aws-cn", account="1", controller_id=CONTROLLER_ID, replica_role="r")
    text = json.dumps(compute_controller_policy(scope))
    assert "arn:aws:" not in text and '"arn:aws-cn:iam::1:role/r"' in text


@pytest.mark.parametrize(("arn", "expected"), [
    ("arn:aws:iam::123456789012:role/sky-lite-controller-m1", ("aws", "123456789012")),
    ("arn:aws-us-gov:iam::1:role/path/r", ("aws-us-gov", "1")),
])
def test_a_role_arn_gives_partition_and_account(arn: str, expected: tuple[str, str]) -> None:
    assert parse_role_arn(arn) == expected


@pytest.mark.parametrize("arn", ["", "arn:aws:iam::123:user/x", "arn:aws:s3:::bucket", "arn:aws:iam:::role/r"])
def test_anything_else_is_no_role_arn(arn: str) -> None:
    with pytest.raises(AwsPermanentError, match="for a role's ARN"):
        parse_role_arn(arn)



@pytest.mark.parametrize(("have", "add", "remove"), [
    (set(), [(22, 22, "203.0.113.7/32"), (30001, 30999, "0.0.0.0/0")], []),
    ({(22, 22, "203.0.113.7/32"), (30001, 30999, "0.0.0.0/0")}, [], []),
    # An earlier run opened SSH to everyone: that rule goes, the new block comes.
    ({(22, 22, "0.0.0.0/0"), (30001, 30999, "0.0.0.0/0")}, [(22, 22, "203.0.113.7/32")], [(22, 22, "0.0.0.0/0")]),
    # A rule on another port is somebody else's: kept.
    ({(22, 22, "203.0.113.7/32"), (30001, 30999, "0.0.0.0/0"), (8080, 8080, "0.0.0.0/0")}, [], []),
])
def test_plan_ingress(have: set[tuple[int, int, str]], add: list[tuple[int, int, str]],
                      remove: list[tuple[int, int, str]]) -> None:
    assert plan_ingress(have, {(22, 22, "203.0.113.7/32"), (30001, 30999, "0.0.0.0/0")}) == (add, remove)


def test_grant_puts_the_scoped_policies_on_both_roles(machines: AwsMachines) -> None:
    machines.ensure(request())
    lines = machines.grant("abc123", REGION, CONTROLLER_ID)
    iam = boto3.client("iam", region_name=REGION)
    scope = AwsScope(partition="aws", account=DEFAULT_ACCOUNT_ID, controller_id=CONTROLLER_ID,
                     replica_role="sky-lite-replica-abc123")
    put = iam.get_role_policy(RoleName="sky-lite-controller-abc123", PolicyName="sky-lite-controller")
    assert put["PolicyDocument"] == compute_controller_policy(scope)
    put = iam.get_role_policy(RoleName="sky-lite-replica-abc123", PolicyName="sky-lite-replica")
    assert put["PolicyDocument"] == compute_replica_policy(scope)
    assert any(f"{TAG_CONTROLLER}={CONTROLLER_ID}" in line and "sky-lite-0123456789ab-*" in line for line in lines)
    assert machines.grant("abc123", REGION, CONTROLLER_ID) == lines  # idempotent


def test_a_rerun_with_another_ssh_block_replaces_the_old_one(machines: AwsMachines) -> None:
    first = machines.ensure(request(ssh_cidr="0.0.0.0/0"))
    machines.ensure(request())
    assert _ingress(dict(first.resources)["security-group"]) == {(30001, 30999, "198.51.100.0/24"),
                                                                 (22, 22, "203.0.113.7/32")}
