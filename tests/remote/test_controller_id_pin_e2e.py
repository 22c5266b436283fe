"""`controller up --cloud aws` twice against moto on 127.0.0.1 with instance emulation (as in
``test_aws_controller_e2e``), the VM's state made to say the controller id ``*`` in between, as a compromised
VM could: the second `controller up` is refused, and the VM's role keeps the policy of its first id."""

from __future__ import annotations

import sqlite3
import sys

import pytest

from skyserve_lite.remote.config import load_record
from tests.e2e.conftest import SkyLite
from tests.e2e.test_aws_e2e import REGION, moto  # noqa: F401 (the moto server fixture)
from tests.remote.sshd import SSHD
from tests.remote.test_aws_controller_e2e import sky  # noqa: F401 (the emulated controller VM's fixture)

boto3 = pytest.importorskip("boto3")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.skipif(SSHD is None, reason="needs OpenSSH's sshd (.ci/run installs it)")]


def test_a_vm_that_says_another_controller_id_later_is_refused(sky: SkyLite) -> None:  # noqa: F811
    ec2, iam = boto3.client("ec2", region_name=REGION), boto3.client("iam", region_name=REGION)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    up = ("controller", "up", "--cloud", "aws", "--region", REGION, "--image-id", image,
          "--ssh-cidr", "203.0.113.7/32", "--remote-python", str(getattr(sys, "_base_executable", sys.executable)))
    sky.run(*up, timeout=600)
    record = load_record(sky.home)
    assert record is not None and record.machine is not None
    (host_home,) = (sky.home / "emulated-hosts").glob("*/login-home/.sky-lite")
    assert record.controller_id == (host_home / "controller-id").read_text().strip()
    role = f"sky-lite-controller-{record.machine.machine_id}"
    policy = iam.get_role_policy(RoleName=role, PolicyName="sky-lite-controller")["PolicyDocument"]

    with sqlite3.connect(host_home / "state.db") as db:
        db.execute("UPDATE meta SET value = '*' WHERE key = 'controller_id'")
    again = sky.run(*up, check=False, timeout=600)

    assert again.returncode == 1
    assert ("says its controller id is '*', which is not one a sky-lite store makes (12 lowercase hex digits); "
            "nothing was granted") in again.stderr
    assert iam.get_role_policy(RoleName=role, PolicyName="sky-lite-controller")["PolicyDocument"] == policy
    after = load_record(sky.home)
    assert after is not None and after.controller_id == record.controller_id
    assert "sky-lite_*" not in str(policy) and f"sky-lite_{record.controller_id}_" in str(policy)
