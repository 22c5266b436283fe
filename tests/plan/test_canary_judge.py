"""The canary judge as a table: counts of one bake window -> verdict, with the reason a person reads."""

from __future__ import annotations

import pytest

from skyserve_lite.plan.canary import (
    CanarySettings,
    Verdict,
    VerdictKind,
    VersionCounts,
    find_settings_problem,
    format_percent,
    format_seconds,
    judge_canary,
)

SETTINGS = CanarySettings(steps=(10, 50), bake_seconds=120, max_error_rate=0.02, min_requests=50, max_extensions=2)
HEALTHY_OLD = VersionCounts(requests=1440, errors_5xx=6)  # 0.4%


@pytest.mark.parametrize(
    ("new", "old", "readiness_failures", "extensions", "kind", "reason"),
    [
        pytest.param(VersionCounts(160, 2), HEALTHY_OLD, 0, 0, VerdictKind.PASS,
                     "version 4 passed at 10%: 5xx 1.2% (2/160) over 2m, limit 2%", id="clear-pass"),
        pytest.param(VersionCounts(160, 12), HEALTHY_OLD, 0, 0, VerdictKind.FAIL,
                     "version 4 rolled back: 5xx 7.5% (12/160) over 2m at 10%, limit 2%", id="clear-fail"),
        pytest.param(VersionCounts(160, 8, failed=4), HEALTHY_OLD, 0, 0, VerdictKind.FAIL,
                     "version 4 rolled back: 5xx 7.5% (12/160) over 2m at 10%, limit 2%",
                     id="failed-attempts-count-as-errors"),
        pytest.param(VersionCounts(100, 2), HEALTHY_OLD, 0, 0, VerdictKind.PASS,
                     "version 4 passed at 10%: 5xx 2% (2/100) over 2m, limit 2%", id="at-the-limit-passes"),
        pytest.param(VersionCounts(30, 0), HEALTHY_OLD, 0, 0, VerdictKind.EXTEND,
                     "version 4: 30 requests over 2m at 10%, fewer than the 50 needed to judge; baking 2m more "
                     "(1 of 2)", id="too-few-extends"),
        pytest.param(VersionCounts(30, 30), HEALTHY_OLD, 0, 0, VerdictKind.EXTEND,
                     "version 4: 30 requests over 2m at 10%, fewer than the 50 needed to judge; baking 2m more "
                     "(1 of 2)", id="too-few-even-when-all-fail"),
        pytest.param(VersionCounts(30, 0), HEALTHY_OLD, 0, 2, VerdictKind.PAUSE,
                     "version 4: 30 requests over 2m at 10%, fewer than the 50 needed to judge; paused after 2 "
                     "extensions: `serve rollout NAME promote` or `abort`", id="too-few-after-every-extension-pauses"),
        pytest.param(VersionCounts(160, 48), VersionCounts(1440, 432), 0, 0, VerdictKind.EXTEND,
                     "version 4: 5xx 30% (48/160) over 2m at 10%, but the old version answers 30% (432/1440) too: "
                     "not blamed on it; baking 2m more (1 of 2)", id="everyone-failing-not-blamed"),
        pytest.param(VersionCounts(160, 80), VersionCounts(1440, 432), 0, 0, VerdictKind.FAIL,
                     "version 4 rolled back: 5xx 50% (80/160) over 2m at 10%, limit 2%",
                     id="everyone-failing-but-new-much-worse"),
        pytest.param(VersionCounts(160, 12), VersionCounts(20, 10), 0, 0, VerdictKind.FAIL,
                     "version 4 rolled back: 5xx 7.5% (12/160) over 2m at 10%, limit 2%",
                     id="old-too-few-to-be-a-baseline"),
        pytest.param(VersionCounts(160, 0), HEALTHY_OLD, 2, 0, VerdictKind.FAIL,
                     "version 4 rolled back: 2 replicas failed before becoming ready at 10%",
                     id="readiness-failures-fail"),
        pytest.param(VersionCounts(0, 0), HEALTHY_OLD, 1, 0, VerdictKind.FAIL,
                     "version 4 rolled back: 1 replica failed before becoming ready at 10%",
                     id="readiness-failure-without-requests"),
    ],
)
def test_judge(new: VersionCounts, old: VersionCounts, readiness_failures: int, extensions: int,
               kind: VerdictKind, reason: str) -> None:
    verdict = judge_canary(4, new, old, readiness_failures, SETTINGS, 10, 120.0, extensions)
    assert verdict == Verdict(kind, reason)


@pytest.mark.parametrize(("fraction", "text"), [(0.075, "7.5%"), (0.02, "2%"), (0.0125, "1.2%"), (1.0, "100%")])
def test_format_percent(fraction: float, text: str) -> None:
    assert format_percent(fraction) == text


@pytest.mark.parametrize(("seconds", "text"), [(120, "2m"), (90, "90s"), (5, "5s"), (120.4, "2m"), (3600, "60m")])
def test_format_seconds(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


def test_counts_of_status_classes() -> None:
    counts = VersionCounts.of_classes({"2xx": 140, "4xx": 8, "5xx": 9, "failed": 3})
    assert counts == VersionCounts(requests=160, errors_5xx=9, failed=3)
    assert counts.error_rate == pytest.approx(0.075)


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (CanarySettings(), None),
        (CanarySettings(steps=()), "steps"),
        (CanarySettings(steps=(10, 100)), "steps"),
        (CanarySettings(steps=(50, 10)), "steps"),
        (CanarySettings(steps=(0,)), "steps"),
        (CanarySettings(bake_seconds=0), "bake"),
        (CanarySettings(bake_seconds=900, max_extensions=3), None),  # 4 x 15m: the hour exactly
        (CanarySettings(bake_seconds=901, max_extensions=3), "bake"),
        (CanarySettings(bake_seconds=1800, max_extensions=3), "bake"),
        (CanarySettings(max_error_rate=1.5), "max_error_rate"),
        (CanarySettings(min_requests=0), "min_requests"),
        (CanarySettings(max_extensions=-1), "max_extensions"),
    ],
)
def test_settings_problems(settings: CanarySettings, problem: str | None) -> None:
    found = find_settings_problem(settings)
    assert (found[0] if found else None) == problem


def test_settings_round_trip() -> None:
    settings = CanarySettings(steps=(5, 25, 60), bake_seconds=30, max_error_rate=0.05, min_requests=10,
                              max_extensions=1)
    assert CanarySettings.from_json(settings.to_json()) == settings


def test_the_longest_window_is_within_the_counts_kept() -> None:
    from skyserve_lite.plan.canary import MAX_WINDOW_SECONDS
    from skyserve_lite.state.history import REQUEST_COUNTS_KEEP_SECONDS

    assert MAX_WINDOW_SECONDS <= REQUEST_COUNTS_KEEP_SECONDS
