"""Load-balancing policies: tables of targets, in-flight requests and exclusions -> choices."""

from __future__ import annotations

import pytest

from skyserve_lite.lb.policies import LeastLoadPolicy, Policy, make_policy

A, B, C = "http://127.0.0.1:1001", "http://127.0.0.1:1002", "http://127.0.0.1:1003"


def _choices(policy: Policy, count: int, exclude: tuple[str, ...] = ()) -> list[str | None]:
    return [policy.select(exclude) for _ in range(count)]


@pytest.mark.parametrize(
    ("targets", "exclude", "expected"),
    [
        ((A, B, C), (), [A, B, C, A, B]),
        ((A,), (), [A, A, A]),
        ((A, B, C), (B,), [A, C, A, C]),
        ((A, B, C), (A, C), [B, B]),
        ((A, B, A), (), [A, B, A, B]),  # duplicates count once
    ],
)
def test_round_robin_order_and_exclusion(
    targets: tuple[str, ...], exclude: tuple[str, ...], expected: list[str]
) -> None:
    policy = make_policy("round_robin")
    policy.set_targets(targets)
    assert _choices(policy, len(expected), exclude) == expected


def test_round_robin_ignores_load() -> None:
    policy = make_policy("round_robin")
    policy.set_targets((A, B))
    for _ in range(5):
        policy.on_start(A)
    assert _choices(policy, 4) == [A, B, A, B]


@pytest.mark.parametrize(
    ("targets", "in_flight", "exclude", "expected"),
    [
        # all idle: ties go round robin
        ((A, B, C), {}, (), [A, B, C, A]),
        # the fewest in flight wins every time while it stays the fewest
        ((A, B, C), {A: 2, B: 1, C: 2}, (), [B, B, B]),
        ((A, B, C), {A: 1, B: 0, C: 0}, (), [B, C, B, C]),
        # an excluded target is never chosen, however idle
        ((A, B, C), {A: 3, B: 0, C: 1}, (B,), [C, C]),
        ((A, B), {A: 5}, (B,), [A]),
    ],
)
def test_least_load_picks_fewest_in_flight_ties_round_robin(
    targets: tuple[str, ...], in_flight: dict[str, int], exclude: tuple[str, ...], expected: list[str]
) -> None:
    policy = make_policy("least_load")
    policy.set_targets(targets)
    for url, count in in_flight.items():
        for _ in range(count):
            policy.on_start(url)
    assert _choices(policy, len(expected), exclude) == expected


def test_least_load_follows_starts_and_ends() -> None:
    policy = make_policy("least_load")
    policy.set_targets((A, B))
    first = policy.select()
    assert first == A
    policy.on_start(A)
    assert policy.select() == B  # A is busy
    policy.on_start(B)
    policy.on_end(A)
    assert policy.select() == A  # A is free again, B is busy


@pytest.mark.parametrize(
    ("before", "started", "after", "expected_counts"),
    [
        # kept urls keep their counts, removed urls are dropped, new urls start at 0
        ((A, B), {A: 2, B: 1}, (B, C), {A: 0, B: 1, C: 0}),
        ((A, B), {A: 2, B: 1}, (A, B), {A: 2, B: 1, C: 0}),
        ((A,), {A: 3}, (), {A: 0, B: 0, C: 0}),
    ],
)
def test_set_targets_keeps_counts_of_kept_urls_and_drops_removed(
    before: tuple[str, ...],
    started: dict[str, int],
    after: tuple[str, ...],
    expected_counts: dict[str, int],
) -> None:
    policy = LeastLoadPolicy()
    policy.set_targets(before)
    for url, count in started.items():
        for _ in range(count):
            policy.on_start(url)
    policy.set_targets(after)
    assert {url: policy.in_flight(url) for url in (A, B, C)} == expected_counts


def test_end_of_a_request_to_a_removed_and_readded_url_does_not_go_negative() -> None:
    policy = LeastLoadPolicy()
    policy.set_targets((A, B))
    policy.on_start(A)
    policy.set_targets((B,))
    policy.set_targets((A, B))
    policy.on_end(A)  # the request started before the removal ends now
    assert policy.in_flight(A) == 0
    policy.on_start(B)
    assert policy.select() == A


def test_set_targets_changes_the_rotation_to_the_new_set() -> None:
    policy = make_policy("round_robin")
    policy.set_targets((A, B, C))
    assert _choices(policy, 3) == [A, B, C]
    policy.set_targets((A, B))
    assert _choices(policy, 3) == [A, B, A]


@pytest.mark.parametrize("name", ["round_robin", "least_load"])
@pytest.mark.parametrize(
    ("targets", "exclude"),
    [
        ((), ()),
        ((), (A,)),
        ((A,), (A,)),
        ((A, B), (A, B)),
        ((A, B), (B, A, C)),
    ],
)
def test_select_returns_none_when_nothing_is_eligible(
    name: str, targets: tuple[str, ...], exclude: tuple[str, ...]
) -> None:
    policy = make_policy(name)
    policy.set_targets(targets)
    assert policy.select(exclude) is None


@pytest.mark.parametrize("name", ["round_robin", "least_load"])
def test_unknown_urls_in_start_and_end_are_ignored(name: str) -> None:
    policy = make_policy(name)
    policy.set_targets((A,))
    policy.on_start(C)
    policy.on_end(C)
    policy.on_end(A)
    assert policy.select() == A


@pytest.mark.parametrize("name", ["", "random", "Round_Robin", "least-load"])
def test_make_policy_rejects_unknown_names(name: str) -> None:
    with pytest.raises(ValueError, match="round_robin, least_load"):
        make_policy(name)
