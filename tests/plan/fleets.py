"""Update scenarios as values: the versions a service has, its replicas, and the task it is updated to.

Scenario files (``cases/*.yaml``) and generated fleets both become a ``Fleet``; the forecast tests plan it,
and the controller tests seed a store and a fake provider with it and let the controller carry it out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from skyserve_lite.controller.forecast import forecast_update
from skyserve_lite.controller.pass_types import ServiceSnapshot
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.files.manifest import EntryKind, Manifest, ManifestEntry, TaskFiles
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.plan.update import UpdatePlan
from skyserve_lite.spec.model import TaskSpec
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, ServiceRecord, ServiceStatus

CASES = sorted((Path(__file__).parent / "cases").glob("*.yaml"))
SETTINGS = ControllerSettings(probe_failure_grace_seconds=180, provision_timeout_seconds=600, failure_limit=3,
                              drain_seconds=5)


@dataclass(frozen=True)
class Row:
    replica_id: int
    version: int
    status: ReplicaStatus
    is_spot: bool = False


FilesDoc = dict[str, dict[str, str]]  # {"workdir": {path: content}, "/data": {path: content}}


def make_files(doc: FilesDoc | None) -> TaskFiles | None:
    """A snapshot from file contents, as capture would record them (``""`` for a single-file mount)."""
    if doc is None:
        return None
    manifests = {where: Manifest(tuple(
        ManifestEntry(path, EntryKind.FILE, size=len(text), digest=hashlib.sha256(text.encode()).hexdigest())
        for path, text in sorted(contents.items()))) for where, contents in doc.items()}
    return TaskFiles(workdir=manifests.pop("workdir", None), mounts=tuple(sorted(manifests.items())))


@dataclass(frozen=True)
class Fleet:
    name: str
    versions: dict[int, str]  # version -> task YAML text
    rows: tuple[Row, ...]
    new: str
    mode: UpdateMode = UpdateMode.ROLLING
    files: dict[int, FilesDoc] = field(default_factory=dict)  # version -> its snapshot's contents
    new_files: FilesDoc | None = None
    reuse_identical_files: bool = False

    def spec(self, version: int) -> TaskSpec:
        return dataclasses.replace(parse_task(self.versions[version]), files=make_files(self.files.get(version)))

    def new_spec(self) -> TaskSpec:
        return dataclasses.replace(parse_task(self.new), files=make_files(self.new_files))

    @property
    def from_version(self) -> int:
        return max(self.versions)

    def records(self) -> list[ReplicaRecord]:
        clouds = {v: parse_task(text).cloud.value for v, text in self.versions.items()}
        return [ReplicaRecord(service="svc", replica_id=r.replica_id, version=r.version, status=r.status,
                              cloud=clouds[r.version], launched_at=float(r.replica_id),
                              status_since=float(r.replica_id), launch_token="t", is_spot=r.is_spot,
                              instance_id=f"i-{r.replica_id}")
                for r in self.rows]

    def snapshot(self) -> ServiceSnapshot:
        service = ServiceRecord(name="svc", current_version=self.from_version, status=ServiceStatus.READY,
                                status_reason=None, lb_port=30001, lb_pid=1, lb_policy="least_load", deleting=False,
                                created_at=0.0, next_replica_id=max((r.replica_id for r in self.rows), default=0) + 1)
        return ServiceSnapshot(service, {v: self.spec(v) for v in self.versions}, tuple(self.records()),
                               lb_alive=True)

    def forecast(self, now: float = 1_767_225_600.0) -> UpdatePlan:
        return forecast_update(self.snapshot(), self.from_version + 1, self.new_spec(), self.mode, now, SETTINGS,
                               reuse_identical_files=self.reuse_identical_files)


def load_case(path: Path) -> tuple[Fleet, dict[str, Any]]:
    """A scenario file as a fleet, and what it expects of the plan."""
    case = yaml.safe_load(path.read_text())
    rows = tuple(Row(r["id"], r["version"], ReplicaStatus(r["status"]), bool(r.get("spot", False)))
                 for r in case["replicas"])
    versions = {int(v): text for v, text in case["versions"].items()}
    fleet = Fleet(path.stem, versions, rows, case["new"], UpdateMode(case.get("mode", "rolling")),
                  files={int(v): doc for v, doc in case.get("files", {}).items()}, new_files=case.get("new_files"),
                  reuse_identical_files=bool(case.get("reuse_identical_files", False)))
    return fleet, case


_STATUSES = (ReplicaStatus.READY,) * 4 + (ReplicaStatus.STARTING, ReplicaStatus.PROVISIONING,
                                          ReplicaStatus.NOT_READY, ReplicaStatus.FAILED,
                                          ReplicaStatus.SHUTTING_DOWN, ReplicaStatus.PREEMPTED)


def _task(rng: random.Random) -> str:
    image = rng.choice(["img-a", "img-b"])
    spot = rng.random() < 0.4
    low = rng.randint(0, 4)
    policy: dict[str, Any]
    if spot:
        policy = {"min_replicas": low, "max_replicas": low + 2, "target_qps_per_replica": 5,
                  "base_ondemand_fallback_replicas": rng.randint(0, 2),
                  "dynamic_ondemand_fallback": rng.random() < 0.7}
    elif rng.random() < 0.3:
        policy = {"min_replicas": low, "max_replicas": low + 3, "target_qps_per_replica": 5}
    else:
        policy = {"min_replicas": max(1, low)}
    document = {"resources": {"image_id": image, "use_spot": spot},
                "envs": {"MODEL": rng.choice(["a", "b"])},
                "service": {"readiness_probe": rng.choice(["/", "/health"]), "replica_policy": policy},
                "run": "python serve.py"}
    return yaml.safe_dump(document, sort_keys=False)


def generate_fleets(count: int, seed: int = 7) -> list[Fleet]:
    """Mixed versions, spot and on-demand, fallback, scale up and down, rolling and blue-green."""
    rng = random.Random(seed)
    fleets = []
    # A canary's passes wait on bake windows and counts (tests/controller/test_canary_reconcile.py): its
    # forecast is a rolling one's plus its steps, which the controller reaches only as time passes.
    forecast_modes = [mode for mode in UpdateMode if mode is not UpdateMode.CANARY]
    for number in range(count):
        versions = {v: _task(rng) for v in range(1, rng.randint(1, 3) + 1)}
        rows = []
        for replica_id in range(1, rng.randint(0, 7) + 1):
            version = rng.choice(list(versions))
            spot = "use_spot: true" in versions[version] and rng.random() < 0.6
            rows.append(Row(replica_id, version, rng.choice(_STATUSES), spot))
        new = _task(rng) if rng.random() < 0.6 else versions[max(versions)].replace("MODEL: a", "MODEL: b")
        fleets.append(Fleet(f"fleet-{number}", versions, tuple(rows), new, rng.choice(forecast_modes)))
    return fleets
