"""Spot/on-demand split, policy dispatch and how an update carries the autoscaler's state over."""

from __future__ import annotations

import dataclasses

import pytest

from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.autoscalers.dispatch import make_autoscaler
from skyserve_lite.autoscalers.fallback import MarketTargets, plan_market_targets
from skyserve_lite.autoscalers.target import carry_over, compute_target_replicas
from skyserve_lite.spec.model import ReplicaPolicy

FALLBACK = ReplicaPolicy(min_replicas=4, max_replicas=4, base_ondemand_fallback_replicas=1,
                         dynamic_ondemand_fallback=True)


@pytest.mark.parametrize(
    ("use_spot", "policy", "target", "ready_spot", "expected"),
    [
        pytest.param(False, ReplicaPolicy(), 3, 0, MarketTargets(0, 3), id="no-spot-all-on-demand"),
        pytest.param(True, ReplicaPolicy(), 3, 0, MarketTargets(3, 0), id="spot-without-fallback"),
        pytest.param(True, ReplicaPolicy(base_ondemand_fallback_replicas=1), 3, 0, MarketTargets(2, 1),
                     id="base-on-demand-always-kept"),
        pytest.param(True, ReplicaPolicy(base_ondemand_fallback_replicas=5), 3, 3, MarketTargets(0, 3),
                     id="base-larger-than-target"),
        pytest.param(True, FALLBACK, 4, 0, MarketTargets(3, 4), id="all-spot-provisioning-on-demand-stand-ins"),
        pytest.param(True, FALLBACK, 4, 2, MarketTargets(3, 2), id="some-spot-ready"),
        pytest.param(True, FALLBACK, 4, 3, MarketTargets(3, 1), id="spot-ready-stand-ins-go"),
    ],
)
def test_market_targets(use_spot: bool, policy: ReplicaPolicy, target: int, ready_spot: int,
                        expected: MarketTargets) -> None:
    assert plan_market_targets(use_spot, policy, target, ready_spot) == expected


@pytest.mark.parametrize(
    ("policy", "name", "period"),
    [
        # A fixed policy decides nothing, so it has no period to override.
        (ReplicaPolicy(min_replicas=2, max_replicas=2), "fixed", 0.0),
        (ReplicaPolicy(min_replicas=1, max_replicas=3, target_qps_per_replica=2), "request_rate", 1.0),
        (ReplicaPolicy(min_replicas=1, max_replicas=3, target_ongoing_requests_per_replica=2), "ongoing_requests",
         1.0),
    ],
)
def test_dispatch(policy: ReplicaPolicy, name: str, period: float) -> None:
    assert make_autoscaler(policy).name == name
    assert make_autoscaler(policy, period_seconds=1.0).period_seconds == period


AUTO = ReplicaPolicy(min_replicas=2, max_replicas=4, target_qps_per_replica=1)


@pytest.mark.parametrize(
    ("state", "policy", "expected"),
    [
        pytest.param(None, AUTO, AutoscalerState(2, 2), id="first-decision-starts-at-min"),
        pytest.param(AutoscalerState(2, 3, 1, 0, 5.0), AUTO, AutoscalerState(2, 3, 1, 0, 5.0), id="same-version-kept"),
        pytest.param(AutoscalerState(1, 9, 4, 0, 5.0), AUTO, AutoscalerState(2, 4), id="new-max-clips-at-once"),
        pytest.param(AutoscalerState(1, 1, 0, 7, 5.0), AUTO, AutoscalerState(2, 2), id="new-min-raises-at-once"),
        pytest.param(AutoscalerState(1, 3), ReplicaPolicy(min_replicas=5, max_replicas=5), AutoscalerState(2, 5),
                     id="to-fixed"),
    ],
)
def test_carry_over_to_version_2(state: AutoscalerState | None, policy: ReplicaPolicy,
                                 expected: AutoscalerState) -> None:
    assert carry_over(state, policy, version=2) == expected


@pytest.mark.parametrize(
    ("policy", "state", "target"),
    [(ReplicaPolicy(min_replicas=3, max_replicas=3), AutoscalerState(1, 7), 3), (AUTO, None, 2),
     (AUTO, AutoscalerState(1, 3), 3), (AUTO, AutoscalerState(1, 9), 4),
     # num_overprovision: spare replicas above the target, beyond max_replicas too
     (dataclasses.replace(AUTO, num_overprovision=1), None, 3),
     (dataclasses.replace(AUTO, num_overprovision=2), AutoscalerState(1, 3), 5),
     (dataclasses.replace(AUTO, num_overprovision=2), AutoscalerState(1, 9), 6),
     (ReplicaPolicy(min_replicas=2, max_replicas=2, num_overprovision=1), None, 3)],
)
def test_target(policy: ReplicaPolicy, state: AutoscalerState | None, target: int) -> None:
    assert compute_target_replicas(policy, state) == target
