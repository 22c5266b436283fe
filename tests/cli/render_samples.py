"""Values the render snapshot tests print: long names, real-looking endpoints and long reasons, at fixed
times (``NOW`` is 2026-01-01T00:10:00Z, so every age and timestamp is the same on every run)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import RenderableType

from skyserve_lite.api import HistoryEntry, ServiceView
from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.autoscalers.simulator import SimulatedDecision
from skyserve_lite.cli.render import (
    history_table,
    launch_plan_renderable,
    plan_renderable,
    simulation_table,
    status_renderable,
)
from skyserve_lite.plan.placement import LaunchPlan, ReplicaLaunch
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.plan.update import LaunchDecision, PlanStep, ReplicaAction, ReplicaDecision, UpdatePlan
from skyserve_lite.spec.config import FieldChange
from skyserve_lite.spec.placement import Placement
from skyserve_lite.state.models import (
    AutoscalerObservation,
    EventRecord,
    ReplicaRecord,
    ReplicaStatus,
    ServiceRecord,
    ServiceStatus,
)

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
NOW = START + 600

CAPACITY = ("launch will be retried: InsufficientInstanceCapacity: we currently do not have sufficient "
            "g5.xlarge capacity in the Availability Zone you requested (us-east-1a)")
PROBE = "readiness probe failed 3 times in a row: HTTP 503 from /health after 5.0s"
CIRCUIT = ("3 replicas of version 1 failed before becoming ready, launching stopped; last: replica 4 FAILED: "
           "the workload exited (run exited with code 3)")


def service(name: str, port: int, *, version: int = 1, status: ServiceStatus = ServiceStatus.READY,
            reason: str | None = None, tls: bool = False) -> ServiceRecord:
    return ServiceRecord(name=name, current_version=version, status=status, status_reason=reason, lb_port=port,
                         lb_pid=None, lb_policy="least_load", deleting=False, created_at=START,
                         next_replica_id=5, endpoint_tls=tls)


def replica(name: str, replica_id: int, status: ReplicaStatus, *, version: int = 1, cloud: str = "local",
            region: str | None = None, instance_id: str | None = None, instance_type: str | None = None,
            accelerator: str | None = None, url: str | None = None, reason: str | None = None,
            launched_at: float = START) -> ReplicaRecord:
    return ReplicaRecord(service=name, replica_id=replica_id, version=version, status=status, cloud=cloud,
                         launched_at=launched_at, status_since=launched_at, launch_token="t", region=region,
                         instance_id=instance_id, instance_type=instance_type, accelerator=accelerator, url=url,
                         status_reason=reason)


DEMO = "autoscaling-demo-service"
GATEWAY = "batch-inference-gateway"
EVENTS = (
    EventRecord(1, START, DEMO, None, "service", "version 1 submitted"),
    EventRecord(2, START + 5, DEMO, 1, "replica", "launching replica 1 (g5.xlarge, us-east-1, on-demand)"),
    EventRecord(3, START + 180, DEMO, 2, "replica", f"replica 2 launch failed; {CAPACITY}"),
    EventRecord(4, START + 420, DEMO, 1, "replica", "replica 1 is READY at http://10.0.1.17:8080"),
)
DEMO_VIEW = ServiceView(
    service=service(DEMO, 30001, version=2), policy="Autoscaling 1-3 replicas (5 qps/replica)",
    load_balancing_policy="least_load",
    replicas=(
        replica(DEMO, 1, ReplicaStatus.READY, version=2, cloud="aws", region="us-east-1",
                instance_id="i-0123456789abcdef0", instance_type="g5.xlarge", accelerator="A10G:1",
                url="http://10.0.1.17:8080"),
        replica(DEMO, 2, ReplicaStatus.PROVISIONING, version=2, cloud="aws", region="us-east-1", reason=CAPACITY,
                launched_at=START + 120),
        replica(DEMO, 3, ReplicaStatus.NOT_READY, version=1, cloud="aws", region="us-east-1",
                instance_id="i-0fedcba9876543210", instance_type="g5.xlarge", accelerator="A10G:1",
                url="http://10.0.1.18:8080", reason=PROBE),
    ),
    events=EVENTS,
    autoscaler=(AutoscalerState(2, 2, upscale_count=4),
                AutoscalerObservation("request_rate", 3, qps=12.25, held_back="upscale delay 4/15")),
)
GATEWAY_VIEW = ServiceView(
    service=service(GATEWAY, 30002, status=ServiceStatus.FAILED, reason=CIRCUIT), policy="Fixed 2 replicas",
    load_balancing_policy="round_robin",
    replicas=(replica(GATEWAY, 4, ReplicaStatus.FAILED, instance_id="41807", url="http://127.0.0.1:40123",
                      reason="the workload exited (run exited with code 3)"),),
    events=(),
)
WEB_VIEW = ServiceView(
    service=service("web", 30003, tls=True), policy="Fixed 1 replica", load_balancing_policy="least_load",
    replicas=(replica("web", 1, ReplicaStatus.READY, instance_id="41790", url="http://127.0.0.1:40117"),),
    events=(),
)
VIEWS = (DEMO_VIEW, GATEWAY_VIEW, WEB_VIEW)
SERVICE_NAMES = (DEMO, GATEWAY, "web")
ENDPOINTS = ("http://127.0.0.1:30001", "http://127.0.0.1:30002", "https://127.0.0.1:30003")
REPLICA_URLS = ("http://10.0.1.17:8080", "http://10.0.1.18:8080", "http://127.0.0.1:40123",
                "http://127.0.0.1:40117")

UPDATE_PLAN = UpdatePlan(
    service=DEMO, from_version=2, to_version=3, mode=UpdateMode.ROLLING, target_replicas=3,
    replicas=(
        ReplicaDecision(1, 2, ReplicaAction.REPLACE, (
            FieldChange("resources.image_id", "ami-0123456789abcdef0", "ami-0fedcba9876543210"),
            FieldChange("workdir", "./app", "./app", note="contents identical (sha256 9f2c1a0b), counted as a "
                        "change because the task has a setup script; --reuse-identical-files keeps it"),
        )),
        ReplicaDecision(2, 2, ReplicaAction.REUSE),
        ReplicaDecision(3, 1, ReplicaAction.TERMINATE),
    ),
    launches=(LaunchDecision(5, is_spot=True), LaunchDecision(6, is_spot=False, kept=False)),
    steps=(PlanStep(launch=(5, 6), active_versions=(2,)), PlanStep(drain=(1, 3), active_versions=(3,))),
)

_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f")
_IMAGE = "ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"


def _placement(instance_type: str, price: float, is_spot: bool) -> Placement:
    return Placement(cloud="aws", region="us-east-1", zones=_ZONES, instance_type=instance_type,
                     accelerator="A10G:1", price_per_hour=price, is_spot=is_spot, image=_IMAGE, image_is_default=True,
                     disk_size=256, disk_type="gp3", need="A10G:1, cpus 4+")


LAUNCH_PLAN = LaunchPlan(
    service=DEMO, cloud="aws",
    replicas=(
        ReplicaLaunch(1, False, (_placement("g5.xlarge", 1.006, False), _placement("g6.xlarge", 0.805, False))),
        ReplicaLaunch(2, True, (_placement("g5.xlarge", 0.4121, True),)),
    ),
    skipped=("L4:1: no instance type in us-east-1 has 1 L4 with at least 4 vCPUs and 64 GB of memory",),
    envs=("MODEL_NAME",), secrets=("HF_TOKEN",), files="sha256 9f2c1a0b4e7d (12.0 KiB)",
)

HISTORY = (
    HistoryEntry(1, START, "initial", "first version", None, files_digest="9f2c1a0b4e7d" + "0" * 52,
                 files_size=12_345),
    HistoryEntry(2, START + 3600, "rolling", "resources.image_id: ami-0123456789abcdef0 -> ami-0fedcba9876543210; "
                 "service.replica_policy.max_replicas: 2 -> 3", "raise capacity for the launch traffic",
                 files_digest="9f2c1a0b4e7d" + "0" * 52, files_size=12_345),
    HistoryEntry(3, START + 7200, "blue_green", "rollback to version 1", None, files_expired=True),
)

DECISIONS = (
    SimulatedDecision(0, 0.0, 1, 1, None),
    SimulatedDecision(20, 12.5, 1, 3, "upscale delay 1/3: a change must be asked for 3 times in a row"),
    SimulatedDecision(40, 12.5, 1, 3, "upscale delay 2/3: a change must be asked for 3 times in a row"),
    SimulatedDecision(60, 12.5, 3, 3, None),
    SimulatedDecision(80, 1.25, 3, 1, "downscale delay 1/12"),
)


def _rendered_views() -> dict[str, Callable[[], RenderableType]]:
    return {
        "status": lambda: status_renderable(VIEWS, NOW),
        # `serve status NAME`, with a controller that has not completed a pass for 47 s
        "status_service": lambda: status_renderable([DEMO_VIEW], NOW, events=True, unverified_for=47),
        "update_plan": lambda: plan_renderable(UPDATE_PLAN),
        "launch_plan": lambda: launch_plan_renderable(LAUNCH_PLAN),
        "history": lambda: history_table(DEMO, HISTORY),
        "simulate": lambda: simulation_table("Autoscaling 1-3 replicas (5 qps/replica)", DECISIONS),
    }


# Every main view, drawn from the samples above: what the snapshot and drawing tests print.
RENDERED_VIEWS = _rendered_views()
