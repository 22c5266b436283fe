"""The GCP provider against the fake Compute Engine on 127.0.0.1 (``gce_fake``): the real client library,
anonymous credentials, an ``api_endpoint`` over http. Batching, labels, names, pagination, statuses,
zone fallback, error translation, and launches re-sent after a crash."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("google.cloud.compute_v1")

from google.auth.credentials import AnonymousCredentials

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.errors import PermanentProviderError, TransientProviderError
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.providers.base import InstanceState, LaunchRequest
from skyserve_lite.providers.cloud import plan_launch_groups
from skyserve_lite.providers.gcp import (
    GCP_BOOT,
    LABEL_CONTROLLER,
    GcpProvider,
    compute_state,
    instance_name,
    parse_replica_id,
)
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.spec.placement import Placement, Resolution
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus
from skyserve_lite.state.store import Store
from tests.providers.gce_fake import FakeCompute, serve_fake_compute

TASK = """\
resources:
  cloud: gcp
  region: us-central1
  {zone}
  instance_type: e2-small
  use_spot: {spot}
service:
  readiness_probe: /
  replicas: 2
  ports: 8000
run: python3 -m http.server 8000
"""


NO_BLOBS = BlobStore(Path("/nonexistent/blobs"))  # tasks without files never read it


def spec(zone: str | None = "us-central1-a", spot: bool = False) -> SubmittedTask:
    text = TASK.format(zone=f"zone: {zone}" if zone else "", spot=str(spot).lower())
    return SubmittedTask(text, "/t.yaml", parse_task(text))


def request(replica_id: int, task: SubmittedTask | None = None, token: str = "a" * 32, version: int = 1,
            spot: bool = False) -> LaunchRequest:
    task = task or spec(spot=spot)
    return LaunchRequest(service="web", replica_id=replica_id, version=version, spec=task.spec,
                         launch_token=token, is_spot=spot)


def anonymous() -> object:
    return AnonymousCredentials()  # type: ignore[no-untyped-call]


@pytest.fixture
def fake() -> Iterator[tuple[FakeCompute, str]]:
    with serve_fake_compute() as served:
        yield served


def provider_for(endpoint: str, page_size: int = 500, blobs: BlobStore = NO_BLOBS) -> GcpProvider:
    return GcpProvider("c0ffee123456", FakeClock(), blobs=blobs, project="p", credentials=anonymous(),
                       api_endpoint=endpoint, sleep=lambda _s: None, page_size=page_size)


@pytest.fixture
def gcp(fake: tuple[FakeCompute, str]) -> GcpProvider:
    return provider_for(fake[1])


def test_scaling_up_by_k_in_one_zone_is_one_bulk_insert(gcp: GcpProvider, fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    outcomes = gcp.launch([request(i) for i in (3, 4, 5)])
    assert [o.instance.replica_id for o in outcomes if o.instance] == [3, 4, 5]
    assert compute.calls["instances.bulkInsert"] == 1
    ((_method, body),) = [r for r in compute.requests if r[0] == "instances.bulkInsert"]
    assert int(body["count"]) == 3 and sorted(body["perInstanceProperties"]) == sorted(
        o.instance.instance_id.split("/")[1] for o in outcomes if o.instance)
    labels = body["instanceProperties"]["labels"]
    assert labels[LABEL_CONTROLLER] == "c0ffee123456" and labels["sky-lite-service"] == "web"
    assert labels["sky-lite-version"] == "1" and labels["sky-lite-port"] == "8000"
    metadata = {i["key"]: i["value"] for i in body["instanceProperties"]["metadata"]["items"]}
    assert "replica_ids=3,4,5" in metadata["startup-script"]
    assert "computeMetadata/v1/instance/name" in metadata["startup-script"]
    assert body["instanceProperties"]["machineType"] == "e2-small"
    assert "scheduling" not in body["instanceProperties"]


def test_spot_is_the_spot_provisioning_model_deleted_on_preemption(gcp: GcpProvider,
                                                                    fake: tuple[FakeCompute, str]) -> None:
    gcp.launch([request(1, spot=True)])
    ((_, body),) = [r for r in fake[0].requests if r[0] == "instances.bulkInsert"]
    assert body["instanceProperties"]["scheduling"] == {"provisioningModel": "SPOT",
                                                        "instanceTerminationAction": "DELETE"}
    (instance,) = gcp.list_instances()
    assert instance.is_spot


def test_the_inventory_is_the_aggregated_list_pages_only(fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    gcp = provider_for(endpoint, page_size=50)
    gcp.launch([request(i, spec("us-central1-a")) for i in range(1, 61)]
               + [request(i, spec("us-central1-b"), token="b" * 32) for i in range(61, 121)])
    compute.calls.clear()
    listed = gcp.list_instances()
    assert sorted(i.replica_id for i in listed) == list(range(1, 121))
    assert dict(compute.calls) == {"instances.aggregatedList": 3}  # 120 instances, 50 a page
    assert {i.zone for i in listed} == {"us-central1-a", "us-central1-b"}
    assert all(i.url and i.url.endswith(":8000") and i.state is InstanceState.RUNNING for i in listed)


def test_only_this_controllers_instances_are_listed(fake: tuple[FakeCompute, str]) -> None:
    _compute, endpoint = fake
    provider_for(endpoint).launch([request(1)])
    other = GcpProvider("0ther0000000", FakeClock(), blobs=NO_BLOBS, project="p", credentials=anonymous(),
                        api_endpoint=endpoint)
    assert other.list_instances() == []


def test_a_launch_sent_again_adopts_what_the_first_started(gcp: GcpProvider, fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    first = gcp.launch([request(1), request(2)])
    again = gcp.launch([request(1), request(2)])  # the controller crashed before recording the outcome
    assert [o.instance.instance_id for o in again if o.instance] == [o.instance.instance_id for o in first
                                                                     if o.instance]
    assert compute.calls["instances.bulkInsert"] == 1 and len(compute.instances) == 2


def test_a_bulk_insert_sent_twice_creates_nothing_twice(gcp: GcpProvider, fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    compute.lag |= set()  # listings show everything: the adoption lookup is what a lag would defeat
    gcp.launch([request(1)])
    compute.lag |= {name for _zone, name in compute.instances}  # the first attempt's instance is not listed yet
    gcp.launch([request(1)])
    assert compute.calls["instances.bulkInsert"] == 2 and len(compute.instances) == 1  # idempotent by name


def test_a_zone_without_capacity_moves_to_the_next_and_says_so(fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    compute.stockout.add("us-central1-a")
    (outcome,) = provider_for(endpoint).launch([request(1, spec(zone=None))])
    assert outcome.instance is not None and outcome.instance.zone == "us-central1-b"
    assert outcome.instance.detail == "launched in us-central1-b; no capacity in us-central1-a: " \
                                      "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert compute.calls["zones.list"] == 1


def test_no_capacity_anywhere_is_a_transient_outcome(fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    compute.stockout |= {"us-central1-a", "us-central1-b"}
    compute.quota.add("us-central1-c")
    (outcome,) = provider_for(endpoint).launch([request(1, spec(zone=None), spot=True)])
    assert outcome.instance is None and not outcome.permanent
    assert outcome.error is not None and outcome.error.startswith("no spot capacity for e2-small in us-central1")
    assert "us-central1-c: QUOTA_EXCEEDED" in outcome.error


@pytest.mark.parametrize(("status", "reason", "permanent", "message"), [
    (403, "forbidden", True, "roles/compute.instanceAdmin.v1"),
    (400, "invalid", True, "bulk_insert"),
    (404, "notFound", True, "check the project"),
])
def test_api_errors_are_translated_once(fake: tuple[FakeCompute, str], status: int, reason: str, permanent: bool,
                                        message: str) -> None:
    compute, endpoint = fake
    compute.fail("instances.bulkInsert", status, reason)
    (outcome,) = provider_for(endpoint).launch([request(1)])
    assert outcome.permanent is permanent and outcome.error is not None and message in outcome.error


def test_a_busy_api_is_retried_then_transient(fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    compute.fail("instances.aggregatedList", 429, "rateLimitExceeded", times=2)
    assert provider_for(endpoint).list_instances() == []  # two 429s, then an answer
    compute.fail("instances.aggregatedList", 503, "backendError", times=10)
    with pytest.raises(TransientProviderError, match="busy"):
        provider_for(endpoint).list_instances()


def test_terminate_deletes_and_a_gone_instance_is_fine(gcp: GcpProvider, fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    ids = [o.instance.instance_id for o in gcp.launch([request(1), request(2)]) if o.instance]
    gcp.terminate([*ids, "us-central1-a/sky-c0ffee123456-00000000-r9"])
    assert compute.instances == {} and compute.calls["instances.delete"] == 3
    assert gcp.find_instances(ids) == []


def test_find_instances_reads_each_by_id(gcp: GcpProvider, fake: tuple[FakeCompute, str]) -> None:
    (outcome,) = gcp.launch([request(7)])
    assert outcome.instance is not None
    (found,) = gcp.find_instances([outcome.instance.instance_id])
    assert (found.replica_id, found.service, found.version, found.state) == (7, "web", 1, InstanceState.RUNNING)


def test_a_firewall_rule_per_controller_and_port_made_once(fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    provider_for(endpoint).launch([request(1)])
    provider_for(endpoint).launch([request(2, token="b" * 32)])  # a new provider finds the rule by name
    (rule,) = compute.firewalls.values()
    assert rule["targetTags"] == ["sky-lite-c0ffee123456"] and rule["allowed"][0]["ports"] == ["8000"]
    assert compute.calls["firewalls.insert"] == 1


def test_the_serial_console_is_the_replica_log(gcp: GcpProvider) -> None:
    (outcome,) = gcp.launch([request(1)])
    assert outcome.instance is not None
    log = gcp.read_log("web", 1, outcome.instance.instance_id, "us-central1")
    assert log is not None and log.text is not None and "serial console" in log.text


def test_missing_credentials_name_what_to_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    provider = GcpProvider("c0ffee123456", FakeClock(), blobs=NO_BLOBS, project="p", api_endpoint="http://127.0.0.1:9")
    with pytest.raises(PermanentProviderError, match="GOOGLE_APPLICATION_CREDENTIALS"):
        provider.list_instances()


@pytest.mark.parametrize(("raw", "state"), [
    ({"status": "PROVISIONING"}, InstanceState.PENDING),
    ({"status": "STAGING"}, InstanceState.PENDING),
    ({"status": "RUNNING"}, InstanceState.RUNNING),
    ({"status": "STOPPING"}, InstanceState.EXITED),
    ({"status": "TERMINATED"}, InstanceState.EXITED),
    ({"status": "SUSPENDED"}, InstanceState.EXITED),
    ({"status": "TERMINATED", "scheduling": {"provisioningModel": "SPOT"}}, InstanceState.PREEMPTED),
])
def test_statuses(raw: dict[str, object], state: InstanceState) -> None:
    assert compute_state(raw)[0] is state


def test_names_carry_the_replica_id_and_fit_gce_rules() -> None:
    (group,) = plan_launch_groups([request(123456)], None)
    name = instance_name("C0FFEE123456", group, 123456)
    assert parse_replica_id(name) == 123456 and len(name) <= 63 and name == name.lower()
    assert parse_replica_id("someone-elses-vm") is None


def test_the_startup_script_finds_its_replica_id_from_its_name(tmp_path: Path) -> None:
    import subprocess

    stub = tmp_path / "curl"
    stub.write_text("#!/bin/sh\necho sky-c0ffee123456-0a1b2c3d-r42\n")
    stub.chmod(0o755)
    script = "\n".join(["set -eu", "replica_ids=41,42,43", *GCP_BOOT.find_replica_id, 'echo "$replica_id"'])
    out = subprocess.run(["bash", "-c", script], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "42"
    script = script.replace("41,42,43", "1,2")  # a name whose id is not in the batch gives none
    assert subprocess.run(["bash", "-c", script], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True,
                          text=True, check=True).stdout.strip() == ""


@pytest.mark.parametrize(("extra", "field", "message"), [
    ("file_mounts:\n  /data: s3://bucket/data\n", "file_mounts./data", "local paths and gs:// sources only"),
    ("file_mounts:\n  /data: https://example.com/x\n", "file_mounts./data", "local paths and gs:// sources only"),
])
def test_a_gcp_task_with_what_gcp_cannot_ship_is_refused_naming_the_field(extra: str, field: str,
                                                                           message: str) -> None:
    from skyserve_lite.errors import SpecError
    from skyserve_lite.providers import check_task_for_cloud

    text = TASK.format(zone="", spot="false") + extra
    with pytest.raises(SpecError, match=message) as caught:
        check_task_for_cloud(SubmittedTask(text, "/t.yaml", parse_task(text)))
    assert caught.value.path == field


def test_gs_sources_are_fetched_by_the_startup_script(gcp: GcpProvider, fake: tuple[FakeCompute, str]) -> None:
    text = TASK.format(zone="zone: us-central1-a", spot="false") + "file_mounts:\n  /data: gs://bucket/data\n"
    task = SubmittedTask(text, "/t.yaml", parse_task(text))
    gcp.launch([request(1, task)])
    ((_, body),) = [r for r in fake[0].requests if r[0] == "instances.bulkInsert"]
    script = {i["key"]: i["value"] for i in body["instanceProperties"]["metadata"]["items"]}["startup-script"]
    assert "fetch gs://bucket/data /data" in script and "gcloud storage cp" in script


def test_force_down_notes_a_cloud_without_credentials_instead_of_failing(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from skyserve_lite.forcedown import force_down

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    home = tmp_path / "home"
    home.mkdir()
    (home / "controller-id").write_text("c0ffee123456\n")
    provider = GcpProvider("c0ffee123456", FakeClock(), blobs=NO_BLOBS, project="p", api_endpoint="http://127.0.0.1:9")
    report = force_down(home, clouds=lambda _id: {"gcp": provider})
    assert report.errors == ()
    assert any(note.startswith("gcp: not searched: it has no credentials here") for note in report.notes)


def test_a_spot_vm_deleted_by_preemption_is_found_preempted(gcp: GcpProvider, fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    spot = [o.instance for o in gcp.launch([request(1, spot=True), request(2, spot=True)]) if o.instance]
    zone, name = spot[0].instance_id.split("/")
    compute.preempt(zone, name)
    assert [i.replica_id for i in gcp.list_instances()] == [2]  # the listing no longer has it
    compute.calls.clear()
    (found,) = gcp.find_instances([spot[0].instance_id, "us-central1-a/sky-c0ffee123456-00000000-r9"])
    assert (found.instance_id, found.state, found.replica_id) == (spot[0].instance_id, InstanceState.PREEMPTED, 1)
    assert found.detail == "spot instance preempted at 2026-12-01T12:30:00.000-08:00"
    # One operations read for the zone where something was missing; none when nothing is.
    assert compute.calls["zoneOperations.list"] == 1
    compute.calls.clear()
    gcp.find_instances([spot[1].instance_id])
    assert compute.calls["zoneOperations.list"] == 0


def test_a_failed_delete_is_raised_after_every_other_delete_was_sent(gcp: GcpProvider,
                                                                     fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    ids = [o.instance.instance_id for o in gcp.launch([request(i) for i in (1, 2, 3)]) if o.instance]
    compute.fail("instances.delete", 403, "forbidden")
    with pytest.raises(PermanentProviderError, match=r"roles/compute\.instanceAdmin\.v1"):
        gcp.terminate(ids)
    assert compute.calls["instances.delete"] == 3 and len(compute.instances) == 1


# --- crash recovery through the controller ------------------------------------------------------------------
def _controller(tmp_path: Path, gcp: GcpProvider) -> tuple[Store, Reconciler]:
    store = Store.open(tmp_path / "home")
    store.create_service("web", spec(), 30001, 0.0)
    reconciler = Reconciler(store, {"gcp": gcp}, FakeProber(), FakeLoadBalancerRunner(), FakeClock(),
                            ControllerSettings())
    return store, reconciler


def _intent(store: Store) -> list[ReplicaRecord]:
    """What the executor writes before it calls bulkInsert: PROVISIONING rows with the batch's token."""
    template = ReplicaRecord(service="web", replica_id=0, version=1, status=ReplicaStatus.PROVISIONING, cloud="gcp",
                             launched_at=FakeClock().now(), status_since=FakeClock().now(), launch_token="tok-crash")
    return list(store.add_replicas("web", 2, template))


def test_crash_between_intent_and_bulk_insert_launches_once(tmp_path: Path, gcp: GcpProvider,
                                                             fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    store, reconciler = _controller(tmp_path, gcp)
    rows = _intent(store)  # ... and the controller died before bulkInsert
    reconciler.reconcile_once()
    reconciler.reconcile_once()
    assert compute.calls["instances.bulkInsert"] == 1 and len(compute.instances) == 2
    adopted = {r.replica_id: r.instance_id for r in store.list_replicas("web")}
    assert sorted(adopted) == [r.replica_id for r in rows] and all(adopted.values())
    assert compute.calls["instances.delete"] == 0


def test_crash_between_bulk_insert_and_recording_adopts_without_launching_again(
        tmp_path: Path, gcp: GcpProvider, fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    store, reconciler = _controller(tmp_path, gcp)
    rows = _intent(store)
    version = store.get_version("web", 1)
    outcomes = gcp.launch([LaunchRequest("web", r.replica_id, 1, version.spec, r.launch_token, False) for r in rows])
    launched = {o.replica_id: o.instance.instance_id for o in outcomes if o.instance}
    # ... and the controller died before writing the instance ids.
    reconciler.reconcile_once()
    assert compute.calls["instances.bulkInsert"] == 1
    assert {r.replica_id: r.instance_id for r in store.list_replicas("web")} == launched
    assert compute.calls["instances.delete"] == 0


# --- files: the snapshot staged in Cloud Storage --------------------------------------------------------------
def _with_files(tmp_path: Path, blobs: BlobStore, files: dict[str, bytes]) -> SubmittedTask:
    import dataclasses

    from skyserve_lite.files.capture import capture_task_files

    app = tmp_path / "app"
    for name, data in files.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).write_bytes(data)
    text = TASK.format(zone="zone: us-central1-a", spot="false") + "workdir: ./app\n"
    task = SubmittedTask(text, str(tmp_path / "t.yaml"), parse_task(text))
    captured = capture_task_files(task.spec, tmp_path, task.source, blobs)
    return dataclasses.replace(task, spec=dataclasses.replace(task.spec, files=captured))


def test_a_workdir_is_staged_once_per_digest_and_applied_by_the_startup_script(
        tmp_path: Path, fake: tuple[FakeCompute, str]) -> None:
    import hashlib

    compute, endpoint = fake
    blobs = BlobStore(tmp_path / "blobs")
    gcp = provider_for(endpoint, blobs=blobs)
    big = b"x" * (9 << 20)  # over the library's 8 MB multipart limit: a resumable upload
    first = _with_files(tmp_path, blobs, {"app.py": b"print(1)\n", "lib/util.py": b"X = 1\n", "model.bin": big})
    gcp.launch([request(1, first)])
    (bucket,) = compute.buckets
    stored = compute.buckets[bucket]
    assert stored["blobs/" + hashlib.sha256(big).hexdigest()] == big
    assert {k for k in stored if k.startswith("blobs/")} == {"blobs/" + hashlib.sha256(d).hexdigest()
                                                            for d in (b"print(1)\n", b"X = 1\n", big)}
    assert first.spec.files is not None
    file_list = stored[f"files/{first.spec.files.digest}.tsv"].decode()
    assert "/opt/sky-lite/workdir/lib/util.py" in file_list
    ((_, body),) = [r for r in compute.requests if r[0] == "instances.bulkInsert"]
    script = {i["key"]: i["value"] for i in body["instanceProperties"]["metadata"]["items"]}["startup-script"]
    assert f"cloud_copy gs://{bucket}/files/{first.spec.files.digest}.tsv" in script
    assert f"apply_files /opt/sky-lite/files.tsv gs://{bucket}/blobs/" in script
    assert "devstorage.read_only" in str(body["instanceProperties"]["serviceAccounts"])

    # A new version that changes one file uploads that file (and its file list) only.
    uploads = compute.calls["storage.objects.insert"]
    second = _with_files(tmp_path, blobs, {"app.py": b"print(2)\n"})
    gcp.launch([request(2, second, token="b" * 32, version=2)])
    assert compute.calls["storage.objects.insert"] == uploads + 2
    # A provider that starts afresh (a restarted controller) learns what is there with one listing.
    again = provider_for(endpoint, blobs=blobs)
    compute.calls.clear()
    again.launch([request(3, first, token="c" * 32)])
    assert compute.calls["storage.objects.list"] == 1 and compute.calls["storage.objects.insert"] == 1

    gcp.release_service("web")
    assert compute.buckets == {}
    gcp.release_service("web")  # idempotent


def test_a_blob_missing_from_the_state_directory_fails_the_launch_naming_the_field(
        tmp_path: Path, fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    blobs = BlobStore(tmp_path / "blobs")
    gcp = provider_for(endpoint, blobs=blobs)
    task = _with_files(tmp_path, blobs, {"app.py": b"print(1)\n"})
    import shutil

    shutil.rmtree(blobs.root)
    (outcome,) = gcp.launch([request(1, task)])
    assert outcome.permanent and outcome.error is not None
    assert outcome.error.startswith("workdir: app.py: its content") and "serve update" in outcome.error
    assert compute.calls["instances.bulkInsert"] == 0


# --- placements: candidates, attached GPUs, disk types ---------------------------------------------------------------
def placed_request(replica_id: int, *placements: Placement) -> LaunchRequest:
    task = spec(zone=None)
    resolved = dataclasses.replace(task.spec, resolution=Resolution(ondemand=placements))
    return LaunchRequest(service="web", replica_id=replica_id, version=1, spec=resolved, launch_token="a" * 32,
                         is_spot=False)


def test_an_n1_with_attached_gpus_asks_for_them_and_terminates_on_maintenance(gcp: GcpProvider,
                                                                              fake: tuple[FakeCompute, str]) -> None:
    t4 = Placement(cloud="gcp", region="us-central1", zones=("us-central1-a",), instance_type="n1-standard-4",
                   accelerator="T4:1", accelerator_type="nvidia-tesla-t4", image="projects/x/global/images/family/y",
                   disk_size=100, disk_type="pd-ssd")
    (outcome,) = gcp.launch([placed_request(1, t4)])
    assert outcome.instance is not None
    ((_, body),) = [r for r in fake[0].requests if r[0] == "instances.bulkInsert"]
    properties = body["instanceProperties"]
    assert properties["machineType"] == "n1-standard-4"
    assert properties["guestAccelerators"] == [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}]
    assert properties["scheduling"] == {"onHostMaintenance": "TERMINATE"}
    params = properties["disks"][0]["initializeParams"]
    assert params["diskType"] == "pd-ssd" and params["diskSizeGb"] == "100"
    assert params["sourceImage"] == "projects/x/global/images/family/y"


def test_a_stocked_out_candidate_falls_back_to_the_next_in_another_zone(fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    compute.stockout |= {"us-central1-a", "us-central1-b"}
    first = Placement(cloud="gcp", region="us-central1", zones=("us-central1-a", "us-central1-b"),
                      instance_type="g2-standard-4", accelerator="L4:1", need="L4:1")
    second = Placement(cloud="gcp", candidate=1, region="us-central1", zones=("us-central1-c",),
                       instance_type="n1-standard-4", accelerator="T4:1", accelerator_type="nvidia-tesla-t4",
                       need="T4:1")
    (outcome,) = provider_for(endpoint).launch([placed_request(1, first, second)])
    assert outcome.instance is not None and outcome.instance.zone == "us-central1-c"
    assert outcome.instance.detail is not None
    assert outcome.instance.detail.startswith("landed on candidate 2: T4:1 -> n1-standard-4 + T4:1")
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in outcome.instance.detail
    machine_types = [body["instanceProperties"]["machineType"] for method, body in compute.requests
                     if method == "instances.bulkInsert"]
    assert machine_types == ["g2-standard-4", "g2-standard-4", "n1-standard-4"]
