"""The AWS story end to end against moto's server on 127.0.0.1, with instance emulation: the real CLI and
controller as subprocesses, EC2 through boto3, each instance moto reports running booted as a local
process. Nothing contacts moto's private instance addresses."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skyserve_lite.procs import find_free_port

from .conftest import SkyLite, http_get, wait_until

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
               "AWS_DEFAULT_REGION": REGION}

TASK = """\
resources:
  cloud: aws
  region: us-east-1
  zone: us-east-1a
  image_id: {image}
  use_spot: true
service:
  readiness_probe:
    path: /
    initial_delay_seconds: 60
  replicas: {replicas}
run: exec python3 -m http.server $PORT --bind 127.0.0.1
"""


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    port = find_free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(key, value)
    try:
        yield endpoint
    finally:
        server.stop()


def ec2() -> Any:
    return boto3.client("ec2", region_name=REGION)


def instances(state: str | None = None) -> dict[str, dict[str, Any]]:
    found = {}
    for reservation in ec2().describe_instances()["Reservations"]:
        for instance in reservation["Instances"]:
            if state is None or instance["State"]["Name"] == state:
                found[instance["InstanceId"]] = instance
    return found


def reservations() -> int:
    return len(ec2().describe_instances()["Reservations"])


def replicas(sky: SkyLite) -> dict[int, dict[str, Any]]:
    return {r["replica_id"]: r for r in sky.status("web")["services"][0]["replicas"]}


def settled(sky: SkyLite, version: int, count: int) -> bool:
    rows = [r for r in replicas(sky).values() if r["status"] not in ("PREEMPTED", "FAILED")]
    return len(rows) == count and all(r["version"] == version and r["status"] == "READY" for r in rows)


def test_up_update_scale_preempt_down_against_moto(moto: str, sky: SkyLite, tmp_path: Path) -> None:
    sky.env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")},
                   SKY_LITE_EMULATE_INSTANCES="1")
    images = [image["ImageId"] for image in ec2().describe_images(Owners=["amazon"])["Images"][:2]]
    task = tmp_path / "web.yaml"

    # up -> READY -> a request through the load balancer reaches an emulated instance.
    task.write_text(TASK.format(image=images[0], replicas=2))
    endpoint = sky.run("serve", "up", str(task), "-n", "web", "--timeout", "120").stdout.rsplit(" ", 1)[1].strip()
    assert http_get(endpoint + "/")[0] == 200
    first = replicas(sky)
    assert {r["cloud"] for r in first.values()} == {"aws"}
    assert all(r["instance_id"].startswith("i-") and r["url"].startswith("http://127.0.0.1:") for r in first.values())
    assert {i["ImageId"] for i in instances("running").values()} == {images[0]}
    # The replica's output (here: the emulated instance's process) through `serve logs`.
    assert '"GET / HTTP/1.1" 200' in sky.run("serve", "logs", "web", str(min(first)), "--no-follow").stdout

    # image_id changes: every replica is replaced by instances of the new AMI; the old ones are drained after.
    task.write_text(TASK.format(image=images[1], replicas=2))
    out = sky.run("serve", "update", "web", str(task), "-y").stdout
    assert f"resources.image_id: {images[0]} -> {images[1]}" in out
    wait_until(lambda: settled(sky, 2, 2), timeout=90, message="two READY replicas of version 2")
    wait_until(lambda: {i["ImageId"] for i in instances("running").values()} == {images[1]}, timeout=60,
               message="old instances terminated")
    second = {r["replica_id"]: r["instance_id"] for r in replicas(sky).values() if r["status"] == "READY"}
    assert not set(second.values()) & {r["instance_id"] for r in first.values()}

    # Scale only: the same instances, versions bumped, and exactly one RunInstances for the added replica.
    before = reservations()
    task.write_text(TASK.format(image=images[1], replicas=3))
    assert "reuse 2, replace 0, launch 1, terminate 0" in sky.run("serve", "update", "web", str(task), "-y").stdout
    wait_until(lambda: settled(sky, 3, 3), timeout=90, message="three READY replicas of version 3")
    third = {r["replica_id"]: r["instance_id"] for r in replicas(sky).values() if r["status"] == "READY"}
    assert {rid: third[rid] for rid in second} == second
    assert reservations() == before + 1
    assert len(instances("running")) == 3

    # A spot interruption: the replica becomes PREEMPTED and is replaced.
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    victim_id = next(iter(second))
    victim = ec2_backends[DEFAULT_ACCOUNT_ID][REGION].get_instance(third[victim_id])
    victim.terminate()
    victim.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance termination",
                                      "Server.SpotInstanceTermination")
    wait_until(lambda: replicas(sky)[victim_id]["status"] == "PREEMPTED", timeout=60, message="PREEMPTED")
    wait_until(lambda: settled(sky, 3, 3), timeout=90, message="a replacement for the preempted replica")
    assert len(instances("running")) == 3

    # down: no instance left running, no process left behind.
    sky.run("serve", "down", "web", "-y")
    assert instances("running") == {}
    assert sky.processes() == []


FILES_TASK = """\
resources:
  cloud: aws
  region: us-east-1
  zone: us-east-1a
  image_id: {image}
workdir: ./app
service:
  readiness_probe:
    path: /message.txt
    initial_delay_seconds: 60
  replicas: 2
run: exec python3 -m http.server $PORT --bind 127.0.0.1
"""


def bucket_keys(prefix: str) -> set[str]:
    s3 = boto3.client("s3", region_name=REGION)
    keys: set[str] = set()
    for bucket in s3.list_buckets()["Buckets"]:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket["Name"], Prefix=prefix):
            keys |= {item["Key"] for item in page.get("Contents", [])}
    return keys


def test_aws_replicas_run_their_versions_snapshot_against_moto(moto: str, sky: SkyLite, tmp_path: Path) -> None:
    """The workdir snapshot story on AWS with emulated instances: blobs go to the service's bucket once per
    digest, a replacement runs the submitted files (not the edited disk), a rollback runs the old ones."""
    boto3.client("iam", region_name=REGION).create_instance_profile(InstanceProfileName="sky-lite-replica")
    sky.env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")},
                   SKY_LITE_EMULATE_INSTANCES="1", SKY_LITE_AWS_INSTANCE_PROFILE="sky-lite-replica")
    image = ec2().describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    sky.cwd = tmp_path  # the project's folder: `workdir: ./app` is read from there
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "message.txt").write_text("version one")
    (tmp_path / "app" / "static.txt").write_text("never changes")
    task = tmp_path / "web.yaml"
    task.write_text(FILES_TASK.format(image=image))
    endpoint = sky.run("serve", "up", str(task), "-n", "web", "--timeout", "120").stdout.rsplit(" ", 1)[1].strip()
    assert http_get(endpoint + "/message.txt")[1] == "version one"
    blobs_v1 = bucket_keys("blobs/")
    assert len(blobs_v1) == 2

    (tmp_path / "app" / "message.txt").write_text("version two")
    assert "workdir: contents changed (1 file: message.txt)" in sky.run("serve", "update", "web", str(task),
                                                                          "-y").stdout
    wait_until(lambda: settled(sky, 2, 2), timeout=90, message="two READY replicas of version 2")
    assert {http_get(endpoint + "/message.txt")[1] for _ in range(6)} == {"version two"}
    assert len(bucket_keys("blobs/") - blobs_v1) == 1  # only the changed file's blob was uploaded

    # Edited on disk, never submitted; a replica's instance is lost: its replacement runs version 2's files.
    (tmp_path / "app" / "message.txt").write_text("never submitted")
    victim = min(r["replica_id"] for r in replicas(sky).values() if r["status"] == "READY")
    ec2().terminate_instances(InstanceIds=[replicas(sky)[victim]["instance_id"]])
    wait_until(lambda: replicas(sky)[victim]["status"] == "FAILED" and settled(sky, 2, 2), timeout=90,
               message="a replacement replica READY")
    assert {http_get(endpoint + "/message.txt")[1] for _ in range(6)} == {"version two"}

    sky.run("serve", "rollback", "web", "--to", "1", "-y")
    wait_until(lambda: settled(sky, 3, 2), timeout=90, message="the rollback READY")
    assert {http_get(endpoint + "/message.txt")[1] for _ in range(6)} == {"version one"}

    sky.run("serve", "down", "web", "-y")
    assert instances("running") == {}
    assert not (sky.home / "blobs").exists()
