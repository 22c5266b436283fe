"""Updates carried out by reconcile passes against the fake provider: reuse, launch only the difference,
rolling capacity, blue-green switch, service-only changes, concurrent version writes."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from skyserve_lite.errors import StateConflictError
from skyserve_lite.providers.base import InstanceState
from skyserve_lite.providers.fake import Call
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaStatus, ServiceStatus

from .conftest import TASK, Harness


def ready_serving(h: Harness) -> int:
    """READY replicas the load balancer would send traffic to right now."""
    view = h.store.get_lb_view("svc")
    return len(view.ready_urls) if view else 0


def start(h: Harness, replicas: int) -> dict[int, str]:
    h.create(replicas=replicas)
    h.tick()
    h.tick()
    assert all(r.status is ReplicaStatus.READY for r in h.replicas())
    return {r.replica_id: r.instance_id or "" for r in h.replicas()}


def test_scale_up_reuses_instances_and_launches_exactly_one(harness: Harness) -> None:
    before = start(harness, 2)
    harness.update(TASK.format(replicas=3))
    harness.tick()
    rows = harness.replicas()
    assert {r.replica_id: (r.version, r.instance_id) for r in rows if r.replica_id in before} == {
        1: (2, before[1]), 2: (2, before[2])}
    assert harness.provider.calls_to("launch")[-1] == Call("launch", (("svc", 3, 2),))
    assert len(harness.provider.calls_to("launch")) == 2
    assert harness.provider.calls_to("terminate") == []


def test_scale_down_reuses_then_terminates_the_newest_and_launches_nothing(harness: Harness) -> None:
    before = start(harness, 2)
    harness.update(TASK.format(replicas=1))
    harness.tick()
    assert harness.statuses() == {1: "READY", 2: "SHUTTING_DOWN"}
    harness.tick(5)  # drained
    assert harness.provider.calls_to("terminate") == [Call("terminate", (before[2],))]
    assert len(harness.provider.calls_to("launch")) == 1
    harness.tick()
    assert [(r.replica_id, r.version) for r in harness.replicas()] == [(1, 2)]


def test_rolling_update_never_drops_ready_capacity_below_the_target(harness: Harness) -> None:
    start(harness, 3)
    harness.update(TASK.format(replicas=3).replace("http.server", "http.server --bind 127.0.0.1"))
    serving = []
    for _ in range(10):
        harness.tick(2)
        serving.append(ready_serving(harness))
    assert min(serving) >= 3
    rows = harness.replicas()
    assert sorted(r.replica_id for r in rows) == [4, 5, 6]
    assert all(r.version == 2 and r.status is ReplicaStatus.READY for r in rows)
    assert harness.service().active_versions == (2,)


def test_rolling_update_with_slow_new_replicas_keeps_old_ones(harness: Harness) -> None:
    start(harness, 2)
    harness.update(TASK.format(replicas=2).replace("$PORT", "$PORT --bind 127.0.0.1"))
    from skyserve_lite.controller.replica_rules import ProbeResult

    harness.prober.set({("svc", 3): ProbeResult(False, "HTTP 503"), ("svc", 4): ProbeResult(False, "HTTP 503")})
    for _ in range(3):
        harness.tick()
    assert harness.statuses() == {1: "READY", 2: "READY", 3: "STARTING", 4: "STARTING"}
    assert harness.service().active_versions == (1,)
    harness.prober.set({("svc", 3): ProbeResult(True, "HTTP 200")})
    harness.tick()
    assert harness.statuses() == {1: "READY", 2: "SHUTTING_DOWN", 3: "READY", 4: "STARTING"}
    assert harness.service().active_versions == (1, 2)


def test_blue_green_switches_all_traffic_at_once(harness: Harness) -> None:
    start(harness, 2)
    harness.update(TASK.format(replicas=2).replace("/health", "/ready").replace("python", "python3"),
                   mode="blue_green")
    from skyserve_lite.controller.replica_rules import ProbeResult

    harness.prober.set({("svc", 4): ProbeResult(False, "HTTP 503")})
    harness.tick()  # launch 3, 4
    harness.tick()  # 3 READY, 4 not: traffic stays on version 1
    assert harness.statuses() == {1: "READY", 2: "READY", 3: "READY", 4: "STARTING"}
    view = harness.store.get_lb_view("svc")
    old_urls = {r.url for r in harness.replicas() if r.version == 1}
    assert view is not None and set(view.ready_urls) == old_urls
    harness.prober.set({("svc", 4): ProbeResult(True, "HTTP 200")})
    harness.tick()
    assert harness.statuses() == {1: "SHUTTING_DOWN", 2: "SHUTTING_DOWN", 3: "READY", 4: "READY"}
    view = harness.store.get_lb_view("svc")
    assert view is not None and set(view.ready_urls) == {r.url for r in harness.replicas() if r.version == 2}
    assert harness.service().active_versions == (2,)


def test_service_only_change_replaces_nothing_and_applies_the_lb_policy(harness: Harness) -> None:
    before = start(harness, 2)
    text = TASK.format(replicas=2).replace("initial_delay_seconds: 60",
                                           "initial_delay_seconds: 30\n  load_balancing_policy: round_robin")
    harness.update(text)
    harness.tick()
    assert {r.replica_id: (r.version, r.instance_id) for r in harness.replicas()} == {
        1: (2, before[1]), 2: (2, before[2])}
    assert harness.service().lb_policy == "round_robin"
    assert harness.provider.calls_to("terminate") == [] and len(harness.provider.calls_to("launch")) == 1


def test_terminal_replicas_are_not_bumped(harness: Harness) -> None:
    start(harness, 1)
    (first,) = harness.replicas()
    harness.store.put_replicas([dataclasses.replace(first, status=ReplicaStatus.FAILED)])
    harness.update(TASK.format(replicas=1).replace("initial_delay_seconds: 60", "initial_delay_seconds: 61"))
    harness.tick()
    rows = {r.replica_id: (r.version, r.status.value) for r in harness.replicas()}
    assert rows[1] == (1, "FAILED")


def test_expect_version_mismatch_stores_nothing(harness: Harness) -> None:
    start(harness, 1)
    task = SubmittedTask(text=TASK.format(replicas=2), source="x.yaml", spec=parse_task(TASK.format(replicas=2)))
    with pytest.raises(StateConflictError, match="is at version 1, not 5"):
        harness.store.add_version("svc", task, "rolling", 0.0, expect_version=5)
    assert [v.version for v in harness.store.list_versions("svc")] == [1]
    assert harness.store.add_version("svc", task, "rolling", 0.0, expect_version=1).version == 2


def test_concurrent_updates_are_serialized(harness: Harness, tmp_path: object) -> None:
    harness.create(replicas=1)
    from skyserve_lite.state.store import Store

    path = harness.store.path.parent
    errors: list[BaseException] = []

    def submit(count: int) -> None:
        store = Store.open(path)
        try:
            for index in range(5):
                text = TASK.format(replicas=count) + f"# writer {count} update {index}\n"
                store.add_version("svc", SubmittedTask(text, "x.yaml", parse_task(text)), "rolling", 0.0)
        except BaseException as exc:  # pragma: no cover - surfaced by the assertion below
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=submit, args=(n,)) for n in (2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    versions = harness.store.list_versions("svc")
    assert [v.version for v in versions] == list(range(1, 12))
    assert harness.service().current_version == 11
    for writer in (2, 3):
        order = [int(v.text.rsplit(" ", 1)[1]) for v in versions if f"writer {writer}" in v.text]
        assert order == [0, 1, 2, 3, 4]


def test_update_to_a_broken_version_stops_launching_while_old_replicas_serve(harness: Harness) -> None:
    start(harness, 2)
    harness.update(TASK.format(replicas=2).replace("python -m http.server $PORT", "exit 1"))
    for _ in range(6):
        harness.tick()
        for row in harness.replicas():
            if row.version == 2 and row.status.is_live and row.instance_id:
                harness.provider.set_state(row.instance_id, InstanceState.EXITED, "run exited with code 1")
    launched = [r.replica_id for r in harness.replicas() if r.version == 2]
    assert len(launched) == 4  # two per pass until three had failed, then no more
    calls = len(harness.provider.calls_to("launch"))
    harness.tick()
    assert len(harness.provider.calls_to("launch")) == calls
    assert harness.statuses()[1] == "READY" and harness.statuses()[2] == "READY"
    service = harness.service()
    assert service.status is ServiceStatus.READY
    assert (service.status_reason or "").startswith("4 replicas of version 2 failed before becoming ready")


def test_down_does_not_wait_for_the_drain(harness: Harness) -> None:
    start(harness, 2)
    harness.update(TASK.format(replicas=1))
    harness.tick()
    assert harness.statuses() == {1: "READY", 2: "SHUTTING_DOWN"}
    harness.store.mark_deleting(["svc"])
    harness.tick()
    assert len(harness.provider.calls_to("terminate")) == 1
    assert harness.provider.list_instances() == []
