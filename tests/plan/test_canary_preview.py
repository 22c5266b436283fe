"""``plan_canary_preview``: the canary the dry run shows is ``plan_canary_step`` run forward (every replica
READY a pass after its launch, every window good), so it cannot say other than the controller does."""

from __future__ import annotations

import pytest

from skyserve_lite.plan.canary import CanaryPreview, CanarySettings, CanaryStepPreview, plan_canary_preview

TWO_STEPS = CanarySettings(steps=(10, 50), bake_seconds=120.0)


@pytest.mark.parametrize(
    ("target", "settings", "config_changed", "reused", "expected"),
    [
        # Target 4: ceil(0.4) = 1 new replica, then ceil(2.0) = 2 (one more); the other two at the promotion.
        (4, TWO_STEPS, True, 0, CanaryPreview(steps=(CanaryStepPreview(10, 1, 120.0, (5,)),
                                                     CanaryStepPreview(50, 2, 120.0, (6,))))),
        # Target 10, steps 20, 30, 90: 2, 3 (one more), 9 (six more).
        (10, CanarySettings(steps=(20, 30, 90), bake_seconds=60.0), True, 0,
         CanaryPreview(steps=(CanaryStepPreview(20, 2, 60.0, (5, 6)), CanaryStepPreview(30, 3, 60.0, (7,)),
                              CanaryStepPreview(90, 9, 60.0, (8, 9, 10, 11, 12, 13))))),
        # Two of the four reused: they count as the new version's, so the first step launches none.
        (4, TWO_STEPS, True, 2, CanaryPreview(steps=(CanaryStepPreview(10, 1, 120.0, ()),
                                                     CanaryStepPreview(50, 2, 120.0, ())))),
        # Every replica reused: the controller's first pass is done, with nothing to judge.
        (4, TWO_STEPS, False, 4, CanaryPreview(done="version 2 reuses every replica (same replica config): "
                                                    "nothing to judge, it is current at once")),
    ],
)
def test_the_preview_is_the_controllers_steps(target: int, settings: CanarySettings, config_changed: bool,
                                              reused: int, expected: CanaryPreview) -> None:
    assert plan_canary_preview(2, target, settings, config_changed=config_changed, reused=reused,
                               launch_ids=tuple(range(5, 5 + target))) == expected
