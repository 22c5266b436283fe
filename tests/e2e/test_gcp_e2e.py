"""The GCP story end to end against the fake Compute Engine on 127.0.0.1, with instance emulation: the real
CLI and controller as subprocesses, the real client library (credentials from a service account key whose
token exchange goes to the fake), each instance the fake reports RUNNING booted as a local process.
The version's workdir is staged in the fake's Cloud Storage. Nothing contacts the fake instances' addresses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1")

from tests.e2e.conftest import SkyLite, http_get, wait_until
from tests.providers.gce_fake import FakeCompute, serve_fake_compute, write_service_account_key

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TASK = """\
resources:
  cloud: gcp
  region: us-central1
  zone: us-central1-a
  image_id: {image}
  use_spot: true
workdir: ./app
service:
  readiness_probe:
    path: /message.txt
    initial_delay_seconds: 60
  replicas: {replicas}
run: exec python3 -m http.server $PORT --bind 127.0.0.1
"""


@pytest.fixture
def gce(sky: SkyLite, tmp_path: Path) -> Iterator[FakeCompute]:
    with serve_fake_compute() as (fake, endpoint):
        key = write_service_account_key(tmp_path / "key.json", endpoint)
        sky.env.update(GOOGLE_APPLICATION_CREDENTIALS=str(key), SKY_LITE_GCP_PROJECT="p",
                       SKY_LITE_GCP_ENDPOINT=endpoint, SKY_LITE_EMULATE_INSTANCES="1")
        yield fake


def replicas(sky: SkyLite) -> dict[int, dict[str, Any]]:
    return {r["replica_id"]: r for r in sky.status("web")["services"][0]["replicas"]}


def settled(sky: SkyLite, version: int, count: int) -> bool:
    ready = [r for r in replicas(sky).values() if r["status"] == "READY"]
    return len(ready) == count and {r["version"] for r in ready} == {version}


def images(fake: FakeCompute) -> set[str]:
    return {i["disks"][0]["initializeParams"]["sourceImage"] for i in fake.instances.values()}


def test_up_update_scale_preempt_down_against_the_fake(gce: FakeCompute, sky: SkyLite, tmp_path: Path) -> None:
    task = tmp_path / "web.yaml"
    sky.cwd = tmp_path  # the project's folder: `workdir: ./app` is read from there
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "message.txt").write_text("hello from the workdir\n")
    task.write_text(TASK.format(image="debian-12", replicas=2))
    endpoint = sky.run("serve", "up", str(task), "-n", "web", "--timeout", "120").stdout.rsplit(" ", 1)[1].strip()
    assert http_get(endpoint + "/message.txt") == (200, "hello from the workdir\n")
    # The snapshot went to the service's bucket, as a real VM's startup script would fetch it.
    (bucket,) = gce.buckets
    assert b"hello from the workdir\n" in gce.buckets[bucket].values()
    first = replicas(sky)
    assert {r["cloud"] for r in first.values()} == {"gcp"}
    assert all(r["instance_id"].startswith("us-central1-a/sky-") and r["url"].startswith("http://127.0.0.1:")
               for r in first.values())
    assert gce.calls["instances.bulkInsert"] == 1

    # image_id changes: new VMs; the old ones go once the new ones are READY.
    task.write_text(TASK.format(image="debian-13", replicas=2))
    sky.run("serve", "update", "web", str(task), "-y")
    wait_until(lambda: settled(sky, 2, 2), timeout=90, message="two READY replicas of version 2")
    wait_until(lambda: images(gce) == {"projects/debian-cloud/global/images/family/debian-13"}, timeout=60,
               message="the old VMs deleted")
    second = {rid: r["instance_id"] for rid, r in replicas(sky).items() if r["status"] == "READY"}

    # Scale only (the workdir's contents identical): the same VMs, versions bumped, one bulkInsert for the
    # added replica, and nothing uploaded again.
    before, uploads = gce.calls["instances.bulkInsert"], gce.calls["storage.objects.insert"]
    task.write_text(TASK.format(image="debian-13", replicas=3))
    out = sky.run("serve", "update", "web", str(task), "-y", "--reuse-identical-files").stdout
    assert "reuse 2, replace 0, launch 1, terminate 0" in out
    wait_until(lambda: settled(sky, 3, 3), timeout=90, message="three READY replicas of version 3")
    third = {rid: r["instance_id"] for rid, r in replicas(sky).items() if r["status"] == "READY"}
    assert {rid: third[rid] for rid in second} == second
    assert gce.calls["instances.bulkInsert"] == before + 1
    assert gce.calls["storage.objects.insert"] == uploads  # the same snapshot: its blobs and file list are there

    # A spot preemption (the VM deleted, an operation left in its zone): PREEMPTED, then replaced.
    victim = next(iter(second))
    zone, name = third[victim].split("/")
    gce.preempt(zone, name)
    wait_until(lambda: replicas(sky)[victim]["status"] == "PREEMPTED", timeout=60, message="PREEMPTED")
    wait_until(lambda: settled(sky, 3, 3), timeout=90, message="a replacement for the preempted replica")

    sky.run("serve", "down", "web", "-y")
    assert gce.instances == {} and gce.buckets == {}
    assert sky.processes() == []
