"""Reconcile passes against the fake provider: assert on the calls it recorded and the rows written."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from skyserve_lite.controller.replica_rules import ProbeResult
from skyserve_lite.providers.base import Instance, InstanceState, LaunchOutcome, LaunchRequest
from skyserve_lite.providers.fake import Call
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, ServiceStatus

from .conftest import TASK, Harness

BAD = ProbeResult(ok=False, detail="HTTP 503")


def test_first_pass_launches_the_target_in_one_batch_and_starts_the_load_balancer(harness: Harness) -> None:
    harness.create(replicas=2)
    harness.tick()
    assert harness.provider.calls_to("launch") == [Call("launch", (("svc", 1, 1), ("svc", 2, 1)))]
    assert harness.statuses() == {1: "PROVISIONING", 2: "PROVISIONING"}
    assert all(r.instance_id for r in harness.replicas())
    assert harness.lbs.started == [("svc", 30001)]
    assert harness.service().status is ServiceStatus.REPLICA_INIT


def test_running_replicas_that_answer_the_probe_become_ready(harness: Harness) -> None:
    harness.create(replicas=2)
    harness.tick()
    harness.tick()
    assert harness.statuses() == {1: "READY", 2: "READY"}
    assert harness.service().status is ServiceStatus.READY
    assert harness.prober.probed[-1] == [("svc", 1), ("svc", 2)]
    # A steady pass changes nothing: no launch, no termination, no write.
    plan = harness.tick()
    assert plan.is_empty
    assert len(harness.provider.calls_to("launch")) == 1


def test_exited_replica_is_replaced_with_a_new_id(harness: Harness) -> None:
    harness.create(replicas=2)
    harness.tick()
    harness.tick()
    first = harness.provider.instance_for("svc", 1)
    harness.provider.set_state(first.instance_id, InstanceState.EXITED, "run exited with code 1")
    harness.tick()
    assert harness.provider.calls_to("terminate") == [Call("terminate", (first.instance_id,))]
    assert harness.provider.calls_to("launch")[-1] == Call("launch", (("svc", 3, 1),))
    assert harness.statuses() == {1: "FAILED", 2: "READY", 3: "PROVISIONING"}
    assert harness.replicas()[0].status_reason == "the workload exited (run exited with code 1)"
    messages = [e.message for e in harness.store.list_events("svc")]
    assert "FAILED: the workload exited (run exited with code 1)" in messages


def test_probe_failing_past_the_grace_replaces_the_replica(harness: Harness) -> None:
    harness.create(replicas=1)
    harness.tick()
    harness.tick()
    harness.prober.set({("svc", 1): BAD})
    harness.tick()
    assert harness.statuses() == {1: "NOT_READY"}
    harness.tick(100)
    assert harness.statuses() == {1: "NOT_READY"}
    harness.tick(81)
    assert harness.statuses() == {1: "FAILED_PROBING", 2: "PROVISIONING"}


def test_replica_never_ready_within_initial_delay_fails(harness: Harness) -> None:
    harness.create(replicas=1)
    harness.prober.set({("svc", 1): BAD})
    harness.tick()
    harness.tick()
    assert harness.statuses() == {1: "STARTING"}
    assert harness.replicas()[0].status_reason == "HTTP 503"
    harness.tick(61)
    assert harness.statuses()[1] == "FAILED_INITIAL_DELAY"


def test_repeated_failures_stop_launching_and_fail_the_service(harness: Harness) -> None:
    harness.create(replicas=1)
    for _ in range(3):
        harness.tick()
        (live,) = [r for r in harness.replicas() if r.status.is_live]
        harness.provider.set_state(live.instance_id or "", InstanceState.EXITED, "run exited with code 2")
    harness.tick()
    assert harness.statuses() == {1: "FAILED", 2: "FAILED", 3: "FAILED"}
    service = harness.service()
    assert service.status is ServiceStatus.FAILED
    assert "3 replicas of version 1 failed before becoming ready" in (service.status_reason or "")
    launches = len(harness.provider.calls_to("launch"))
    harness.tick()
    assert len(harness.provider.calls_to("launch")) == launches


def test_surplus_replicas_are_terminated_in_scale_down_order(harness: Harness) -> None:
    harness.create(replicas=3)
    harness.tick()
    harness.tick()
    from skyserve_lite.controller.replica_rules import ProbeResult

    harness.prober.set({("svc", 1): ProbeResult(False, "HTTP 503")})
    harness.tick()
    assert harness.statuses() == {1: "NOT_READY", 2: "READY", 3: "READY"}
    harness.update(harness.store.get_version("svc", 1).text.replace("replicas: 3", "replicas: 1"))
    harness.tick()
    # Not-ready first, then the newest of the ready ones.
    assert harness.statuses() == {1: "SHUTTING_DOWN", 2: "READY", 3: "SHUTTING_DOWN"}
    # Out of traffic at once (the load balancer sees only replica 2), terminated after the drain.
    view = harness.store.get_lb_view("svc")
    assert view is not None and view.ready_urls == (harness.replicas()[1].url,)
    harness.tick(4)
    assert harness.provider.calls_to("terminate") == []
    harness.tick(1)
    ids = tuple(sorted(harness.provider.instance_for("svc", i).instance_id for i in (1, 3)))
    assert harness.provider.calls_to("terminate") == [Call("terminate", ids)]
    harness.tick()
    assert harness.statuses() == {2: "READY"}


def test_down_terminates_everything_then_forgets_the_service(harness: Harness) -> None:
    harness.create(replicas=2)
    harness.tick()
    harness.tick()
    harness.store.mark_deleting(["svc"])
    harness.tick()
    assert harness.statuses() == {1: "SHUTTING_DOWN", 2: "SHUTTING_DOWN"}
    assert harness.service().status is ServiceStatus.SHUTTING_DOWN
    assert harness.lbs.stopped == [50_001]
    assert len(harness.provider.calls_to("terminate")) == 1
    harness.tick()
    assert harness.store.find_service("svc") is None
    assert harness.provider.released == ["svc"]
    assert harness.provider.list_instances() == []


def test_instance_launched_before_a_crash_is_adopted_not_launched_again(harness: Harness) -> None:
    harness.create(replicas=1)
    now = harness.clock.now()
    # The executor wrote its intent, the provider started the instance, then the controller died.
    harness.store.add_replicas("svc", 1, ReplicaRecord(
        service="svc", replica_id=0, version=1, status=ReplicaStatus.PROVISIONING, cloud="local",
        launched_at=now, status_since=now, launch_token="tok-1"))
    harness.provider.add_instance(Instance(instance_id="i-early", service="svc", replica_id=1, version=1,
                                           state=InstanceState.RUNNING, url="http://u"))
    harness.tick()
    assert harness.provider.calls_to("launch") == []
    assert harness.provider.calls_to("terminate") == []
    (row,) = harness.replicas()
    assert (row.instance_id, row.status) == ("i-early", ReplicaStatus.READY)


def test_unconfirmed_launch_is_resent_with_the_same_token(harness: Harness) -> None:
    harness.create(replicas=1)
    now = harness.clock.now()
    harness.store.add_replicas("svc", 1, ReplicaRecord(
        service="svc", replica_id=0, version=1, status=ReplicaStatus.PROVISIONING, cloud="local",
        launched_at=now, status_since=now, launch_token="tok-1"))
    harness.tick()
    assert harness.provider.calls_to("launch") == [Call("launch", (("svc", 1, 1),))]
    (row,) = harness.replicas()
    assert row.launch_token == "tok-1"
    assert row.instance_id is not None


def test_instance_that_no_replica_claims_is_terminated(harness: Harness) -> None:
    harness.create(replicas=1)
    harness.provider.add_instance(Instance(instance_id="i-orphan", service="gone", replica_id=7, version=1,
                                           state=InstanceState.RUNNING))
    plan = harness.tick()
    assert Call("terminate", ("i-orphan",)) in harness.provider.calls
    assert any(e.kind == "orphan" for e in plan.events)


def test_without_an_inventory_nothing_is_decided(harness: Harness) -> None:
    harness.create(replicas=1)
    harness.tick()
    harness.provider.fail_inventory()
    before = harness.replicas()
    plan = harness.tick(10_000)  # long enough that any rule would fire if it ran blind
    assert harness.replicas() == before
    assert plan.launches == () and plan.terminations == ()


def test_transient_launch_error_retries_the_same_replica(harness: Harness) -> None:
    harness.create(replicas=1)
    harness.provider.fail_next_launch("RequestLimitExceeded", permanent=False)
    harness.tick()
    (row,) = harness.replicas()
    assert (row.status, row.instance_id) == (ReplicaStatus.PROVISIONING, None)
    assert row.status_reason == "launch will be retried: RequestLimitExceeded"
    harness.tick()
    assert harness.provider.calls_to("launch")[-1] == Call("launch", (("svc", 1, 1),))
    assert [r.replica_id for r in harness.replicas()] == [1]
    assert harness.replicas()[0].instance_id is not None


def test_permanent_launch_error_fails_the_replica(harness: Harness) -> None:
    harness.create(replicas=1)
    harness.provider.fail_next_launch("image not found", permanent=True)
    harness.tick()
    (row,) = harness.replicas()
    assert (row.status, row.status_reason) == (ReplicaStatus.FAILED_PROVISION, "image not found")


def test_dead_load_balancer_is_restarted(harness: Harness) -> None:
    harness.create(replicas=1)
    harness.tick()
    pid = harness.service().lb_pid
    assert pid is not None
    harness.lbs.crash(pid)
    harness.tick()
    assert harness.lbs.started == [("svc", 30001), ("svc", 30001)]
    assert harness.service().lb_pid != pid


def test_terminal_rows_are_pruned_beyond_the_newest_ten(harness: Harness) -> None:
    harness.settings = dataclasses.replace(harness.settings, failure_limit=100)
    harness.reconciler._settings = harness.settings
    harness.create(replicas=1)
    for _ in range(12):
        harness.tick()
        (live,) = [r for r in harness.replicas() if r.status.is_live]
        harness.provider.set_state(live.instance_id or "", InstanceState.PREEMPTED, "spot interruption")
    harness.tick()
    harness.tick()
    terminal = [r.replica_id for r in harness.replicas() if r.status.is_terminal]
    assert terminal == list(range(3, 13))


def test_launch_details_from_the_provider_are_recorded(harness: Harness) -> None:
    harness.create(replicas=1)
    original = harness.provider.launch

    def launch_with_detail(requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        outcomes = original(requests)
        assert all(o.instance is not None for o in outcomes)
        return [dataclasses.replace(o, instance=dataclasses.replace(o.instance, detail="launched in zone-b; no "
                                                                    "capacity in zone-a"))
                for o in outcomes if o.instance is not None]

    harness.provider.launch = launch_with_detail  # type: ignore[method-assign]
    harness.tick()
    assert "launched in zone-b; no capacity in zone-a" in [e.message for e in harness.store.list_events("svc")]


def test_a_taken_port_moves_the_endpoint_instead_of_restarting_forever(harness: Harness) -> None:
    harness.create(replicas=1)
    harness.lbs.taken_ports.add(30001)
    harness.tick()
    assert harness.lbs.started == [("svc", 30002)]
    assert harness.service().lb_port == 30002
    messages = [e.message for e in harness.store.list_events("svc")]
    assert "port 30001 is taken by another process; the endpoint moved to port 30002" in messages
    harness.tick()
    assert harness.lbs.started == [("svc", 30002)]  # started once; the moved port holds


def test_a_service_with_a_free_port_keeps_it(harness: Harness) -> None:
    harness.create(replicas=1)
    harness.tick()
    assert harness.lbs.started == [("svc", 30001)]
    assert "load balancer started on port 30001 (pid 50001)" in [e.message for e in harness.store.list_events("svc")]


def test_a_pinned_port_taken_later_is_waited_for_and_said_once_not_moved(harness: Harness) -> None:
    text = TASK.format(replicas=1)
    harness.store.create_service("svc", SubmittedTask(text=text, source="/t/svc.yaml", spec=parse_task(text)),
                                 30001, harness.clock.now(), pinned=True)
    harness.lbs.taken_ports.add(30001)
    harness.tick()
    harness.tick()
    assert harness.lbs.started == [] and harness.service().lb_port == 30001
    messages = [e.message for e in harness.store.list_events("svc")]
    said = "port 30001 is taken by another process; the endpoint is pinned (--endpoint-port), so the load " \
           "balancer waits for it"
    assert messages.count(said) == 1
    harness.lbs.taken_ports.discard(30001)
    harness.tick()
    assert harness.lbs.started == [("svc", 30001)]
