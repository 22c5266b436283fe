"""SkyServe's ``spot_placer: dynamic_fallback`` (SpotHedge): which zone each new spot replica tries first.

Spot capacity is taken back zone by zone, so a service whose spot replicas all sit in one zone loses them
all at once. The placer spreads them and steers away from trouble:

- a zone where a spot replica of the service was preempted within ``PREEMPTION_MEMORY_SECONDS`` is
  *preemptive*; the others are *active*. When every zone is preemptive, all count as active again (there is
  nowhere better to go, and the oldest trouble may be over);
- each new replica tries the active zones first, the one holding the fewest live spot replicas of the
  service first (ties in the placement's own order), then the preemptive ones in the same way; every
  replica placed counts in the next one's choice.

On-demand fallback (``dynamic_ondemand_fallback``) is unchanged: it covers spot replicas that are not READY.

Worked example: zones a, b, c; two live spot replicas in a, one in b; a preemption in b ten minutes ago;
three to launch. Active: a (2), c (0); preemptive: b (1). Replica 1 tries c, a, b; c now holds 1, so
replica 2 tries c, a, b too (c 1 < a 2); c holds 2, tied with a: replica 3 tries a, c, b (the placement's
order breaks the tie).

Pure: replicas and the time come in as values.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from skyserve_lite.spec.model import TaskSpec
from skyserve_lite.spec.placement import Placement
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus

# How long a preemption marks its zone (SkyServe keeps a zone preemptive until a replica there is ready
# again; an hour is the same idea without tracking each zone's recovery).
PREEMPTION_MEMORY_SECONDS = 3600.0


def find_preemptive_zones(replicas: Sequence[ReplicaRecord], now: float,
                          memory_seconds: float = PREEMPTION_MEMORY_SECONDS) -> frozenset[str]:
    """Zones where a spot replica among ``replicas`` was preempted within ``memory_seconds`` of ``now``."""
    return frozenset(r.zone for r in replicas if r.status is ReplicaStatus.PREEMPTED and r.zone is not None
                     and now - r.status_since <= memory_seconds)


def plan_spot_zone_orders(zones: Sequence[str], live: Counter[str], preemptive: frozenset[str],
                          count: int) -> list[tuple[str, ...]]:
    """The zone order each of ``count`` new spot replicas tries (see the module docstring); ``live`` counts
    the live spot replicas by zone."""
    placed = Counter(live)
    active = [zone for zone in zones if zone not in preemptive] or list(zones)
    later = [zone for zone in zones if zone not in active]
    orders = []
    for _ in range(count):
        def rank(zone: str) -> tuple[int, int]:
            return placed[zone], zones.index(zone)

        order = tuple(sorted(active, key=rank) + sorted(later, key=rank))
        orders.append(order)
        if order:
            placed[order[0]] += 1
    return orders


def find_spot_zones(spec: TaskSpec) -> tuple[str, ...]:
    """Every zone the spec's spot placements may launch in, in their order (a placement pinned to one zone
    offers that zone)."""
    resolution = spec.resolution
    if resolution is None:
        return ()
    return tuple(dict.fromkeys(zone for p in resolution.spot for zone in p.zone_order))


def with_spot_zone_order(spec: TaskSpec, order: Sequence[str]) -> TaskSpec:
    """``spec`` whose spot placements try their zones in ``order`` (a placement pinned to a zone keeps it)."""
    resolution = spec.resolution
    if resolution is None or not resolution.spot:
        return spec
    rank = {zone: index for index, zone in enumerate(order)}

    def reorder(placement: Placement) -> Placement:
        if placement.zone is not None or len(placement.zones) < 2:
            return placement
        return dataclasses.replace(placement, zones=tuple(sorted(placement.zones,
                                                                 key=lambda z: rank.get(z, len(rank)))))

    spot = tuple(reorder(p) for p in resolution.spot)
    return dataclasses.replace(spec, resolution=dataclasses.replace(resolution, spot=spot))
