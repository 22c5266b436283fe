"""The codec carries every value the protocol sends and refuses data that does not fit, naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from skyserve_lite.api import ControllerStatus, ServiceView, StatusReport
from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.codec import decode, encode
from skyserve_lite.files.manifest import EntryKind, Manifest, ManifestEntry, TaskFiles
from skyserve_lite.forcedown import ForceDownReport, StoppedProcesses
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.plan.update import LaunchDecision, PlanStep, ReplicaAction, ReplicaDecision, UpdatePlan
from skyserve_lite.providers.base import Instance, InstanceState
from skyserve_lite.remote.wire import WireTask
from skyserve_lite.spec.config import FieldChange
from skyserve_lite.state.history import ServiceHistory
from skyserve_lite.state.models import (
    AutoscalerObservation,
    EventRecord,
    ReplicaRecord,
    ReplicaStatus,
    ServiceRecord,
    ServiceStatus,
    VersionRecord,
)

SERVICE = ServiceRecord(name="web", current_version=2, status=ServiceStatus.READY, status_reason=None, lb_port=30001,
                        lb_pid=4242, lb_policy="least_load", deleting=False, created_at=1.5, next_replica_id=4,
                        active_versions=(1, 2), endpoint_host="203.0.113.5")
REPLICA = ReplicaRecord(service="web", replica_id=3, version=2, status=ReplicaStatus.NOT_READY, cloud="aws",
                        launched_at=10.0, status_since=12.25, launch_token="tok", is_spot=True, region="us-east-1",
                        instance_id="i-0abc", url="http://10.0.0.7:8080", probe_failing_since=11.0,
                        status_reason="probe: HTTP 503", seen_at=10.5)
FILES = TaskFiles(workdir=Manifest((ManifestEntry("", EntryKind.DIR, 0o755),
                                    ManifestEntry("app.py", EntryKind.FILE, 0o644, 12, "ab" * 32),
                                    ManifestEntry("link", EntryKind.LINK, 0o777, target="app.py"))),
                  mounts=(("/data", Manifest((ManifestEntry("", EntryKind.FILE, 0o600, 3, "cd" * 32),))),))

VALUES: list[tuple[Any, Any]] = [
    (ServiceView, ServiceView(service=SERVICE, policy="Autoscaling 1-3 replicas (2 qps/replica)",
                              load_balancing_policy="round_robin", replicas=(REPLICA,),
                              events=(EventRecord(7, 3.0, "web", None, "service", "version 2 submitted"),),
                              autoscaler=(AutoscalerState(2, 3, 1, 0, 9.0),
                                          AutoscalerObservation("request_rate", 3, qps=4.5)),
                              history=ServiceHistory(start_minute=29_453_700, requests=(60, 0, 7),
                                                     ready=(None, 1, 2), target=(None, 2, 2)))),
    (StatusReport, StatusReport(services=(), controller=ControllerStatus(True, 77, 1, 100.0, 101.0, 30.0))),
    (UpdatePlan, UpdatePlan(service="web", from_version=1, to_version=2, mode=UpdateMode.BLUE_GREEN,
                            target_replicas=2,
                            replicas=(ReplicaDecision(1, 1, ReplicaAction.REPLACE,
                                                      (FieldChange("resources.disk_size", None, 100),
                                                       FieldChange("envs.MODE", "a", "b", note="changed"),
                                                       FieldChange("resources.use_spot", False, True),
                                                       FieldChange("service.port", 8080, 8080.5))),),
                            launches=(LaunchDecision(5, True, kept=False),),
                            steps=(PlanStep(launch=(5,), drain=(1,), active_versions=(2,)),), converged=False)),
    (ForceDownReport, ForceDownReport(home=Path("/home/u/.sky-lite"),
                                      processes=(StoppedProcesses("the controller", (12, 13)),),
                                      instances=(("aws", Instance("i-1", "web", 2, 1, InstanceState.RUNNING,
                                                                  region="eu-west-1")),),
                                      notes=("n",), errors=("e",))),
    (VersionRecord, VersionRecord(service="web", version=2, text="run: x\n", source="/t.yaml", created_at=2.0,
                                  mode="rolling", note="rollback to version 1", files_json='{"mounts": {}}',
                                  reuse_identical_files=True, spec_json='{"parsed_by": "x", "spec": {}}')),
    (WireTask, WireTask(text="run: x\n", source="/t.yaml", files=FILES)),
]


@pytest.mark.parametrize(("tp", "value"), VALUES, ids=[tp.__name__ for tp, _ in VALUES])
def test_values_survive_a_round_trip_through_json(tp: Any, value: Any) -> None:
    import json

    wire = json.loads(json.dumps(encode(value)))
    assert decode(tp, wire) == value


def test_config_values_keep_their_scalar_type() -> None:
    changes = decode(tuple[FieldChange, ...], encode((FieldChange("a", 1, True), FieldChange("b", 1.0, "1"))))
    assert [(type(c.old), type(c.new)) for c in changes] == [(int, bool), (float, str)]


@pytest.mark.parametrize(("tp", "data", "message"), [
    (ServiceRecord, {"name": "web"}, "message: missing field 'current_version'"),
    (ReplicaRecord, encode(REPLICA) | {"status": "SLEEPING"}, "message.status: 'SLEEPING' is not a ReplicaStatus"),
    (ReplicaRecord, encode(REPLICA) | {"replica_id": True}, "message.replica_id: expected int, got bool"),
    (ReplicaRecord, encode(REPLICA) | {"launched_at": "soon"}, "message.launched_at: expected a number"),
    (tuple[int, ...], [1, "2"], r"message\[1\]: expected int, got str"),
    (StatusReport, {"services": [], "controller": None}, "message.controller: expected dict, got NoneType"),
])
def test_data_that_does_not_fit_names_the_field(tp: Any, data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode(tp, data)


def test_unknown_values_are_refused_when_encoding() -> None:
    with pytest.raises(TypeError, match="cannot encode a set"):
        encode({1, 2})


def test_exact_decoding_refuses_a_field_missing_or_unknown_at_any_depth() -> None:
    report = StatusReport(services=(), controller=ControllerStatus(running=False, pid=None, services=0,
                                                                   last_pass_at=None, checked_at=1.0))
    data = encode(report)
    assert decode(StatusReport, data, exact=True) == report
    lenient = {**data, "controller": {k: v for k, v in data["controller"].items() if k != "stale_after"}}
    assert decode(StatusReport, lenient).controller.stale_after == report.controller.stale_after  # a default
    with pytest.raises(ValueError, match=r"message\.controller: missing field 'stale_after'"):
        decode(StatusReport, lenient, exact=True)
    unknown = {**data, "controller": {**data["controller"], "uptime": 3}}
    assert decode(StatusReport, unknown) == report  # ignored
    with pytest.raises(ValueError, match=r"message\.controller: unknown field 'uptime'"):
        decode(StatusReport, unknown, exact=True)
