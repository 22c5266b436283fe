"""Ray 2.7's smoothing factors in ``AutoscalingConfig``: ``upscale_smoothing_factor`` and
``downscale_smoothing_factor`` (each falling back to ``smoothing_factor``), the wake from zero replicas and the
last steps to zero."""

from __future__ import annotations

import math

import pytest

from skyserve_lite.autoscalers.ongoing_requests import (
    AutoscalingConfig,
    BasicAutoscalingPolicy,
    calculate_desired_num_replicas,
    compute_wake_target,
)


def _config(smoothing: float = 1.0, up: float | None = None, down: float | None = None, min_replicas: int = 0,
            max_replicas: int = 100) -> AutoscalingConfig:
    return AutoscalingConfig(min_replicas=min_replicas, max_replicas=max_replicas,
                             target_num_ongoing_requests_per_replica=1, upscale_delay_s=0, downscale_delay_s=0,
                             smoothing_factor=smoothing, upscale_smoothing_factor=up, downscale_smoothing_factor=down)


@pytest.mark.parametrize(
    ("ongoing", "smoothing", "up", "down", "min_replicas", "expected"),
    [
        # 3 replicas, 2 in flight each, target 1: ratio 2, desired ceil(3 x (1 + (2 - 1) x factor)).
        pytest.param([2, 2, 2], 1.0, None, None, 0, 6, id="ratio-2-factor-1: ceil(3 x 2)"),
        pytest.param([2, 2, 2], 0.5, None, None, 0, 5, id="smoothing-factor-up: ceil(3 x 1.5)"),
        pytest.param([2, 2, 2], 1.0, 0.5, None, 0, 5, id="upscale-factor: ceil(3 x 1.5)"),
        pytest.param([2, 2, 2], 1.0, 0.25, None, 0, 4, id="upscale-factor: ceil(3 x 1.25)"),
        pytest.param([2, 2, 2], 0.5, 1.0, None, 0, 6, id="upscale-factor-overrides-smoothing"),
        pytest.param([2, 2, 2], 1.0, None, 0.1, 0, 6, id="downscale-factor-unused-going-up"),
        pytest.param([2, 2], 1.0, 2.0, None, 0, 6, id="upscale-factor-above-1: ceil(2 x 3)"),
        # 4 replicas, 0.5 in flight each, target 1: ratio 0.5, desired ceil(4 x (1 - 0.5 x factor)).
        pytest.param([0.5] * 4, 1.0, None, None, 0, 2, id="ratio-0.5-factor-1: ceil(4 x 0.5)"),
        pytest.param([0.5] * 4, 0.5, None, None, 0, 3, id="smoothing-factor-down: ceil(4 x 0.75)"),
        pytest.param([0.5] * 4, 1.0, None, 0.5, 0, 3, id="downscale-factor: ceil(4 x 0.75)"),
        pytest.param([0.5] * 4, 0.5, None, 1.0, 0, 2, id="downscale-factor-overrides-smoothing"),
        pytest.param([0.5] * 4, 1.0, 0.1, None, 0, 2, id="upscale-factor-unused-going-down"),
        pytest.param([1, 1, 1], 1.0, 0.1, 0.1, 0, 3, id="at-target-unchanged"),
        # No load at all: a count the ceiling keeps where it is steps down by one.
        pytest.param([0], 1.0, None, 0.5, 0, 0, id="one-idle-replica-to-zero: ceil(0.5) = 1 -> 0"),
        pytest.param([0], 1.0, None, 0.5, 1, 1, id="min-replicas-1-holds"),
        pytest.param([0] * 5, 1.0, None, 0.1, 0, 4, id="stuck-at-5: ceil(4.5) = 5 -> 4"),
        pytest.param([0] * 5, 1.0, None, 0.5, 0, 3, id="not-stuck: ceil(2.5) = 3, no extra step"),
        pytest.param([0] * 3, 1.0, None, None, 0, 0, id="factor-1-straight-to-zero"),
        pytest.param([0.1], 1.0, None, 0.5, 0, 1, id="little-load-is-not-no-load: ceil(0.55) = 1"),
    ],
)
def test_desired_replicas_per_direction(ongoing: list[float], smoothing: float, up: float | None,
                                        down: float | None, min_replicas: int, expected: int) -> None:
    config = _config(smoothing, up, down, min_replicas)
    assert calculate_desired_num_replicas(config, ongoing) == expected


def test_an_idle_service_walks_down_to_zero_one_replica_a_decision() -> None:
    # Downscale factor 0.1: ceil(n x 0.9) = n for every n up to 10, so each decision takes one replica off.
    policy = BasicAutoscalingPolicy(_config(down=0.1))
    targets = [5]
    while targets[-1] > 0 and len(targets) < 10:
        targets.append(policy.get_decision_num_replicas(targets[-1], [0] * targets[-1], 0))
    assert targets == [5, 4, 3, 2, 1, 0]


@pytest.mark.parametrize(
    ("queued", "target", "smoothing", "up", "max_replicas", "expected"),
    [
        pytest.param(5, 0, 1.0, None, 5, 1, id="factor-1-wakes-one"),
        pytest.param(5, 0, 1.0, 2.5, 5, 3, id="upscale-2.5: ceil(2.5)"),
        pytest.param(5, 0, 2.0, None, 5, 2, id="smoothing-factor-when-no-upscale-factor"),
        pytest.param(5, 0, 1.0, 0.5, 5, 1, id="upscale-0.5: ceil(0.5)"),
        pytest.param(5, 0, 1.0, 10.0, 4, 4, id="clipped-to-max-replicas"),
        pytest.param(5, 2, 1.0, 2.5, 5, 3, id="above-the-current-target"),
        pytest.param(5, 4, 1.0, 2.5, 5, 4, id="never-below-the-current-target"),
        pytest.param(0, 0, 1.0, 2.5, 5, 0, id="nothing-queued-stays-at-zero"),
    ],
)
def test_waking_from_zero(queued: int, target: int, smoothing: float, up: float | None, max_replicas: int,
                          expected: int) -> None:
    config = _config(smoothing, up, max_replicas=max_replicas)
    policy = BasicAutoscalingPolicy(config)
    assert policy.get_decision_num_replicas(target, [], queued) == expected
    if queued:
        assert compute_wake_target(config, target) == expected


@pytest.mark.parametrize(
    ("smoothing", "up", "down", "expected"),
    [
        (1.0, None, None, (1.0, 1.0)),
        (0.5, None, None, (0.5, 0.5)),
        (0.5, 2.0, None, (2.0, 0.5)),
        (0.5, None, 0.25, (0.5, 0.25)),
        (0.5, 2.0, 0.25, (2.0, 0.25)),
    ],
)
def test_each_direction_falls_back_to_smoothing_factor(smoothing: float, up: float | None, down: float | None,
                                                       expected: tuple[float, float]) -> None:
    config = _config(smoothing, up, down)
    assert (config.get_upscale_smoothing_factor(), config.get_downscale_smoothing_factor()) == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("smoothing_factor", 0),
        ("smoothing_factor", -1.0),
        ("upscale_smoothing_factor", 0.0),
        ("upscale_smoothing_factor", math.nan),
        ("upscale_smoothing_factor", "2"),
        ("downscale_smoothing_factor", -0.5),
        ("downscale_smoothing_factor", math.inf),
        ("downscale_smoothing_factor", True),
    ],
)
def test_a_factor_must_be_a_positive_number(field: str, value: object) -> None:
    # Anchored: "smoothing_factor" must not pass for a message about "upscale_smoothing_factor".
    with pytest.raises(ValueError, match=rf"^{field} must be a number greater than 0; got {value!r}$"):
        AutoscalingConfig(**{field: value})  # type: ignore[arg-type]


def test_factors_left_unset_keep_ray_1_behaviour() -> None:
    config = AutoscalingConfig()
    assert (config.upscale_smoothing_factor, config.downscale_smoothing_factor) == (None, None)
    assert (config.get_upscale_smoothing_factor(), config.get_downscale_smoothing_factor()) == (1.0, 1.0)
