"""The controller VM on EC2 (moto in-process): one tagged instance with an instance profile, a key pair and
a security group that opens only the load balancer range and SSH to the given blocks; found again rather
than launched twice; and nothing left after ``delete``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from skyserve_lite.clock import FakeClock
from skyserve_lite.files.blobs import blob_store_of
from skyserve_lite.providers.aws import AwsProvider
from skyserve_lite.providers.aws_machine import TAG_HOST, AwsMachines
from skyserve_lite.providers.machines import MachineRequest
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
    policy = iam.get_role_policy(RoleName="sky-lite-controller-abc123", PolicyName="sky-lite-controller")
    actions = {a for s in policy["PolicyDocument"]["Statement"] for a in
               ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "s3:PutObject", "iam:PassRole"} <= actions
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
