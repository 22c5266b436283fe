"""EC2's eventual consistency against moto, with a backend hook that keeps new instances out of the
tag-filtered DescribeInstances listing (as EC2 does for seconds, sometimes longer) while a lookup by id
may or may not see them. The controller's real pass runs on the AWS provider with fake probes (nothing
contacts an instance address)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.providers.aws import AwsProvider
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaStatus, ServiceStatus
from skyserve_lite.state.store import Store

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")
from moto.core.models import DEFAULT_ACCOUNT_ID  # noqa: E402
from moto.ec2.models import ec2_backends  # noqa: E402
from moto.ec2.models.instances import InstanceBackend  # noqa: E402

REGION = "us-east-1"


class Lag:
    """Which instances the listing hides, and whether lookups by id hide them too."""

    def __init__(self) -> None:
        self.hidden: set[str] = set()
        self.hide_new = True
        self.by_id_too = False


@pytest.fixture
def lag(monkeypatch: pytest.MonkeyPatch) -> Iterator[Lag]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    state = Lag()
    original = InstanceBackend.describe_instances

    def describe(backend: Any, filters: Any = None) -> Any:
        reservations = original(backend, filters)
        if state.hide_new:
            for reservation in reservations:
                state.hidden.update(i.id for i in reservation.instances)
        by_id = bool(filters) and "instance-id" in filters
        if by_id and not state.by_id_too:
            return reservations
        return [r for r in reservations if not any(i.id in state.hidden for i in r.instances)]

    monkeypatch.setattr(InstanceBackend, "describe_instances", describe)
    with moto.mock_aws():
        yield state


def make_reconciler(tmp_path: Path) -> tuple[Reconciler, Store, FakeClock]:
    store = Store.open(tmp_path / "home")
    image = boto3.client("ec2", region_name=REGION).describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    text = (f"resources: {{cloud: aws, region: {REGION}, zone: {REGION}a, image_id: {image}}}\n"
            "service: {replicas: 3, readiness_probe: {path: /, initial_delay_seconds: 600}}\nrun: python3 serve.py\n")
    clock = FakeClock()
    store.create_service("web", SubmittedTask(text, "/t/web.yaml", parse_task(text)), 30001, clock.now())
    aws = AwsProvider(store.controller_id, clock, blobs=BlobStore(tmp_path / "home" / "blobs"),
                      session=boto3.Session(region_name=REGION), sleep=lambda _s: None)
    reconciler = Reconciler(store, {"aws": aws}, FakeProber(), FakeLoadBalancerRunner(), clock,
                            ControllerSettings(drain_seconds=0))
    return reconciler, store, clock


def tick(reconciler: Reconciler, clock: FakeClock, seconds: float = 2.0) -> None:
    clock.advance(seconds)
    reconciler.reconcile_once()


def test_instances_the_listing_lags_on_are_found_by_id_and_served(lag: Lag, tmp_path: Path) -> None:
    reconciler, store, clock = make_reconciler(tmp_path)
    for _ in range(5):
        tick(reconciler, clock)
    assert lag.hidden  # the listing never showed them
    assert [r.status for r in store.list_replicas("web")] == [ReplicaStatus.READY] * 3
    assert store.get_service("web").status is ServiceStatus.READY
    store.close()


def test_instances_nobody_lists_yet_are_waited_for_not_failed(lag: Lag, tmp_path: Path) -> None:
    lag.by_id_too = True
    reconciler, store, clock = make_reconciler(tmp_path)
    for _ in range(30):  # a minute of passes with three launches invisible to every lookup
        tick(reconciler, clock)
    rows = store.list_replicas("web")
    assert [r.status for r in rows] == [ReplicaStatus.PROVISIONING] * 3  # not FAILED, not relaunched
    assert store.get_service("web").status is not ServiceStatus.FAILED
    backend = ec2_backends[DEFAULT_ACCOUNT_ID][REGION]  # the truth, past the hook
    states = [i.state for r in backend.all_reservations() for i in r.instances]
    assert states == ["running"] * 3  # nothing terminated or launched twice
    lag.hide_new = False
    lag.hidden.clear()  # EC2 caught up
    tick(reconciler, clock)
    assert [r.status for r in store.list_replicas("web")] == [ReplicaStatus.READY] * 3
    store.close()
