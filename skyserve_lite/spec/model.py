"""Typed, immutable values for a task YAML after parsing and defaulting.

Mappings from the YAML (``envs``, ``file_mounts``, ``labels``, probe ``headers``) are kept as tuples of
``(key, value)`` pairs sorted by key, so that every value here is hashable and two equal documents give
equal values whatever the key order in the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from skyserve_lite.files.manifest import TaskFiles

Pairs = tuple[tuple[str, str], ...]

# Defaults a SkyServe user expects.
DEFAULT_PROBE_PATH = "/"
DEFAULT_INITIAL_DELAY_SECONDS = 1200
DEFAULT_PROBE_TIMEOUT_SECONDS = 15
DEFAULT_UPSCALE_DELAY_SECONDS = 300
DEFAULT_DOWNSCALE_DELAY_SECONDS = 1200


class Cloud(str, Enum):
    LOCAL = "local"
    AWS = "aws"
    GCP = "gcp"


class LoadBalancingPolicy(str, Enum):
    ROUND_ROBIN = "round_robin"
    LEAST_LOAD = "least_load"


@dataclass(frozen=True)
class Resources:
    cloud: Cloud = Cloud.LOCAL
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    image_id: str | None = None
    use_spot: bool = False
    disk_size: int | None = None
    ports: tuple[int, ...] = ()
    labels: Pairs = ()


@dataclass(frozen=True)
class ReadinessProbe:
    path: str = DEFAULT_PROBE_PATH
    # Canonical JSON text (sorted keys, no spaces) of the body to POST; None means GET.
    post_data: str | None = None
    initial_delay_seconds: int = DEFAULT_INITIAL_DELAY_SECONDS
    timeout_seconds: float = float(DEFAULT_PROBE_TIMEOUT_SECONDS)
    headers: Pairs = ()


@dataclass(frozen=True)
class ReplicaPolicy:
    min_replicas: int = 1
    max_replicas: int = 1
    target_qps_per_replica: float | None = None
    target_ongoing_requests_per_replica: float | None = None
    upscale_delay_seconds: int = DEFAULT_UPSCALE_DELAY_SECONDS
    downscale_delay_seconds: int = DEFAULT_DOWNSCALE_DELAY_SECONDS
    base_ondemand_fallback_replicas: int = 0
    dynamic_ondemand_fallback: bool = False

    @property
    def is_autoscaling(self) -> bool:
        return self.target_qps_per_replica is not None or self.target_ongoing_requests_per_replica is not None

    def describe(self) -> str:
        """One line for `serve status`.

        ``Fixed 2 replicas`` or ``Autoscaling 1-3 replicas (2 qps/replica)``.
        """
        if not self.is_autoscaling:
            noun = "replica" if self.min_replicas == 1 else "replicas"
            return f"Fixed {self.min_replicas} {noun}"
        if self.target_qps_per_replica is not None:
            per_replica = f"{self.target_qps_per_replica:g} qps/replica"
        else:
            per_replica = f"{self.target_ongoing_requests_per_replica:g} in-flight requests/replica"
        return f"Autoscaling {self.min_replicas}-{self.max_replicas} replicas ({per_replica})"


@dataclass(frozen=True)
class ServiceSpec:
    readiness_probe: ReadinessProbe = field(default_factory=ReadinessProbe)
    replica_policy: ReplicaPolicy = field(default_factory=ReplicaPolicy)
    # The port the workload listens on for cloud replicas; the local provider assigns its own ($PORT).
    port: int | None = None
    load_balancing_policy: LoadBalancingPolicy = LoadBalancingPolicy.LEAST_LOAD


@dataclass(frozen=True)
class TaskSpec:
    run: str
    service: ServiceSpec
    name: str | None = None
    resources: Resources = field(default_factory=Resources)
    envs: Pairs = ()
    workdir: str | None = None
    file_mounts: Pairs = ()
    setup: str | None = None
    # The snapshot of `workdir` and the local `file_mounts` sources taken when the task was submitted (not
    # part of the YAML): what every replica of the version runs. None before capture, or with nothing local.
    files: TaskFiles | None = None


@dataclass(frozen=True)
class SubmittedTask:
    """A task as the user submitted it: the exact text, where it came from, and its parsed form."""

    text: str
    source: str
    spec: TaskSpec
