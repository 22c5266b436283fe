"""The controller with resource candidates, on the fake cloud: a replica lands on the first candidate with
capacity and the fallback is an event; an update that keeps the candidate set reuses replicas whatever
they landed on; one that changes it replaces them, naming the field."""

from __future__ import annotations

from pathlib import Path

from skyserve_lite.api import bind_submission
from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.providers.fake import FakeProvider
from skyserve_lite.spec.config import find_config_changes
from skyserve_lite.spec.parse import read_task
from skyserve_lite.state.secrets import SecretStore
from skyserve_lite.state.store import Store

TASK = """\
resources:
  cloud: aws
  accelerators: {{L4: 1, A10G: 1}}
service:
  readiness_probe: /health
  replicas: {replicas}
run: vllm serve --port 8000
"""


def submit(store: Store, home: Path, text: str, previous: bool = False) -> None:
    task, inputs = bind_submission(read_task(text, "/tasks/gpu.yaml"),
                                   store.get_version("gpu", store.get_service("gpu").current_version)
                                   if previous else None, SecretStore(home), keep_secrets=True)
    if previous:
        store.add_version("gpu", task, "rolling", 0.0, inputs=inputs)
    else:
        store.create_service("gpu", task, 30001, 0.0, inputs=inputs)


def test_replicas_fall_back_to_the_next_candidate_and_updates_reuse_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = Store.open(home)
    aws = FakeProvider(name="aws", full_types={"g6.xlarge"})  # no L4 capacity anywhere
    clock = FakeClock()
    reconciler = Reconciler(store, {"aws": aws, "local": FakeProvider(name="local")}, FakeProber(),
                            FakeLoadBalancerRunner(), clock, ControllerSettings())
    submit(store, home, TASK.format(replicas=2))
    version = store.get_version("gpu", 1)
    assert version.spec.resolution is not None
    assert [p.instance_type for p in version.spec.resolution.ondemand] == ["g6.xlarge", "g5.xlarge"]

    clock.advance(1)
    reconciler.reconcile_once()
    replicas = store.list_replicas("gpu")
    assert len(replicas) == 2 and all(r.instance_id for r in replicas)
    assert {(r.instance_type, r.accelerator) for r in replicas} == {("g5.xlarge", "A10G:1")}  # what they landed on
    assert {aws.instances[r.instance_id or ""].region for r in replicas} == {"us-east-1"}
    events = [e.message for e in store.list_events("gpu")]
    landed = [m for m in events if m.startswith("landed on candidate 2: A10G:1 -> g5.xlarge")]
    assert len(landed) == 2 and all("no capacity before: L4:1 -> g6.xlarge" in m for m in landed)

    # The same candidates, more replicas: the two on the second candidate are reused, one more launched.
    submit(store, home, TASK.format(replicas=3), previous=True)
    assert find_config_changes(store.get_version("gpu", 1).spec, store.get_version("gpu", 2).spec) == ()
    for _ in range(3):
        clock.advance(1)
        reconciler.reconcile_once()
    live = [r for r in store.list_replicas("gpu") if r.status.is_live]
    assert sorted(r.replica_id for r in live) == [1, 2, 3]
    assert {r.replica_id: r.version for r in live if r.replica_id in (1, 2)} == {1: 2, 2: 2}

    # Another candidate set replaces them, and the plan names why.
    changes = find_config_changes(store.get_version("gpu", 2).spec,
                                  read_task(TASK.format(replicas=3).replace("A10G: 1", "T4: 1"), "x").spec)
    assert "resources.candidates" in {c.path for c in changes}
    store.close()
