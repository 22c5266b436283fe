"""The plan `serve update --dry-run` shows is what the controller does.

Each scenario file and a set of generated fleets is planned by the forecast, then seeded into a store and a
fake provider per cloud, updated, and carried out by the real ``Reconciler`` pass after pass until nothing is
left to do. What the controller launched, terminated and kept must be what the plan said, replica by replica.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.plan.update import ReplicaAction, UpdatePlan
from skyserve_lite.providers.base import Instance, InstanceState
from skyserve_lite.providers.fake import FakeProvider
from skyserve_lite.spec.model import SubmittedTask, TaskSpec
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaStatus
from skyserve_lite.state.store import Store

from ..plan.fleets import CASES, SETTINGS, Fleet, generate_fleets, load_case

FLEETS = [load_case(path)[0] for path in CASES] + generate_fleets(60)


class Outcome:
    """What the controller did after the update, in the plan's terms."""

    def __init__(self, launched: list[int], terminated: set[int], kept: dict[int, int]) -> None:
        self.launched = launched  # replica ids, in launch order
        self.terminated = terminated  # replica ids whose instance was terminated
        self.kept = kept  # live replica id -> version, once settled


def launched_ids(provider: FakeProvider) -> list[int]:
    """Replica ids the provider was asked to launch (each call records (service, replica id, version))."""
    ids = []
    for call in provider.calls_to("launch"):
        for entry in call.args:
            assert isinstance(entry, tuple)
            ids.append(int(entry[1]))
    return ids


def submit(text: str, spec: TaskSpec | None = None) -> SubmittedTask:
    return SubmittedTask(text=text, source="/tasks/svc.yaml", spec=spec or parse_task(text))


def carry_out(fleet: Fleet, home: Path) -> tuple[UpdatePlan, Outcome]:
    clock = FakeClock()
    store = Store.open(home)
    providers = {"local": FakeProvider(name="local"), "aws": FakeProvider(name="aws")}
    try:
        store.create_service("svc", submit(fleet.versions[1], fleet.spec(1)), 30001, clock.now())
        for version in range(2, fleet.from_version + 1):
            store.add_version("svc", submit(fleet.versions[version], fleet.spec(version)), "rolling", clock.now())
        records = fleet.records()
        if records:
            template = records[0]
            store.add_replicas("svc", max(r.replica_id for r in records), template)
            wanted = {r.replica_id for r in records}
            store.delete_replicas([("svc", rid) for rid in range(1, max(wanted) + 1) if rid not in wanted])
            store.put_replicas(records)
        for record in records:
            if record.status.is_live or record.status is ReplicaStatus.SHUTTING_DOWN:
                assert record.instance_id is not None
                providers[record.cloud].add_instance(Instance(
                    instance_id=record.instance_id, service="svc", replica_id=record.replica_id,
                    version=record.version, state=InstanceState.RUNNING, url=f"http://fake.invalid/{record.replica_id}",
                    is_spot=record.is_spot))
        plan = fleet.forecast(now=clock.now())

        store.add_version("svc", submit(fleet.new, fleet.new_spec()), fleet.mode.value, clock.now(),
                          reuse_identical_files=fleet.reuse_identical_files)
        reconciler = Reconciler(store, providers, FakeProber(), FakeLoadBalancerRunner(), clock, SETTINGS)
        quiet = 0
        for _ in range(80):
            clock.advance(1.0)
            part = reconciler.reconcile_once()
            busy = part.launches or part.terminations or part.removals or part.replica_updates
            draining = any(r.status is ReplicaStatus.SHUTTING_DOWN for r in store.list_replicas("svc"))
            quiet = 0 if busy or draining else quiet + 1
            if quiet == 2:
                break
        else:
            pytest.fail(f"{fleet.name}: the controller did not settle")

        launched = [rid for p in providers.values() for rid in launched_ids(p)]
        terminated = {p.instances[iid].replica_id for p in providers.values() for call in p.calls_to("terminate")
                      for iid in call.args if isinstance(iid, str) and iid in p.instances}
        kept = {r.replica_id: r.version for r in store.list_replicas("svc") if r.status.is_live}
        return plan, Outcome(sorted(launched), terminated, kept)
    finally:
        store.close()


@pytest.mark.parametrize("fleet", FLEETS, ids=[f.name for f in FLEETS])
def test_the_controller_does_what_the_forecast_said(fleet: Fleet, tmp_path: Path) -> None:
    plan, outcome = carry_out(fleet, tmp_path / "home")
    live_at_start = {row.replica_id for row in fleet.rows if row.status.is_live}
    assert plan.converged
    assert [launch.replica_id for launch in plan.launches] == outcome.launched
    assert set(plan.terminate) == outcome.terminated & (live_at_start | set(outcome.launched))
    assert {launch.replica_id for launch in plan.launches if launch.kept} == set(outcome.kept) - live_at_start
    reused = {d.replica_id for d in plan.replicas if d.action is ReplicaAction.REUSE}
    assert reused == set(outcome.kept) & live_at_start
    assert set(outcome.kept.values()) <= {fleet.from_version + 1}
    assert plan.target_replicas == len(outcome.kept)


def test_generated_fleets_cover_what_the_plan_must_get_right() -> None:
    """The generated set holds spot fallback with stand-ins, scale-ups, scale-downs, replacements, reuse,
    and both modes; otherwise the equivalence above proves less than it claims."""
    plans = [fleet.forecast() for fleet in generate_fleets(60)]
    assert any(not launch.kept for plan in plans for launch in plan.launches)
    assert any(plan.count(ReplicaAction.TERMINATE) for plan in plans)
    assert any(plan.count(ReplicaAction.REPLACE) and plan.count(ReplicaAction.REUSE) for plan in plans)
    assert any(plan.launch and plan.count(ReplicaAction.REUSE) for plan in plans)
    assert {plan.mode for plan in plans} == {"rolling", "blue_green"}
