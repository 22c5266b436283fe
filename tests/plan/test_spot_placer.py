"""``spot_placer: dynamic_fallback``: the zone order of each new spot replica, as tables."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from skyserve_lite.plan.spot_placer import (
    PREEMPTION_MEMORY_SECONDS,
    find_preemptive_zones,
    plan_spot_zone_orders,
    with_spot_zone_order,
)
from skyserve_lite.spec.model import TaskSpec
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.spec.placement import Placement, Resolution
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus

ZONES = ("a", "b", "c")


@pytest.mark.parametrize(("live", "preemptive", "count", "orders"), [
    pytest.param({}, set(), 3, [("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b")], id="spread-over-empty-zones"),
    pytest.param({"a": 2, "b": 1}, {"b"}, 3, [("c", "a", "b"), ("c", "a", "b"), ("a", "c", "b")],
                 id="the-docstring-example"),
    pytest.param({}, {"a"}, 2, [("b", "c", "a"), ("c", "b", "a")], id="preemptive-zone-last"),
    pytest.param({"b": 1}, {"a", "b", "c"}, 2, [("a", "c", "b"), ("c", "a", "b")],
                 id="all-preemptive-all-active-again"),
    pytest.param({"a": 1}, set(), 0, [], id="none-to-launch"),
])
def test_zone_orders(live: dict[str, int], preemptive: set[str], count: int,
                     orders: list[tuple[str, ...]]) -> None:
    assert plan_spot_zone_orders(ZONES, Counter(live), frozenset(preemptive), count) == orders


def row(replica_id: int, status: ReplicaStatus, zone: str | None, since: float) -> ReplicaRecord:
    return ReplicaRecord(service="s", replica_id=replica_id, version=1, status=status, cloud="aws", launched_at=0.0,
                         status_since=since, launch_token="t", is_spot=True, zone=zone)


@pytest.mark.parametrize(("rows", "zones"), [
    pytest.param([row(1, ReplicaStatus.PREEMPTED, "a", 9_000.0)], {"a"}, id="recent-preemption"),
    pytest.param([row(1, ReplicaStatus.PREEMPTED, "a", 10_000.0 - PREEMPTION_MEMORY_SECONDS - 1)], set(),
                 id="forgotten-after-the-memory"),
    pytest.param([row(1, ReplicaStatus.FAILED, "a", 9_000.0)], set(), id="other-failures-do-not-count"),
    pytest.param([row(1, ReplicaStatus.PREEMPTED, None, 9_000.0)], set(), id="no-zone-known"),
])
def test_preemptive_zones(rows: list[ReplicaRecord], zones: set[str]) -> None:
    assert find_preemptive_zones(rows, now=10_000.0) == zones


def spot_spec(*placements: Placement) -> TaskSpec:
    spec = parse_task("service: {replicas: 1}\nrun: x\n")
    return dataclasses.replace(spec, resolution=Resolution(ondemand=placements, spot=placements))


def test_only_the_spot_placements_zones_are_reordered_and_a_pinned_zone_kept() -> None:
    spread = Placement(cloud="aws", region="r", zones=("a", "b", "c"), is_spot=True)
    pinned = Placement(cloud="aws", region="r", zone="b", is_spot=True)
    spec = with_spot_zone_order(spot_spec(spread, pinned), ("c", "a", "b"))
    assert spec.resolution is not None
    assert [p.zone_order for p in spec.resolution.spot] == [("c", "a", "b"), ("b",)]
    assert [p.zone_order for p in spec.resolution.ondemand] == [("a", "b", "c"), ("b",)]
