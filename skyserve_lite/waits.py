"""What the CLI waits for, and how it tells: a new service answering (`serve up`), a version rolled out
(`serve update`, `serve rollback`, `serve wait`), replicas gone (`serve down --replica-id`).

Each wait is a polling loop over ``Controller.get_status`` on an injected clock, and each asks a pure
function what the view it read means (``find_rollout_progress``), so the rules are tested as tables and
the loops with a scripted controller. The loops only read: a wait that stops (Ctrl-C, a timeout) changes
nothing, and the controller carries on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from skyserve_lite.api import ServiceView
from skyserve_lite.clock import Clock, SystemClock
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.defaults import LB_REFRESH_SECONDS
from skyserve_lite.endpoint_identity import EndpointIdentity, find_identity_problem, read_endpoint_identity
from skyserve_lite.errors import WaitTimeoutError
from skyserve_lite.plan.canary import CanaryPhase, CanarySettings
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, ServiceStatus


class StatusReader(Protocol):
    """The part of ``Controller`` that waiting needs."""

    def get_status(self, names: Sequence[str] = ()) -> list[ServiceView]:
        ...


def wait_until_ready(controller: StatusReader, name: str, timeout_seconds: float,
                     on_progress: Callable[[ServiceView], None] = lambda _view: None,
                     poll_seconds: float = 0.5,
                     ask_identity: Callable[[str], EndpointIdentity | str] = read_endpoint_identity,
                     clock: Clock | None = None) -> ServiceView:
    """Poll until the service can answer: READY, or scaled to zero (NO_REPLICA: the first request starts a
    replica), with its endpoint answering as this service's load balancer (``endpoint_identity``: the service's
    name and the view's ``controller_id``; a port that merely accepts connections is not enough). Raises
    ``WaitTimeoutError`` (with what is stuck and why) on timeout, and ``WaitTimeoutError`` too when the
    service became FAILED (waiting cannot help)."""
    clock = clock or SystemClock()
    deadline = clock.now() + timeout_seconds
    while True:
        (view,) = controller.get_status([name])
        on_progress(view)
        # READY in the store, and this service's load balancer answers at the endpoint: only then is it ready.
        answering = view.service.status in (ServiceStatus.READY, ServiceStatus.NO_REPLICA)
        problem = None
        if answering:
            endpoint = view.service.endpoint
            problem = find_identity_problem(ask_identity(endpoint), name, view.controller_id, endpoint)
            if problem is None:
                return view
        if view.service.status is ServiceStatus.FAILED:
            raise WaitTimeoutError(f"service {name} FAILED: {view.service.status_reason}. "
                                   f"See `sky-lite serve logs {name} REPLICA_ID`.")
        if clock.now() >= deadline:
            stuck = f"its replicas are, but {problem}" if problem is not None else describe_stuck(view)
            raise WaitTimeoutError(f"service {name} is not READY after {timeout_seconds:g}s: {stuck}")
        clock.sleep(poll_seconds)


def describe_stuck(view: ServiceView) -> str:
    """Which replica holds the service back, and why, in one sentence."""
    name = view.service.name
    live = [r for r in view.replicas if r.status.is_live]
    if not live:
        failed = [r for r in view.replicas if r.status.is_terminal]
        if failed:
            last = failed[-1]
            return (f"replica {last.replica_id} is {last.status.value} ({last.status_reason}); "
                    f"see `sky-lite serve logs {name} {last.replica_id}`")
        return (f"no replica launched yet (service status {view.service.status.value}); "
                f"see `sky-lite serve logs {name} --controller`")
    parts = []
    for r in live:
        reason = f": {r.status_reason}" if r.status_reason else ""
        parts.append(f"replica {r.replica_id} is {r.status.value}{reason}")
    return "; ".join(parts) + f" (see `sky-lite serve logs {name} {live[0].replica_id}`)"


class RolloutOutcome(str, Enum):
    IN_PROGRESS = "in_progress"
    DONE = "done"  # the version's replicas are READY at the target, and no older replica serves
    FAILED = "failed"  # the controller stopped launching the version (or the service FAILED)
    SUPERSEDED = "superseded"  # a newer version was submitted meanwhile


StatusCounts = tuple[tuple[ReplicaStatus, int], ...]


@dataclass(frozen=True)
class RolloutProgress:
    """Where the rollout of ``version`` stands, as one read of the service tells.

    ``target`` is None until the controller's first pass over the version has decided how many replicas it
    wants. ``new`` and ``old`` count the version's replicas and the older versions' (live or draining) by
    status. ``detail`` says what the rollout waits for, or why it failed or ended.
    """

    name: str
    version: int
    target: int | None
    ready: int
    new: StatusCounts
    old: StatusCounts
    outcome: RolloutOutcome
    detail: str

    def summary(self, elapsed_seconds: float) -> str:
        """The line a finished wait ends with: ``minimal: version 4 rolled out, 3/3 READY in 41s``."""
        return (f"{self.name}: version {self.version} rolled out, {self.ready}/{self.target} READY in "
                f"{elapsed_seconds:.0f}s")


def _count(replicas: Sequence[ReplicaRecord]) -> StatusCounts:
    counts: dict[ReplicaStatus, int] = {}
    for replica in replicas:
        counts[replica.status] = counts.get(replica.status, 0) + 1
    return tuple(sorted(counts.items(), key=lambda item: list(ReplicaStatus).index(item[0])))


def _which(replicas: Sequence[ReplicaRecord], limit: int = 3) -> str:
    ids = [str(r.replica_id) for r in replicas[:limit]]
    more = f" and {len(replicas) - limit} more" if len(replicas) > limit else ""
    return ("replica " if len(replicas) == 1 else "replicas ") + ", ".join(ids) + more


def find_rollout_progress(view: ServiceView, version: int) -> RolloutProgress:
    """What ``view`` says of the rollout of ``version``. Pure.

    Done: the controller has decided a target for the version, that many of its replicas are READY, and no
    replica of another version is live (draining ones are out of traffic already, so they are not waited
    for). Replicas reused for the version count as its own: an update that changed only the `service`
    section is done at the controller's first pass.
    """
    service = view.service
    name = service.name
    mine = [r for r in view.replicas if r.version == version]
    others = [r for r in view.replicas if r.version != version
              and (r.status.is_live or r.status is ReplicaStatus.SHUTTING_DOWN)]
    ready = sum(1 for r in mine if r.status is ReplicaStatus.READY)
    state = view.autoscaler[0] if view.autoscaler is not None else None
    target = None
    if state is not None and state.version == version:
        # What the controller steers to (num_overprovision included); an older host's view lacks it.
        target = view.target_replicas if view.target_replicas is not None else state.target

    def progress(outcome: RolloutOutcome, detail: str) -> RolloutProgress:
        return RolloutProgress(name=name, version=version, target=target, ready=ready,
                               new=_count([r for r in mine if not r.status.is_terminal]), old=_count(others),
                               outcome=outcome, detail=detail)

    canary = view.canary
    if canary is not None and canary.state.version == version:
        if canary.state.phase is CanaryPhase.ROLLED_BACK:  # its rollback is the next version: not superseded
            return progress(RolloutOutcome.FAILED, canary.state.verdict or f"version {version} rolled back")
        if not canary.state.is_done and service.current_version == version:
            which = "the watch" if canary.state.phase is CanaryPhase.WATCHING else "the canary"
            # Paused, nothing moves until a person decides: name the command, with this service's name.
            decide = (f"; a person decides: `sky-lite serve rollout {name} resume`, `promote` or `abort`"
                      if canary.state.paused else "")
            return progress(RolloutOutcome.IN_PROGRESS, f"{which}: {canary.describe()}{decide}")
    if service.current_version != version:
        return progress(RolloutOutcome.SUPERSEDED,
                        f"version {service.current_version} was submitted meanwhile; `sky-lite serve wait {name}` "
                        "follows it")
    failed = [r for r in mine if r.status.is_terminal]
    logs = f"`sky-lite serve logs {name} {failed[-1].replica_id}`" if failed else f"`sky-lite serve logs {name} " \
        "--controller`"
    # The controller gives the service a reason only when launching the current version stopped (its
    # replicas kept failing before READY): older replicas may still serve, but waiting cannot help. Until
    # its first pass over this version (no target yet) status and reason are still the previous version's.
    if target is not None and (service.status is ServiceStatus.FAILED or service.status_reason) \
            and not service.deleting:
        return progress(RolloutOutcome.FAILED, f"{service.status_reason or 'the service FAILED'} (see {logs})")
    if service.deleting:
        return progress(RolloutOutcome.FAILED, "the service is shutting down (`sky-lite serve down`)")
    old_live = [r for r in others if r.status.is_live]
    if target is not None and ready >= target and not old_live:
        return progress(RolloutOutcome.DONE, f"{ready}/{target} READY")
    return progress(RolloutOutcome.IN_PROGRESS, _waiting_for(mine, old_live, ready, target, version))


def _waiting_for(mine: Sequence[ReplicaRecord], old_live: Sequence[ReplicaRecord], ready: int, target: int | None,
                 version: int) -> str:
    """What holds the rollout back, in one phrase: the first of the version's replicas not READY yet (and
    why), the controller's next launch, or the older replicas still serving."""
    if target is None:
        return f"the controller's first pass over version {version}"
    starting = [r for r in mine if r.status.is_live and r.status is not ReplicaStatus.READY]
    if ready < target and starting:
        first = starting[0]
        why = f": {first.status_reason}" if first.status_reason else ""
        others = f" (and {len(starting) - 1} more)" if len(starting) > 1 else ""
        return f"replica {first.replica_id} to become READY, now {first.status.value}{why}{others}"
    if ready < target:
        live = sum(1 for r in mine if r.status.is_live)
        return f"the controller to launch {target - live} more of version {version}"
    return f"{_which(old_live)} of older versions to leave traffic"


# Beyond one load balancer refresh: its loop may run a little late on a busy machine.
LB_REFRESH_MARGIN_SECONDS = 0.25


# How long `update --wait` and `serve wait` wait when no --timeout is given: launching a version and its
# replicas becoming READY (a probe's initial delay alone may be 20 minutes with a slow model, but most take
# a few); a canary gets its bake windows on top (``compute_rollout_wait_seconds``).
DEFAULT_ROLLOUT_WAIT_SECONDS = 600.0


def compute_rollout_wait_seconds(settings: CanarySettings | None, *, watch: bool = False) -> float:
    """The default wait for a rollout: ``DEFAULT_ROLLOUT_WAIT_SECONDS``, and for a canary its longest course
    on top, every step's window extended as often as it may be (a paused one waits for a person, which no
    default covers). Steps 10,50, bake 2m, 3 extensions: 2 x (1 + 3) x 120 = 960 s of windows + 600 = 1560 s
    (26m), where 600 would time out a good canary whose windows are a little short of requests. A watched
    rolling or blue-green update (``watch``) has one such window."""
    if settings is None:
        return DEFAULT_ROLLOUT_WAIT_SECONDS
    steps = 1 if watch else len(settings.steps)
    return DEFAULT_ROLLOUT_WAIT_SECONDS + steps * (1 + max(0, settings.max_extensions)) * settings.bake_seconds


def find_rollout_wait_seconds(view: ServiceView, version: int | None) -> float:
    """The default wait for ``version`` (None: the current one) of the service ``view`` shows: a canary's
    longest course (``compute_rollout_wait_seconds``) while its rollout of that version is not over."""
    canary = view.canary
    if canary is None or canary.state.is_done or canary.state.version != (version or view.service.current_version):
        return DEFAULT_ROLLOUT_WAIT_SECONDS
    return compute_rollout_wait_seconds(canary.state.settings, watch=canary.state.phase is CanaryPhase.WATCHING)


def wait_for_rollout(controller: StatusReader, name: str, version: int | None, timeout_seconds: float,
                     on_progress: Callable[[RolloutProgress, ServiceView], None] = lambda _p, _v: None,
                     poll_seconds: float = 0.5, clock: Clock | None = None) -> RolloutProgress:
    """Poll until ``version`` (None: the service's current one) is rolled out; returns its last progress.

    Raises ``WaitTimeoutError`` naming what it waited for when the timeout passes, at once when the rollout
    failed (the controller stopped launching it) or was superseded by a newer version, and ``NotFoundError``
    (from the controller) for an unknown service."""
    clock = clock or SystemClock()
    deadline = clock.now() + timeout_seconds
    saw_old = False  # an older replica was live or draining at some poll of this wait
    while True:
        (view,) = controller.get_status([name])
        if version is None:
            version = view.service.current_version
        elif version > view.service.current_version:
            raise WaitTimeoutError(f"service {name} has no version {version} (its current version is "
                                   f"{view.service.current_version})")
        progress = find_rollout_progress(view, version)
        on_progress(progress, view)
        saw_old = saw_old or any(r.version < version and (r.status.is_live or r.status is ReplicaStatus.SHUTTING_DOWN)
                                 for r in view.replicas)
        if progress.outcome is RolloutOutcome.DONE:
            if saw_old:
                # Old replicas left traffic in the store during this wait (draining, or gone already); the
                # load balancer reads that within a refresh: wait for it, so that no request sent after the
                # wait returns reaches one.
                clock.sleep(LB_REFRESH_SECONDS + LB_REFRESH_MARGIN_SECONDS)
            return progress
        if progress.outcome is RolloutOutcome.FAILED:
            raise WaitTimeoutError(f"{name}: version {version} did not roll out: {progress.detail}")
        if progress.outcome is RolloutOutcome.SUPERSEDED:
            raise WaitTimeoutError(f"{name}: stopped waiting for version {version}: {progress.detail}")
        if clock.now() >= deadline:
            of = f"{progress.ready}/{progress.target} READY" if progress.target is not None else "not started"
            # Only the waiting stops: the controller carries on, and a person who reads "timed out" alone
            # may think the version was abandoned or retry the update on top of it.
            raise WaitTimeoutError(f"{name}: version {version} is not rolled out after {timeout_seconds:g}s "
                                   f"({of}); waiting for {progress.detail}; the rollout goes on; follow it "
                                   f"with `sky-lite serve wait {name}`")
        clock.sleep(poll_seconds)


def describe_termination(name: str, replica: ReplicaRecord) -> str:
    """What the wait for ``replica``'s termination (`serve down --replica-id`) waits for now, in one line
    naming the replica. Pure.

    The controller's next pass takes a live replica out of traffic (SHUTTING_DOWN), a pass at least
    ``SKY_LITE_DRAIN_SECONDS`` later terminates it, so that requests it has can finish, and the row goes
    once its instance is gone: with the defaults (a pass every 2 s, a drain of 10 s) about 12 to 16 s of
    waiting. The drain is the controller's setting, which this side cannot read (a controller host has an
    environment of its own), so it is named, not counted down."""
    which = f"Replica {replica.replica_id} of {name}"
    if replica.status is ReplicaStatus.SHUTTING_DOWN:
        return (f"{which} is draining (out of traffic); the controller terminates it SKY_LITE_DRAIN_SECONDS "
                f"({ControllerSettings.drain_seconds:g} s by default) after it left traffic, so that requests it "
                "has can finish...")
    return f"{which} is {replica.status.value}; waiting for the controller's next pass to take it out of traffic..."


def wait_until_replicas_gone(controller: StatusReader, name: str, replica_ids: Sequence[int],
                             timeout_seconds: float, poll_seconds: float = 0.5, clock: Clock | None = None,
                             on_progress: Callable[[Sequence[ReplicaRecord]], None] = lambda _left: None) -> None:
    """Poll until none of ``replica_ids`` is live or draining any more (terminated: the row is gone, or
    kept as a terminal record); ``on_progress`` gets the replicas left at each poll that finds some.
    Raises ``WaitTimeoutError`` naming those left."""
    clock = clock or SystemClock()
    deadline = clock.now() + timeout_seconds
    wanted = set(replica_ids)
    while True:
        (view,) = controller.get_status([name])
        left = [r for r in view.replicas if r.replica_id in wanted
                and (r.status.is_live or r.status is ReplicaStatus.SHUTTING_DOWN)]
        if not left:
            return
        on_progress(left)
        if clock.now() >= deadline:
            states = ", ".join(f"{r.replica_id} {r.status.value}" for r in left)
            raise WaitTimeoutError(f"{name}: still terminating after {timeout_seconds:g}s: replica {states}; the "
                                   f"controller keeps working on it (see `sky-lite serve logs {name} --controller`)")
        clock.sleep(poll_seconds)
