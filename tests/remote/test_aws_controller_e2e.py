"""`controller up --cloud aws` against moto's server on 127.0.0.1, with instance emulation: the controller
VM moto reports running is booted here as an sshd on a 127.0.0.1 port that accepts the VM's key, so the
whole bootstrap, a service's life and `controller down` run for real over SSH. Nothing contacts the
instance's own addresses."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyserve_lite.remote.config import load_record
from tests.controller.fake_crontab import write_fake_crontab
from tests.e2e.conftest import SkyLite
from tests.e2e.test_aws_e2e import REGION, moto  # noqa: F401 (the moto server fixture)
from tests.remote.sshd import SSHD
from tests.remote.test_ssh_e2e import serve_one_through_the_host

boto3 = pytest.importorskip("boto3")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.skipif(SSHD is None, reason="needs OpenSSH's sshd (.ci/run installs it)")]


@pytest.fixture
def sky(tmp_path: Path, moto: str) -> Iterator[SkyLite]:  # noqa: F811
    # moto keeps its backends per process: start from an empty account, whatever earlier tests launched.
    urllib.request.urlopen(urllib.request.Request(f"{moto}/moto-api/reset", method="POST"), timeout=10).close()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    crontab = tmp_path / "crontab.txt"
    write_fake_crontab(fake_bin, crontab)
    instance = SkyLite(tmp_path / "home")
    instance.env |= {"SKY_LITE_EMULATE_INSTANCES": "1", "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    yield instance
    with contextlib.suppress(AssertionError, OSError):
        instance.run("controller", "down", "--force", "-y", check=False, timeout=180)
    instance.cleanup()
    host_homes = list((instance.home / "emulated-hosts").glob("*/login-home/.sky-lite"))
    for host_home in host_homes:
        SkyLite(host_home).cleanup()


def test_controller_vm_on_aws_from_up_to_down(sky: SkyLite, tmp_path: Path) -> None:
    ec2, iam = boto3.client("ec2", region_name=REGION), boto3.client("iam", region_name=REGION)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    result = sky.run("controller", "up", "--cloud", "aws", "--region", REGION, "--image-id", image,
                     "--allow-cidr", "198.51.100.0/24", "--ssh-cidr", "203.0.113.7/32",
                     "--remote-python", str(getattr(sys, "_base_executable", sys.executable)), timeout=600)
    record = load_record(sky.home)
    assert record is not None and record.machine is not None
    assert record.machine.instance_id in result.stdout and "pinned" in result.stdout

    (raw,) = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    assert raw["InstanceId"] == record.machine.instance_id and raw["State"]["Name"] == "running"
    assert {t["Key"]: t["Value"] for t in raw["Tags"]}["sky-lite:controller-host"] == record.machine.machine_id
    assert raw["IamInstanceProfile"]["Arn"].endswith(f"sky-lite-controller-{record.machine.machine_id}")
    (group,) = ec2.describe_security_groups(GroupIds=[g["GroupId"] for g in raw["SecurityGroups"]])["SecurityGroups"]
    assert {(p["FromPort"], p["ToPort"], r["CidrIp"]) for p in group["IpPermissions"] for r in p["IpRanges"]} == {
        (30001, 30999, "198.51.100.0/24"), (22, 22, "203.0.113.7/32")}
    # The host has the cloud's dependencies, and its own state; this machine only the record.
    assert json.loads(sky.run("controller", "status", "-o", "json").stdout)["running"] is True
    assert not (sky.home / "state.db").exists()
    # The VM's role may pass only its replicas' role, and act only on what its controller id names.
    machine_id = record.machine.machine_id
    policy = iam.get_role_policy(RoleName=f"sky-lite-controller-{machine_id}", PolicyName="sky-lite-controller")
    statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    assert statements["PassReplicaRole"]["Resource"][0].endswith(f":role/sky-lite-replica-{machine_id}")
    (controller_id,) = {s["Condition"]["StringEquals"]["aws:ResourceTag/sky-lite:controller"]
                        for s in statements.values() if "aws:ResourceTag/sky-lite:controller" in str(s)}
    assert f"sky-lite:controller={controller_id}" in result.stderr
    (host_home,) = (sky.home / "emulated-hosts").glob("*/login-home/.sky-lite")
    assert (host_home / "controller-id").read_text().strip() == controller_id  # the host's own id

    serve_one_through_the_host(sky, tmp_path)

    down = sky.run("controller", "down", "-y", timeout=300)
    assert record.machine.instance_id in down.stdout and load_record(sky.home) is None
    states = {i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
    assert states == {"terminated"}
    assert not ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [
        f"sky-lite-controller-{record.machine.machine_id}"]}])["SecurityGroups"]
    assert not iam.list_roles()["Roles"] and not iam.list_instance_profiles()["InstanceProfiles"]
    assert not ec2.describe_key_pairs()["KeyPairs"]
    assert not list((sky.home / "emulated-hosts").glob("*"))
