"""``spot_placer: dynamic_fallback`` in the controller, on the fake cloud: spot replicas spread over the
zones their placement allows, and the replacement of a preempted one goes to another zone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from skyserve_lite.api import bind_submission
from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.providers.base import InstanceState
from skyserve_lite.providers.fake import FakeProvider
from skyserve_lite.spec.parse import read_task
from skyserve_lite.state.models import ReplicaStatus
from skyserve_lite.state.secrets import SecretStore
from skyserve_lite.state.store import Store

TASK = """\
resources:
  infra: aws/us-east-1
  cpus: 2+
  use_spot: true
service:
  replica_policy:
    min_replicas: 3
{placer}run: python serve.py
"""


def start(tmp_path: Path, placer: str) -> tuple[Store, Reconciler, FakeProvider, FakeClock]:
    home = tmp_path / "home"
    store = Store.open(home)
    # Any full type puts the fake on the batching path, which tries each placement's zones in order.
    aws = FakeProvider(name="aws", full_types={"no-such-type"})
    clock = FakeClock()
    reconciler = Reconciler(store, {"aws": aws, "local": FakeProvider(name="local")}, FakeProber(),
                            FakeLoadBalancerRunner(), clock, ControllerSettings())
    task, inputs = bind_submission(read_task(TASK.format(placer=placer), "/t/spot.yaml"), None, SecretStore(home),
                                   keep_secrets=True)
    store.create_service("spot", task, 30001, 0.0, inputs=inputs)
    clock.advance(1)
    reconciler.reconcile_once()
    return store, reconciler, aws, clock


def zones(store: Store) -> Counter[str | None]:
    return Counter(r.zone for r in store.list_replicas("spot") if r.status.is_live)


def test_spot_replicas_spread_over_zones_and_leave_a_zone_that_preempted(tmp_path: Path) -> None:
    store, reconciler, aws, clock = start(tmp_path, "    spot_placer: dynamic_fallback\n")
    assert zones(store) == Counter({"us-east-1a": 1, "us-east-1b": 1, "us-east-1c": 1})

    victim = next(r for r in store.list_replicas("spot") if r.zone == "us-east-1b")
    aws.set_state(victim.instance_id or "", InstanceState.PREEMPTED)
    for _ in range(2):
        clock.advance(1)
        reconciler.reconcile_once()
    rows = {r.replica_id: r for r in store.list_replicas("spot")}
    assert rows[victim.replica_id].status is ReplicaStatus.PREEMPTED
    # The replacement goes to a zone no replica holds (d), not back to b, which is preemptive for an hour.
    assert zones(store) == Counter({"us-east-1a": 1, "us-east-1c": 1, "us-east-1d": 1})
    store.close()


def test_without_a_placer_spot_replicas_fill_the_first_zone(tmp_path: Path) -> None:
    store, _, _, _ = start(tmp_path, "")
    assert zones(store) == Counter({"us-east-1a": 3})
    store.close()
