"""Spot with on-demand fallback: how many of the target run on spot and how many on demand. Pure.

With ``resources.use_spot: true``: ``base_ondemand_fallback_replicas`` (K) replicas are always on demand and
the rest spot. With ``dynamic_ondemand_fallback: true``, every spot replica that is wanted but not READY
(still provisioning, or preempted and being replaced) gets an on-demand stand-in, which is scaled down once
the spot replicas are READY.

Worked numbers: target 4, K = 1, dynamic: 3 spot wanted. None READY yet -> 1 + 3 = 4 on demand and 3 spot
launched together. Two spot READY -> 1 + 1 = 2 on demand (two stand-ins go). All three READY -> 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from skyserve_lite.spec.model import ReplicaPolicy


@dataclass(frozen=True)
class MarketTargets:
    spot: int
    on_demand: int

    def for_market(self, is_spot: bool) -> int:
        return self.spot if is_spot else self.on_demand


def plan_market_targets(use_spot: bool, policy: ReplicaPolicy, target: int, ready_spot: int) -> MarketTargets:
    """Split ``target`` between markets; ``ready_spot`` counts READY spot replicas of the current version."""
    if not use_spot:
        return MarketTargets(spot=0, on_demand=target)
    base = min(policy.base_ondemand_fallback_replicas, target)
    spot = target - base
    on_demand = base
    if policy.dynamic_ondemand_fallback:
        on_demand += max(0, spot - ready_spot)
    return MarketTargets(spot=spot, on_demand=on_demand)
