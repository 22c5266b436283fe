"""What every cloud provider does the same way, whatever its API: batches, adoption, zone fallback.

A cloud provider (``aws``, and the next peers) is translation between this model and its API:

- ``plan_launch_groups`` splits a ``launch`` call's requests into batches one API call can start: the same
  service, version, launch token, region, zone and market, and no more than the cloud's own limit
  (``fits``: AWS's 256-character tag of replica ids, say);
- ``launch_in_batches`` is the whole of ``Provider.launch``: requests without a region are refused, the
  instances an earlier attempt of the same launch token started are adopted (``BatchCloud.find_launched``,
  one lookup per region), and only the rest is launched, batch by batch, one batch's failure its own;
- ``launch_across_zones`` tries a zoneless batch in the region's zones in order, moving on when a zone has
  no capacity (``ZoneCapacityError``) and saying in each instance's ``detail`` which zones had none.

Everything here is pure but for the calls into ``BatchCloud`` and the ``launch_in`` callback.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from skyserve_lite.errors import ProviderError, TransientProviderError
from skyserve_lite.providers.base import Instance, LaunchOutcome, LaunchRequest


class ZoneCapacityError(TransientProviderError):
    """The zone asked for has no capacity for this request; another zone may have some. ``code`` is the
    cloud's own name for it (``InsufficientInstanceCapacity``, ``ZONE_RESOURCE_POOL_EXHAUSTED``)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class LaunchGroup:
    """Requests that one launch call can start: same service, version, token, region, zone, market."""

    region: str
    zone: str | None  # None: any zone of the region
    is_spot: bool
    requests: tuple[LaunchRequest, ...]

    @property
    def first(self) -> LaunchRequest:
        return self.requests[0]

    @property
    def replica_ids(self) -> tuple[int, ...]:
        return tuple(r.replica_id for r in self.requests)

    @property
    def market(self) -> str:
        return "spot" if self.is_spot else "on-demand"


def find_region(request: LaunchRequest, default_region: str | None) -> str | None:
    return request.spec.resources.region or default_region


def plan_launch_groups(requests: Sequence[LaunchRequest], default_region: str | None,
                       fits: Callable[[Sequence[LaunchRequest]], bool] = lambda _batch: True) -> list[LaunchGroup]:
    """Batches of ``requests`` in first-seen order, each one that ``fits`` says one call can start (a batch of
    one always can). Requests without a region (none in the task, no default) are left out; the caller
    reports them."""
    keyed: dict[tuple[str, int, str, str, str | None, bool], list[LaunchRequest]] = defaultdict(list)
    for request in requests:
        region = find_region(request, default_region)
        if region is not None:
            keyed[(request.service, request.version, request.launch_token, region, request.spec.resources.zone,
                   request.is_spot)].append(request)
    groups = []
    for (_, _, _, region, zone, is_spot), members in keyed.items():
        chunk: list[LaunchRequest] = []
        for request in members:
            if chunk and not fits([*chunk, request]):
                groups.append(LaunchGroup(region, zone, is_spot, tuple(chunk)))
                chunk = []
            chunk.append(request)
        groups.append(LaunchGroup(region, zone, is_spot, tuple(chunk)))
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
        region = find_region(request, default_region)
        if region is None:
            outcomes[_key(request)] = LaunchOutcome(request.replica_id, permanent=True, error=no_region)
        else:
            by_region[region].append(request)
    for region, members in by_region.items():
        try:
            existing = cloud.find_launched(region, {r.launch_token for r in members})
        except ProviderError as exc:
            outcomes.update((_key(r), failed_outcome(r, exc)) for r in members)
            continue
        missing = []
        for request in members:
            found = existing.get((request.service, request.replica_id, request.launch_token))
            if found is not None:
                outcomes[_key(request)] = LaunchOutcome(request.replica_id, instance=found)
            else:
                missing.append(request)
        for group in plan_launch_groups(missing, default_region, fits):
            outcomes.update(zip(map(_key, group.requests), cloud.launch_group(group), strict=True))
    return [outcomes[_key(r)] for r in requests]


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
    return [LaunchOutcome(r.replica_id, error=error) for r in group.requests]


def failed_outcome(request: LaunchRequest, exc: ProviderError, tried: Sequence[str] = ()) -> LaunchOutcome:
    """The outcome of a request whose launch raised ``exc`` (after the zones ``tried`` had no capacity)."""
    note = f" (no capacity in {', '.join(tried)} before that)" if tried else ""
    return LaunchOutcome(request.replica_id, error=f"{exc}{note}",
                         permanent=not isinstance(exc, TransientProviderError))


def _key(request: LaunchRequest) -> tuple[str, int]:
    return request.service, request.replica_id
