"""The provider interface: the only way the controller touches machines.

Four calls that act, one that reads and one for a lost state, the same for every cloud:

- ``launch(requests)`` starts one instance per request and says, per request, what happened;
- ``list_instances()`` reports every instance this controller owns, whatever state it is in;
- ``terminate(instance_ids)`` stops instances;
- ``release_service(service)`` drops what a provider kept for a service once it has no instance left;
- ``read_log(...)`` finds a replica's output, for `serve logs`;
- ``abandon()`` stops what only the provider side can still find, once the state that records it is gone.

Instances carry the service, replica id and version they were launched for (as cloud tags, or in the
local provider's metadata files), so the controller can adopt an instance launched just before a crash
and terminate one that no replica row claims. Providers hold no replica state of their own.

Errors: every method raises only ``ProviderError`` subclasses, ``TransientProviderError`` (a later pass
may succeed: throttling, a busy API, a full disk) or ``PermanentProviderError`` (retrying will not help:
no credentials, a missing profile). Each provider translates its vendor's exceptions (botocore's,
``OSError``) in one place, at its boundary, so one cloud's failure is one ``ProviderError`` that the
controller records and the pass goes on.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol

from skyserve_lite.spec.model import Pairs, Secret, TaskSpec


class InstanceState(str, Enum):
    PENDING = "pending"  # asked for, not yet running
    RUNNING = "running"  # running; the workload may or may not answer yet
    EXITED = "exited"  # the workload stopped on its own (local: the process exited)
    PREEMPTED = "preempted"  # the cloud took a spot instance back
    TERMINATED = "terminated"  # stopped on purpose, or gone


class Phase(str, Enum):
    """Which of the task's commands a running instance is in, where the provider can tell (local)."""

    SETUP = "setup"
    RUN = "run"


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
    # The version's files come with ``spec.files`` (its snapshot, taken when it was submitted): providers
    # never read the submitter's disk.
    # The values of ``spec.secrets``, read from the secret store for this launch only.
    secrets: tuple[tuple[str, Secret], ...] = ()

    @property
    def envs(self) -> Pairs:
        """Every variable the task names for its replicas: ``envs``, then its secrets' values."""
        return (*self.spec.envs, *((name, secret.value) for name, secret in self.secrets))


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
    instance_type: str | None = None  # what it was launched as, when the launch said
    accelerator: str | None = None  # its accelerators ("A100:8"), when the launch said
    phase: Phase | None = None  # running `setup` or `run`; None where the provider cannot tell (clouds)


@dataclass(frozen=True)
class LaunchOutcome:
    """What became of one ``LaunchRequest``: an instance, or an error.

    ``permanent`` errors (bad image, no permission) fail the replica; others are retried on a later pass.
    """

    replica_id: int
    instance: Instance | None = None
    error: str | None = None
    permanent: bool = False
    no_capacity: bool = False  # no zone of the placement tried had capacity: the next placement may


@dataclass(frozen=True)
class ReplicaLog:
    """Where a replica's output is: ``path``, a file that grows while the replica runs (so it can be
    followed), or ``text``, a snapshot (an EC2 instance's console output as the cloud last captured it)."""

    path: Path | None = None
    text: str | None = None


class Provider(Protocol):
    """A place to run replicas. Implementations: ``fake``, ``local``, ``aws``, and ``emulation`` around a
    cloud; each is a peer of the others."""

    name: str

    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        """Start one instance per request; return one outcome per request, in order.

        Idempotent per (service, replica_id, launch_token): a request whose instance exists already
        returns that instance. Errors of single requests come back as outcomes (``permanent`` when the
        request itself is at fault, naming its field: ``file_mounts./data``), and a failed request leaves
        no instance behind that the inventory would report running. The call raises ``ProviderError``
        only when nothing could be attempted (no credentials, an unreadable inventory).
        """
        ...

    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        """Every instance of this controller that is not yet terminated and forgotten.

        ``regions`` names every region this controller has a replica or a service in (clouds list one page
        set per region); providers without regions ignore it. Raises ``TransientProviderError`` when the
        inventory cannot be read now, ``PermanentProviderError`` when it never will be as configured; the
        controller then skips decisions that depend on it for this pass.
        """
        ...

    def find_instances(self, instance_ids: Sequence[str], regions: Collection[str] = ()) -> list[Instance]:
        """Look these instances up by id, not through the listing: the controller asks for replicas whose
        instance ``list_instances`` did not return, since a cloud's listing can lag its launches (EC2's does).
        Returns those found, in any state (terminated included); an unknown id is simply absent. Raises
        ``ProviderError`` when the lookup cannot be made; the controller then decides from the listing alone.
        """
        ...

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Stop these instances. Idempotent: unknown or already-stopped ids are ignored.

        Raises ``ProviderError`` when some could not be stopped; the next pass asks again.
        """
        ...

    def release_service(self, service: str) -> None:
        """Drop what is kept for a service that has no instance left (files, buckets). Idempotent: a
        service with nothing kept is fine. Raises ``ProviderError`` when something is left; the caller
        keeps the service and asks again on a later pass."""
        ...

    def read_log(self, service: str, replica_id: int, instance_id: str | None,
                 region: str | None) -> ReplicaLog | None:
        """The output of replica ``replica_id`` of ``service`` (its instance and region as the controller
        recorded them, None when unknown). Reads only; None means "no log": no such replica here, or
        nothing captured yet. Raises ``ProviderError`` when it cannot be looked for (transient: a busy API, a
        disk error; permanent: no credentials)."""
        ...

    def abandon(self) -> None:
        """The state that records this provider's instances is gone (the state directory was deleted):
        stop whatever only the provider side can still find, whichever controller started it (local: every
        replica process tagged with a directory below the provider's, from the process table, not only the
        processes this object spawned, since the controller may have restarted since). Instances others can
        find (a cloud's, by their tags) are left alone. Idempotent; raises ``ProviderError`` when something
        could not be stopped."""
        ...
