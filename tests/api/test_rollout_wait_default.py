"""How long a rollout is waited for without --timeout (``compute_rollout_wait_seconds``,
``find_rollout_wait_seconds``): 600 s, and a canary's longest course on top, since its bake windows alone
may outlast 600 s; and a timeout says the rollout goes on."""

from __future__ import annotations

import dataclasses

import pytest

from skyserve_lite.api import CanaryView
from skyserve_lite.clock import FakeClock
from skyserve_lite.errors import WaitTimeoutError
from skyserve_lite.plan.canary import CanaryPhase, CanarySettings, CanaryState, VersionCounts
from skyserve_lite.waits import compute_rollout_wait_seconds, find_rollout_wait_seconds, wait_for_rollout

from .test_rollout_wait import R, Scripted, replica, view

TWO_STEPS = CanarySettings(steps=(10, 50), bake_seconds=120.0, max_extensions=3)


@pytest.mark.parametrize(
    ("settings", "watch", "seconds"),
    [
        (None, False, 600.0),  # rolling, blue-green
        (TWO_STEPS, False, 600.0 + 2 * 4 * 120),  # 960 s of windows (16m) + 600: 26m
        (CanarySettings(steps=(5, 20, 50), bake_seconds=60.0, max_extensions=0), False, 600.0 + 3 * 1 * 60),
        (TWO_STEPS, True, 600.0 + 1 * 4 * 120),  # a watched rolling update: one window, extended
    ],
)
def test_the_default_covers_a_canarys_longest_course(settings: CanarySettings | None, watch: bool,
                                                      seconds: float) -> None:
    assert compute_rollout_wait_seconds(settings, watch=watch) == seconds


def canary(state: CanaryState) -> CanaryView:
    return CanaryView(state=state, percent=10, new=VersionCounts(), old=VersionCounts())


@pytest.mark.parametrize(
    ("state", "version", "seconds"),
    [
        (None, None, 600.0),
        (CanaryState(2, TWO_STEPS), None, 1560.0),
        (CanaryState(2, TWO_STEPS), 2, 1560.0),
        (CanaryState(2, TWO_STEPS), 1, 600.0),  # another version than the canary's
        (CanaryState(2, TWO_STEPS, phase=CanaryPhase.PROMOTED), None, 600.0),  # over: rolling from here
        (CanaryState(2, TWO_STEPS, phase=CanaryPhase.WATCHING), None, 1080.0),
    ],
)
def test_serve_wait_finds_the_default_from_the_canary_shown(state: CanaryState | None, version: int | None,
                                                            seconds: float) -> None:
    seen = dataclasses.replace(view([replica(1, 1, R.READY)]), canary=None if state is None else canary(state))
    assert find_rollout_wait_seconds(seen, version) == seconds


def test_a_timeout_says_the_rollout_goes_on() -> None:
    script = Scripted([view([replica(1, 1, R.READY), replica(3, 2, R.STARTING)])])
    with pytest.raises(WaitTimeoutError) as caught:
        wait_for_rollout(script, "web", 2, 3, poll_seconds=1, clock=FakeClock())
    assert str(caught.value).endswith("; the rollout goes on; follow it with `sky-lite serve wait web`")
