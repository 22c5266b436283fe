"""The values a controller pass reads (snapshots, observations) and produces (``PassPlan``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.controller.replica_rules import ProbeResult
from skyserve_lite.plan.canary import CanaryState, Command
from skyserve_lite.plan.rollout import UpdateMode
from skyserve_lite.providers.base import Instance
from skyserve_lite.spec.model import ReadinessProbe, TaskSpec
from skyserve_lite.state.models import (
    AutoscalerObservation,
    ReplicaRecord,
    ServiceRecord,
    ServiceStatus,
    StoredCanary,
)

ReplicaKey = tuple[str, int]  # (service, replica_id)


@dataclass(frozen=True)
class ServiceLoad:
    """What the store says of a service's load at the start of a pass: the request window's count, and what
    the load balancer reported if its report is fresh. No clock reading in it: the autoscaler's ``Metrics``
    are these with the pass's time, so that a snapshot read again over unchanged rows equals the last one."""

    requests_in_window: int = 0
    window_seconds: float = 60.0
    waiting_requests: int = 0  # requests the load balancer holds because no replica is READY
    ongoing_requests_by_url: tuple[tuple[str, int], ...] = ()  # in-flight requests, as reported, by replica url


@dataclass(frozen=True)
class ServiceSnapshot:
    """A service as the store holds it at the start of a pass.

    Values only, no clock reading: a pass that reads the very same rows of a service as the last pass did is
    handed the last pass's snapshot (``snapshots.read_snapshot``), and what is derived from it (the
    ``cached_property`` values) is kept with it."""

    service: ServiceRecord
    versions: Mapping[int, TaskSpec]  # the current version and every version a replica runs
    replicas: tuple[ReplicaRecord, ...]
    lb_alive: bool
    mode: UpdateMode = UpdateMode.ROLLING  # how the current version rolls out
    autoscaler: AutoscalerState | None = None  # None before the first decision
    observed: AutoscalerObservation | None = None
    load: ServiceLoad | None = None  # the request window and the load balancer's report; None: nothing yet
    # The current version's update reuses replicas whose files are identical (`--reuse-identical-files`).
    reuse_identical_files: bool = False
    # Replicas an operator asked to terminate (`serve down NAME --replica-id N`) and not yet acted on.
    terminate_requested: frozenset[int] = frozenset()
    # A canary rollout (mode canary): as stored (None: not started yet), and what the load balancers counted
    # per version and status class since its bake window started (empty before it started).
    canary: StoredCanary | None = None
    canary_counts: Mapping[int, Mapping[str, int]] = field(default_factory=dict)

    @property
    def spec(self) -> TaskSpec:
        return self.versions[self.service.current_version]

    @cached_property
    def readiness_probes(self) -> Mapping[int, ReadinessProbe]:
        """The readiness probe of each version in ``versions``."""
        return {version: spec.service.readiness_probe for version, spec in self.versions.items()}

    @cached_property
    def regions(self) -> tuple[tuple[str, str | None], ...]:
        """(cloud, region) of every candidate of every version in ``versions``: where its replicas may run."""
        return tuple({(spec.cloud.value, c.region): None for spec in self.versions.values()
                      for c in spec.resource_candidates})


@dataclass(frozen=True)
class Observation:
    """What the providers and probes reported at the start of a pass.

    ``instances`` holds only clouds whose inventory was read (``known_clouds``); decisions about replicas
    of any other cloud wait for a pass that can see them.
    """

    # The instances each cloud listed, by cloud: no (cloud, instance) pair per instance, 50,000 of them a
    # pass at fleet scale.
    instances: Mapping[str, Sequence[Instance]] = field(default_factory=dict)
    known_clouds: frozenset[str] = frozenset()
    probes: Mapping[ReplicaKey, ProbeResult] = field(default_factory=dict)


class ProbeTarget(NamedTuple):
    """One replica to probe. A named tuple, not a dataclass: a pass makes one per live replica (10,000 at
    fleet scale), and a tuple is made five times faster."""

    service: str
    replica_id: int
    url: str
    probe: ReadinessProbe


@dataclass(frozen=True)
class LaunchBatch:
    """Launch ``count`` new replicas of ``version``, plus re-send unconfirmed launches in ``retry``.

    ``specs`` holds the task of ``version`` and of every retried row's version, as the pass read them: the
    executor launches those, without reading (and parsing) the versions again."""

    service: str
    version: int
    cloud: str
    is_spot: bool
    count: int
    retry: tuple[ReplicaRecord, ...] = ()
    specs: Mapping[int, TaskSpec] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Event:
    """One decision or outcome of a pass, as `serve status` shows it and the controller's log says it
    (``warning``: a failure, logged at WARNING rather than INFO)."""

    service: str
    replica_id: int | None
    kind: str
    message: str
    warning: bool = False


class Termination(NamedTuple):
    """One instance to terminate, with the service it belongs to: the executor re-checks that service's
    lease just before the cloud call (a pass paused after planning must not terminate for a service it
    lost). A named tuple: orphans of 50,000 instances may be listed in one pass."""

    service: str
    cloud: str
    instance_id: str


@dataclass(frozen=True)
class CanaryUpdate:
    """Store a service's canary rollout as decided (``done_command``: the person's command acted on)."""

    service: str
    state: CanaryState
    percent: int
    done_command: Command | None = None


@dataclass(frozen=True)
class Rollback:
    """Make a copy of ``to_version`` (text, inputs and files as stored) the service's next version, with
    ``note``: a canary judged bad. Only while ``from_version`` is still the current version."""

    service: str
    from_version: int
    to_version: int
    note: str


@dataclass(frozen=True)
class PassPlan:
    replica_updates: tuple[ReplicaRecord, ...] = ()
    removals: tuple[ReplicaKey, ...] = ()
    terminations: tuple[Termination, ...] = ()
    launches: tuple[LaunchBatch, ...] = ()
    start_lbs: tuple[str, ...] = ()
    stop_lbs: tuple[tuple[str, int], ...] = ()  # (service, pid)
    lb_policy_changes: tuple[tuple[str, str], ...] = ()  # (service, policy)
    status_changes: tuple[tuple[str, ServiceStatus, str | None], ...] = ()
    deletions: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()
    active_version_changes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    autoscaler_updates: tuple[tuple[str, AutoscalerState, AutoscalerObservation], ...] = ()
    # Operator requests to terminate a replica that this plan carries out (or that no live replica is left
    # for): the executor forgets them once the rest of the plan is stored.
    requests_done: tuple[ReplicaKey, ...] = ()
    canary_updates: tuple[CanaryUpdate, ...] = ()
    rollbacks: tuple[Rollback, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not any(getattr(self, f.name) for f in dataclasses.fields(self))


EMPTY_PLAN = PassPlan()  # a plan that decides nothing; planners return this one rather than a new one
