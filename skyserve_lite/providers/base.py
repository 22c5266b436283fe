"""The provider interface: the only way the controller touches machines.

Three calls and a clean-up, the same for every cloud:

- ``launch(requests)`` starts one instance per request and says, per request, what happened;
- ``list_instances()`` reports every instance this controller owns, whatever state it is in;
- ``terminate(instance_ids)`` stops instances;
- ``release_service(service)`` drops what a provider kept for a service once it has no instance left.

Instances carry the service, replica id and version they were launched for (as cloud tags, or in the
local provider's metadata files), so the controller can adopt an instance launched just before a crash
and terminate one that no replica row claims. Providers hold no replica state of their own.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from skyserve_lite.spec.model import TaskSpec


class InstanceState(str, Enum):
    PENDING = "pending"  # asked for, not yet running
    RUNNING = "running"  # running; the workload may or may not answer yet
    EXITED = "exited"  # the workload stopped on its own (local: the process exited)
    PREEMPTED = "preempted"  # the cloud took a spot instance back
    TERMINATED = "terminated"  # stopped on purpose, or gone


@dataclass(frozen=True)
class LaunchRequest:
    """One instance to start for one replica.

    ``launch_token`` is the same for every request of one batch and stable across retries of that batch
    (a cloud's idempotency token), so retrying after a crash cannot start the instance twice.
    """

    service: str
    replica_id: int
    version: int
    spec: TaskSpec
    launch_token: str
    is_spot: bool
    # Directory of the submitted task file: relative `workdir` and `file_mounts` sources resolve here.
    source_dir: str | None = None


@dataclass(frozen=True)
class Instance:
    """What a provider observes of one instance."""

    instance_id: str
    service: str
    replica_id: int
    version: int
    state: InstanceState
    url: str | None = None  # where the workload answers, once known
    region: str | None = None
    zone: str | None = None
    is_spot: bool = False
    detail: str | None = None  # why it is in this state: exit code, state reason


@dataclass(frozen=True)
class LaunchOutcome:
    """What became of one ``LaunchRequest``: an instance, or an error.

    ``permanent`` errors (bad image, no permission) fail the replica; others are retried on a later pass.
    """

    replica_id: int
    instance: Instance | None = None
    error: str | None = None
    permanent: bool = False


class Provider(Protocol):
    """A place to run replicas. Implementations: ``fake``, ``local``; clouds are peers of these."""

    name: str

    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        """Start one instance per request; return one outcome per request, in order.

        Idempotent per (service, replica_id, launch_token): a request whose instance exists already
        returns that instance. Errors of single requests come back as outcomes; the call raises
        ``ProviderError`` only when nothing could be attempted.
        """
        ...

    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        """Every instance of this controller that is not yet terminated and forgotten.

        ``regions`` names every region this controller has a replica or a service in (clouds list one page
        set per region); providers without regions ignore it. Raises ``TransientProviderError`` when the
        inventory cannot be read; the controller then skips decisions that depend on it for this pass.
        """
        ...

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Stop these instances. Idempotent: unknown or already-stopped ids are ignored."""
        ...

    def release_service(self, service: str) -> None:
        """Drop what is kept for a service that has no instance left (files, buckets). Idempotent."""
        ...
