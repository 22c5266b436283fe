"""What every cloud provider does the same way, whatever its API: batches, adoption, zone fallback.

A cloud provider (``aws``, and the next peers) is translation between this model and its API:

- ``plan_launch_groups`` splits a ``launch`` call's requests into batches one API call can start: the same
  service, version, launch token, region, zone and market, and no more than the cloud's own limit
  (``fits``: AWS's 256-character tag of replica ids, say);
- ``launch_in_batches`` is the whole of ``Provider.launch``: requests without a region are refused, the
  instances an earlier attempt of the same launch token started are adopted (``BatchCloud.find_launched``,
  one lookup per region), and only the rest is launched, batch by batch, one batch's failure its own;
- ``launch_across_zones`` tries a zoneless batch in the region's zones in order, moving on when a zone has
  no capacity (``ZoneCapacityError``) and saying in each instance's ``detail`` which zones had none;
- and across placements: a request's placements (``placements_of``: the candidates its version resolved
  to, in order) are tried one after the other, a request moving to the next only when no zone of the one
  before had capacity; the instance's ``detail`` says which it landed on and what had no capacity.

Everything here is pure but for the calls into ``BatchCloud`` and the ``launch_in`` callback.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from skyserve_lite.errors import ProviderError, TransientProviderError
from skyserve_lite.providers.base import Instance, LaunchOutcome, LaunchRequest
from skyserve_lite.spec.placement import Placement


class ZoneCapacityError(TransientProviderError):
    """The zone asked for has no capacity for this request; another zone may have some. ``code`` is the
    cloud's own name for it (``InsufficientInstanceCapacity``, ``ZONE_RESOURCE_POOL_EXHAUSTED``)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class LaunchGroup:
    """Requests that one launch call can start: same service, version, token, placement, market."""

    region: str
    zone: str | None  # None: any zone of the region
    is_spot: bool
    requests: tuple[LaunchRequest, ...]
    placement: Placement  # the machine to launch: type, image, disk

    @property
    def first(self) -> LaunchRequest:
        return self.requests[0]

    @property
    def replica_ids(self) -> tuple[int, ...]:
        return tuple(r.replica_id for r in self.requests)

    @property
    def market(self) -> str:
        return "spot" if self.is_spot else "on-demand"


def placements_of(request: LaunchRequest, default_region: str | None) -> tuple[Placement, ...]:
    """The placements to try for ``request``, in order: those its version resolved for its market, else (a
    version stored before placements were) one made of the task's own fields. A placement without a region
    takes ``default_region`` (still None when there is none)."""
    resolution = request.spec.resolution
    placements = resolution.for_market(request.is_spot) if resolution is not None else ()
    if not placements:
        res = request.spec.resources
        placements = (Placement(cloud=request.spec.cloud.value, region=res.region, zone=res.zone,
                                instance_type=res.instance_type, image=res.image_id, disk_size=res.disk_size,
                                need=res.describe_need()),)
    return tuple(dataclasses.replace(p, region=p.region or default_region, is_spot=request.is_spot)
                 for p in placements)


def plan_launch_groups(requests: Sequence[LaunchRequest], default_region: str | None,
                       fits: Callable[[Sequence[LaunchRequest]], bool] = lambda _batch: True,
                       attempt: int = 0) -> list[LaunchGroup]:
    """Batches of ``requests`` at their placement number ``attempt`` (0: the first), in first-seen order,
    each one that ``fits`` says one call can start (a batch of one always can). Requests without a region
    there (none in the task, no default) or without that many placements are left out; the caller reports
    them."""
    keyed: dict[tuple[str, int, str, Placement], list[LaunchRequest]] = defaultdict(list)
    for request in requests:
        placements = placements_of(request, default_region)
        if attempt < len(placements) and placements[attempt].region is not None:
            keyed[(request.service, request.version, request.launch_token, placements[attempt])].append(request)
    groups = []
    for (_, _, _, placement), members in keyed.items():
        assert placement.region is not None
        chunk: list[LaunchRequest] = []
        for request in members:
            if chunk and not fits([*chunk, request]):
                groups.append(LaunchGroup(placement.region, placement.zone, placement.is_spot, tuple(chunk),
                                          placement))
                chunk = []
            chunk.append(request)
        groups.append(LaunchGroup(placement.region, placement.zone, placement.is_spot, tuple(chunk), placement))
    return groups


class BatchCloud(Protocol):
    """What ``launch_in_batches`` needs of a cloud."""

    def find_launched(self, region: str, tokens: Collection[str]) -> dict[tuple[str, int, str], Instance]:
        """Instances in ``region`` launched with one of ``tokens``, by (service, replica id, token), any state
        but gone. Raises ``ProviderError``."""
        ...

    def launch_group(self, group: LaunchGroup) -> list[LaunchOutcome]:
        """Start one batch; an outcome per request, in order. Never raises: a failure is the outcomes'."""
        ...


def launch_in_batches(cloud: BatchCloud, requests: Sequence[LaunchRequest], default_region: str | None, *,
                      fits: Callable[[Sequence[LaunchRequest]], bool], no_region: str) -> list[LaunchOutcome]:
    """``Provider.launch`` of a batching cloud (see the module docstring); an outcome per request, in order.
    ``no_region`` is the error of a request with no region (naming the setting that gives one)."""
    outcomes: dict[tuple[str, int], LaunchOutcome] = {}
    by_region: dict[str, list[LaunchRequest]] = defaultdict(list)
    for request in requests:
        regions = [p.region for p in placements_of(request, default_region)]
        if regions[0] is None:
            outcomes[_key(request)] = LaunchOutcome(request.replica_id, permanent=True, error=no_region)
            continue
        for region in dict.fromkeys(r for r in regions if r is not None):
            by_region[region].append(request)
    for region, members in by_region.items():
        try:
            existing = cloud.find_launched(region, {r.launch_token for r in members})
        except ProviderError as exc:
            # Only the first placement's region must answer: a later one is tried only once the first had no
            # capacity, and what an unreachable fallback region holds is looked for again on a later pass.
            outcomes.update((_key(r), failed_outcome(r, exc)) for r in members
                            if _key(r) not in outcomes and placements_of(r, default_region)[0].region == region)
            continue
        for request in members:
            found = existing.get((request.service, request.replica_id, request.launch_token))
            if found is not None:
                placement = next(p for p in placements_of(request, default_region) if p.region == region)
                outcomes[_key(request)] = _landed_on(LaunchOutcome(request.replica_id, instance=found), placement)
    pending = list(dict.fromkeys(r for members in by_region.values() for r in members if _key(r) not in outcomes))
    full: dict[tuple[str, int], list[str]] = defaultdict(list)  # placements without capacity, per request
    attempt = 0
    while pending:
        retry = []
        for group in plan_launch_groups(pending, default_region, fits, attempt):
            for request, outcome in zip(group.requests, cloud.launch_group(group), strict=True):
                placements = placements_of(request, default_region)
                if outcome.no_capacity and attempt + 1 < len(placements):
                    full[_key(request)].append(f"{group.placement.describe()}: {outcome.error}")
                    retry.append(request)
                    continue
                outcomes[_key(request)] = _with_fallback_note(_landed_on(outcome, group.placement), attempt,
                                                              group.placement, full[_key(request)])
        for request in pending:  # a next placement without a region: the first one's error stands
            if _key(request) not in outcomes and request not in retry:
                outcomes[_key(request)] = LaunchOutcome(request.replica_id, permanent=True, error=no_region)
        pending, attempt = retry, attempt + 1
    return [outcomes[_key(r)] for r in requests]


def _landed_on(outcome: LaunchOutcome, placement: Placement) -> LaunchOutcome:
    """``outcome`` with its instance's type and accelerators: those of the placement it was launched with."""
    instance = outcome.instance
    if instance is None or instance.instance_type is not None:
        return outcome
    return dataclasses.replace(outcome, instance=dataclasses.replace(
        instance, instance_type=placement.instance_type, accelerator=placement.accelerator))


def _with_fallback_note(outcome: LaunchOutcome, attempt: int, placement: Placement, full: Sequence[str]
                        ) -> LaunchOutcome:
    """``outcome`` of the placement number ``attempt``, saying which earlier placements had no capacity."""
    if not full:
        return outcome
    before = "; ".join(full)
    if outcome.instance is not None:
        detail = (f"landed on candidate {attempt + 1}: {placement.describe()}"
                  + (f" ({outcome.instance.detail})" if outcome.instance.detail else "")
                  + f"; no capacity before: {before}")
        return dataclasses.replace(outcome, instance=dataclasses.replace(outcome.instance, detail=detail))
    return dataclasses.replace(outcome, error=f"{outcome.error} (and before it: {before})")


def launch_across_zones(group: LaunchGroup, zones: Sequence[str], what: str,
                        launch_in: Callable[[str, str | None], list[LaunchOutcome]]) -> list[LaunchOutcome]:
    """Launch ``group`` in the first of ``zones`` with capacity: ``launch_in(zone, detail)`` starts it there
    (``detail`` names the zones that had none, for the instances) or raises ``ZoneCapacityError`` to move on;
    any other ``ProviderError`` fails the batch. ``what`` names the request in the "no capacity" error (the
    instance type). When no zone has capacity, the outcomes are transient failures: a later pass retries."""
    full: list[str] = []
    for zone in zones:
        detail = f"launched in {zone}; no capacity in {', '.join(full)}" if full else None
        try:
            return launch_in(zone, detail)
        except ZoneCapacityError as exc:
            full.append(f"{zone}: {exc.code}")
        except ProviderError as exc:
            return [failed_outcome(r, exc, tried=full) for r in group.requests]
    error = f"no {group.market} capacity for {what} in {group.region}: tried {'; '.join(full)}; will retry"
    return [LaunchOutcome(r.replica_id, error=error, no_capacity=True) for r in group.requests]


def failed_outcome(request: LaunchRequest, exc: ProviderError, tried: Sequence[str] = ()) -> LaunchOutcome:
    """The outcome of a request whose launch raised ``exc`` (after the zones ``tried`` had no capacity)."""
    note = f" (no capacity in {', '.join(tried)} before that)" if tried else ""
    return LaunchOutcome(request.replica_id, error=f"{exc}{note}",
                         permanent=not isinstance(exc, TransientProviderError))


def _key(request: LaunchRequest) -> tuple[str, int]:
    return request.service, request.replica_id
