"""The one rule for a canary's settings (``plan.canary.find_canary_settings``): each flag over the settings
given whole, else over the task's `service.canary`, else over the defaults. A table of who wins."""

from __future__ import annotations

import pytest

from skyserve_lite.plan.canary import CanarySettings, find_canary_settings

DEFAULTS = CanarySettings()
SECTION = CanarySettings(steps=(25,), bake_seconds=300.0, max_error_rate=0.05, min_requests=10, max_extensions=1)
GIVEN = CanarySettings(steps=(5, 20, 60), bake_seconds=60.0)
Flags = tuple[tuple[int, ...] | None, float | None, float | None]  # --steps, --bake, --max-error-rate
NO_FLAGS: Flags = (None, None, None)


@pytest.mark.parametrize(("section", "given", "flags", "expected"), [
    (None, None, NO_FLAGS, DEFAULTS),
    (SECTION, None, NO_FLAGS, SECTION),
    (None, GIVEN, NO_FLAGS, GIVEN),
    # Given whole, the settings replace the section, every field (min_requests 50, not the section's 10).
    (SECTION, GIVEN, NO_FLAGS, GIVEN),
    # A flag replaces its field only: the section's others stay.
    (SECTION, None, ((10, 40), None, None),
     CanarySettings(steps=(10, 40), bake_seconds=300.0, max_error_rate=0.05, min_requests=10, max_extensions=1)),
    (SECTION, None, (None, 30.0, 0.01),
     CanarySettings(steps=(25,), bake_seconds=30.0, max_error_rate=0.01, min_requests=10, max_extensions=1)),
    (None, None, (None, None, 0.1), CanarySettings(max_error_rate=0.1)),
    (SECTION, GIVEN, (None, 90.0, None), CanarySettings(steps=(5, 20, 60), bake_seconds=90.0)),
    # 0 is a rate given, not a flag left out.
    (SECTION, None, (None, None, 0.0),
     CanarySettings(steps=(25,), bake_seconds=300.0, max_error_rate=0.0, min_requests=10, max_extensions=1)),
])
def test_find_canary_settings(section: CanarySettings | None, given: CanarySettings | None, flags: Flags,
                              expected: CanarySettings) -> None:
    steps, bake_seconds, max_error_rate = flags
    assert find_canary_settings(section, given, steps=steps, bake_seconds=bake_seconds,
                                max_error_rate=max_error_rate) == expected
