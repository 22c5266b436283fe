"""Load-balancing policies and in-flight counts: tables of targets, in-flight requests and exclusions -> choices."""

from __future__ import annotations

import pytest

from skyserve_lite.lb.policies import InFlight, Policy, make_policy

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
    policy = make_policy("round_robin", InFlight())
    policy.set_targets(targets)
    assert _choices(policy, len(expected), exclude) == expected


def test_round_robin_ignores_load() -> None:
    in_flight = InFlight()
    policy = make_policy("round_robin", in_flight)
    policy.set_targets((A, B))
    in_flight.set_targets((A, B))
    for _ in range(5):
        in_flight.start(A)
    assert _choices(policy, 4) == [A, B, A, B]


def _least_load(targets: tuple[str, ...]) -> tuple[Policy, InFlight]:
    in_flight = InFlight()
    policy = make_policy("least_load", in_flight)
    policy.set_targets(targets)
    in_flight.set_targets(targets)
    return policy, in_flight


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
    policy, counts = _least_load(targets)
    for url, count in in_flight.items():
        for _ in range(count):
            counts.start(url)
    assert _choices(policy, len(expected), exclude) == expected


def test_least_load_follows_starts_and_ends() -> None:
    policy, in_flight = _least_load((A, B))
    first = policy.select()
    assert first == A
    in_flight.start(A)
    assert policy.select() == B  # A is busy
    in_flight.start(B)
    in_flight.end(A)
    assert policy.select() == A  # A is free again, B is busy


@pytest.mark.parametrize(
    ("before", "started", "after", "ended", "expected"),
    [
        # targets are listed at 0 when idle; a removed url keeps its count while its requests run
        ((A, B), {A: 2, B: 1}, (B, C), (), ((A, 2), (B, 1), (C, 0))),
        # ... and is forgotten once the last one ended
        ((A, B), {A: 2, B: 1}, (B, C), (A, A), ((B, 1), (C, 0))),
        ((A, B), {A: 2, B: 1}, (A, B), (B,), ((A, 2), (B, 0))),
        ((A,), {A: 3}, (), (A,), ((A, 2),)),
        ((A,), {A: 1}, (), (A,), ()),
        # a url that was never a target counts while busy (the load balancer only starts chosen targets)
        ((A,), {C: 1}, (A,), (), ((A, 0), (C, 1))),
        ((A,), {C: 1}, (A,), (C,), ((A, 0),)),
        # ends of idle or unknown urls are ignored: never below 0
        ((A,), {}, (A,), (A, B), ((A, 0),)),
        ((), {}, (), (), ()),
    ],
)
def test_in_flight_counts_follow_starts_ends_and_targets(
    before: tuple[str, ...],
    started: dict[str, int],
    after: tuple[str, ...],
    ended: tuple[str, ...],
    expected: tuple[tuple[str, int], ...],
) -> None:
    in_flight = InFlight()
    in_flight.set_targets(before)
    for url, count in started.items():
        for _ in range(count):
            in_flight.start(url)
    in_flight.set_targets(after)
    for url in ended:
        in_flight.end(url)
    assert in_flight.snapshot() == expected
    assert {url: in_flight.get(url) for url in (A, B, C)} == {url: dict(expected).get(url, 0) for url in (A, B, C)}


def test_a_url_removed_and_readded_goes_on_from_its_real_count() -> None:
    policy, in_flight = _least_load((A, B))
    in_flight.start(A)
    policy.set_targets((B,))
    in_flight.set_targets((B,))
    policy.set_targets((A, B))
    in_flight.set_targets((A, B))
    assert policy.select() == B  # A still has the request that started before the removal
    in_flight.end(A)
    assert in_flight.get(A) == 0
    in_flight.start(B)
    assert policy.select() == A


def test_set_targets_changes_the_rotation_to_the_new_set() -> None:
    policy = make_policy("round_robin", InFlight())
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
    policy = make_policy(name, InFlight())
    policy.set_targets(targets)
    assert policy.select(exclude) is None


@pytest.mark.parametrize("name", ["", "random", "Round_Robin", "least-load"])
def test_make_policy_rejects_unknown_names(name: str) -> None:
    with pytest.raises(ValueError, match="round_robin, least_load"):
        make_policy(name, InFlight())


# --- instance_aware_least_load ----------------------------------------------------------------------------
def sent(policy: Policy, in_flight: InFlight, count: int) -> list[str]:
    """The targets of ``count`` requests that all stay in flight."""
    chosen = []
    for _ in range(count):
        url = policy.select()
        assert url is not None
        in_flight.start(url)
        chosen.append(url)
    return chosen


def test_instance_aware_fills_replicas_by_the_rate_of_their_accelerator() -> None:
    in_flight = InFlight()
    policy = make_policy("instance_aware_least_load:a100=5,l4=2", in_flight)
    policy.set_targets(["http://a", "http://l"], ["A100:1", "L4:1"])
    chosen = sent(policy, in_flight, 14)
    assert chosen.count("http://a") == 10 and chosen.count("http://l") == 4
    assert chosen[:3] == ["http://a", "http://a", "http://l"]  # (0+1)/5 < (0+1)/2, then (1+1)/5 < (0+1)/2


def test_instance_aware_counts_an_unknown_accelerator_at_the_smallest_rate() -> None:
    in_flight = InFlight()
    policy = make_policy("instance_aware_least_load:a100=6,l4=2", in_flight)
    policy.set_targets(["http://a", "http://x", "http://l"], ["A100:1", None, "L4:1"])
    chosen = sent(policy, in_flight, 10)
    assert chosen.count("http://x") == chosen.count("http://l") == 2 and chosen.count("http://a") == 6


def test_instance_aware_without_rates_is_least_load() -> None:
    in_flight = InFlight()
    policy = make_policy("instance_aware_least_load", in_flight)
    policy.set_targets(["http://a", "http://b"], ["A100:1", "L4:1"])
    in_flight.start("http://a")
    assert policy.select() == "http://b"
    assert policy.select(exclude=("http://b",)) == "http://a"


@pytest.mark.parametrize("name", ["instance_aware_least_load:a100", "instance_aware_least_load:a100=0",
                                  "instance_aware_least_load:=5", "instance_aware_least_load:a100=x"])
def test_instance_aware_rates_that_do_not_parse_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        make_policy(name, InFlight())


@pytest.mark.parametrize(("policy", "target", "expected"), [
    ("least_load", "2.5", "least_load"),
    ("instance_aware_least_load", "{A100: 5, L4: 2.5}", "instance_aware_least_load:a100=5,l4=2.5"),
    ("round_robin", "2.5", "round_robin"),
])
def test_the_policy_a_load_balancer_reads_carries_the_rates(policy: str, target: str, expected: str) -> None:
    from skyserve_lite.spec.parse import parse_task

    # Per-accelerator rates and instance_aware_least_load come together (as SkyServe requires).
    spec = parse_task(f"resources:\n  accelerators: {{A100: 1, L4: 1}}\nrun: x\nservice:\n  load_balancing_policy: "
                      f"{policy}\n  replica_policy:\n    min_replicas: 1\n    max_replicas: 3\n"
                      f"    target_qps_per_replica: {target}\n")
    assert spec.service.lb_policy == expected
    assert make_policy(spec.service.lb_policy, InFlight()) is not None
