"""The life of one replica: given its row, what the provider sees and the last probe, what next. Pure.

::

    PROVISIONING --instance running--> STARTING --probe 200--> READY <--probe 200-- NOT_READY
         |                                 |                     |--probe fails-->     |
         | no instance after timeout        | no 200 within          failing longer than the grace
         v                                 v  initial_delay_seconds                    v
    FAILED_PROVISION              FAILED_INITIAL_DELAY                         FAILED_PROBING

    any live status --workload exited--> FAILED;  --spot taken back--> PREEMPTED
    SHUTTING_DOWN --drained--> terminated --instance gone--> (row removed)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.providers.base import Instance, InstanceState, Phase
from skyserve_lite.spec.model import ReadinessProbe
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, replace_replica


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    detail: str  # "HTTP 200", "HTTP 503", "connection refused", "timed out after 15s"


class ReplicaStep(NamedTuple):
    """The decision for one replica in one pass.

    ``record`` is the row as it should be after the pass (the same object when nothing changed).
    ``terminate`` asks for the instance to be stopped; ``remove`` drops the row; ``relaunch`` asks the
    provider again for a replica whose launch was recorded but never confirmed. A named tuple (changed with
    ``_replace``), not a frozen dataclass: a pass makes one per replica, and a tuple is made five times
    faster.
    """

    record: ReplicaRecord
    terminate: bool = False
    remove: bool = False
    relaunch: bool = False
    event: str | None = None


def plan_replica(replica: ReplicaRecord, instance: Instance | None, probe: ProbeResult | None,
                 readiness: ReadinessProbe, now: float, settings: ControllerSettings) -> ReplicaStep:
    """Decide the next step of one replica. ``instance`` is None when the inventory has no instance for it.

    Only call this with a complete inventory of the replica's cloud: "no instance" must mean "gone".
    """
    if (replica.status is ReplicaStatus.READY and probe is not None and probe.ok and instance is not None
            and instance.state is InstanceState.RUNNING and replica.seen_at is not None
            and replica.instance_id is not None and instance.url == replica.url):
        # The steady case, every READY replica of every pass (10,000 a pass at fleet scale): what the rules
        # below conclude for it, nothing to change, without walking them.
        return ReplicaStep(replica)
    maybe_unlisted = is_maybe_unlisted(replica, now, settings)
    if replica.instance_id is None and instance is not None:
        # Launched just before a crash (or its confirmation was lost): the instance carries our tags, so
        # adopt it, whatever the replica's status; a replica going away must be able to terminate it.
        replica = replace_replica(replica, instance_id=instance.instance_id, region=instance.region,
                                  zone=instance.zone)
    if instance is not None and replica.seen_at is None and instance.state is not InstanceState.TERMINATED:
        replica = replace_replica(replica, seen_at=now)
    if replica.status is ReplicaStatus.SHUTTING_DOWN:
        if instance is None and maybe_unlisted:
            # Launched moments ago: the inventory may simply not list it yet. Keep the row (so the launch
            # is not forgotten) and ask again by id, until the grace has passed.
            return ReplicaStep(replica, terminate=replica.instance_id is not None)
        if _is_gone(instance):
            return ReplicaStep(replica, remove=True, event="terminated")
        # Out of the load balancer's view since status_since; requests already sent get time to finish.
        return ReplicaStep(replica, terminate=now - replica.status_since >= settings.drain_seconds)
    if replica.status.is_terminal:
        # Asked once when the replica failed; asked again only while the instance still runs somewhere.
        return ReplicaStep(replica, terminate=not _is_gone(instance))

    if replica.instance_id is None:
        assert instance is None  # adopted above otherwise
        if now - replica.launched_at > settings.provision_timeout_seconds:
            return _fail(replica, ReplicaStatus.FAILED_PROVISION, now,
                         f"no instance after {settings.provision_timeout_seconds:g}s")
        return ReplicaStep(replica, relaunch=True)

    if instance is None and maybe_unlisted:
        # RunInstances returned it, the inventory does not list it yet (eventual consistency): wait.
        reason = "launched; the cloud's inventory does not list the instance yet"
        if replica.status_reason != reason and replica.status is ReplicaStatus.PROVISIONING:
            return ReplicaStep(replace_replica(replica, status_reason=reason))
        return ReplicaStep(replica)
    if instance is None or instance.state is InstanceState.TERMINATED:
        return _fail(replica, ReplicaStatus.FAILED, now, "the instance disappeared")
    if instance.state is InstanceState.PREEMPTED:
        return _fail(replica, ReplicaStatus.PREEMPTED, now, instance.detail or "preempted by the cloud")
    if instance.state is InstanceState.EXITED:
        detail = f" ({instance.detail})" if instance.detail else ""
        return _fail(replica, ReplicaStatus.FAILED, now, f"the workload exited{detail}")
    if instance.state is InstanceState.PENDING:
        if now - replica.launched_at > settings.provision_timeout_seconds:
            return _fail(replica, ReplicaStatus.FAILED_PROVISION, now,
                         f"instance not running after {settings.provision_timeout_seconds:g}s")
        return _changed(replica, ReplicaStatus.PROVISIONING, now)

    # RUNNING from here on.
    if replica.status in (ReplicaStatus.PENDING, ReplicaStatus.PROVISIONING):
        replica = replace_replica(replica, status=ReplicaStatus.STARTING, status_since=now,
                                  url=instance.url, status_reason=None)
        if probe is None:
            return ReplicaStep(replica, event="instance running, waiting for the readiness probe")
    elif instance.url != replica.url:
        replica = replace_replica(replica, url=instance.url)
    return _apply_probe(replica, probe, readiness, now, settings, instance.phase)


SETUP_REASON = "running setup"
_WAITING = "running, waiting for the readiness probe"


def compute_starting_reason(phase: Phase | None, url: str | None, probe_detail: str) -> str:
    """Why a STARTING replica is not READY, as stored: stable while nothing changes (the seconds are added
    when it is shown, ``describe_starting``), so a replica waiting out its setup costs no write per pass.

    During ``setup`` the probe's failure is expected and not shown; after ``run`` started, a probe that
    cannot connect most often means the workload listens on another port than ``$PORT``."""
    if phase is Phase.SETUP:
        return SETUP_REASON
    if phase is None:
        return probe_detail  # the provider cannot tell the phase (a cloud VM): the probe's own words
    port = url.rpartition(":")[2].rstrip("/") if url else ""
    hint = f" (the workload must listen on $PORT, {port})" if probe_detail.startswith("cannot connect") else ""
    return f"{_WAITING} on :{port}; {probe_detail}{hint}"


def describe_starting(reason: str | None, waited_seconds: float, initial_delay_seconds: float) -> str | None:
    """A STARTING replica's stored reason with its time: ``running setup (12s)``, ``running, waiting for the
    readiness probe on :8080 (8s of 1200s); cannot connect: ...``. The seconds count from when it became
    STARTING, as the initial delay does."""
    waited = f"{waited_seconds:.0f}s"
    if reason == SETUP_REASON:
        return f"{reason} ({waited})"
    if reason is not None and reason.startswith(_WAITING):
        head, sep, tail = reason.partition("; ")
        return f"{head} ({waited} of {initial_delay_seconds:g}s){sep}{tail}"
    return reason


def is_maybe_unlisted(replica: ReplicaRecord, now: float, settings: ControllerSettings) -> bool:
    """Whether a missing instance of ``replica`` may simply not be listed yet: no inventory has listed it
    (``seen_at``) and its launch is younger than the visibility grace (120 s by default)."""
    return replica.seen_at is None and now - replica.launched_at < settings.instance_visibility_grace_seconds


def _apply_probe(replica: ReplicaRecord, probe: ProbeResult | None, readiness: ReadinessProbe,
                 now: float, settings: ControllerSettings, phase: Phase | None = None) -> ReplicaStep:
    if probe is None:
        return ReplicaStep(replica)
    status = replica.status
    if probe.ok:
        if status is ReplicaStatus.READY:
            return ReplicaStep(replica)
        ready = replace_replica(
            replica, status=ReplicaStatus.READY, status_since=now, probe_failing_since=None,
            first_ready_at=replica.first_ready_at if replica.first_ready_at is not None else now,
            status_reason=None)
        return ReplicaStep(ready, event="ready")
    if status is ReplicaStatus.STARTING:
        waited = now - replica.status_since
        if waited > readiness.initial_delay_seconds:
            return _fail(replica, ReplicaStatus.FAILED_INITIAL_DELAY, now,
                         f"not ready within initial_delay_seconds={readiness.initial_delay_seconds} "
                         f"(last probe: {probe.detail})")
        reason = compute_starting_reason(phase, replica.url, probe.detail)
        if replica.status_reason != reason:
            return ReplicaStep(replace_replica(replica, status_reason=reason))
        return ReplicaStep(replica)
    if status is ReplicaStatus.READY:
        not_ready = replace_replica(replica, status=ReplicaStatus.NOT_READY, status_since=now,
                                    probe_failing_since=now, status_reason=probe.detail)
        return ReplicaStep(not_ready, event=f"probe failed: {probe.detail}")
    failing_since = replica.probe_failing_since if replica.probe_failing_since is not None else now
    if now - failing_since > settings.probe_failure_grace_seconds:
        return _fail(replica, ReplicaStatus.FAILED_PROBING, now,
                     f"probe failing for {now - failing_since:.0f}s (last: {probe.detail})")
    return ReplicaStep(replace_replica(replica, probe_failing_since=failing_since,
                                       status_reason=probe.detail))


def _is_gone(instance: Instance | None) -> bool:
    """No instance to wait for: none at all, terminated, or taken back by the cloud (a preempted instance
    was asked to terminate when its replica became PREEMPTED; the cloud has finished it)."""
    return instance is None or instance.state in (InstanceState.TERMINATED, InstanceState.PREEMPTED)


def _fail(replica: ReplicaRecord, status: ReplicaStatus, now: float, reason: str) -> ReplicaStep:
    failed = replace_replica(replica, status=status, status_since=now, status_reason=reason)
    return ReplicaStep(failed, terminate=True, event=f"{status.value}: {reason}")


def _changed(replica: ReplicaRecord, status: ReplicaStatus, now: float) -> ReplicaStep:
    if replica.status is status:
        return ReplicaStep(replica)
    return ReplicaStep(replace_replica(replica, status=status, status_since=now))
