"""plan_leases as tables: expiry, takeover, spread over live controllers, renewal cadence, a paused owner."""

from __future__ import annotations

import pytest

from skyserve_lite.controller.leases import Lease, LeasePlan, LeaseSettings, plan_leases

SETTINGS = LeaseSettings(ttl_seconds=30.0, renew_seconds=10.0)
NOW = 1000.0


def lease(service: str, owner: str | None = None, expires_at: float = 0.0, token: int = 0) -> Lease:
    return Lease(service, owner, expires_at, token)


def names(leases: tuple[Lease, ...]) -> list[str]:
    return [item.service for item in leases]


@pytest.mark.parametrize(("leases", "live", "claims", "renewals", "releases", "heartbeat"), [
    # Alone on a fresh database: it claims every service (3 services / 1 live loop) and writes its row.
    ([lease("a"), lease("b"), lease("c")], {}, ["a", "b", "c"], [], [], True),
    # Holding everything, renewed 4 s ago: a steady pass plans nothing.
    ([lease("a", "me", NOW + 26, 1), lease("b", "me", NOW + 26, 1)], {"me": NOW - 4}, [], [], [], False),
    # 10 s since its last renewal: every lease it holds is renewed, with its row.
    ([lease("a", "me", NOW + 20, 1), lease("b", "me", NOW + 20, 3)], {"me": NOW - 10}, [], ["a", "b"], [], True),
    # Another live loop's unexpired lease is left alone; the free one is claimed (share 2 of 3 services).
    ([lease("a", "other", NOW + 5, 4), lease("b"), lease("c", "me", NOW + 25, 1)],
     {"me": NOW - 5, "other": NOW - 5}, ["b"], [], [], False),
    # Expired (its owner stopped renewing 30 s ago): claimed; released leases too.
    ([lease("a", "dead", NOW - 0.1, 7), lease("b", None, 0.0, 2)], {"me": NOW - 1, "dead": NOW - 30.1},
     ["a", "b"], [], [], False),
    # Spread: 4 new services, 2 live loops -> 2 each; the first loop takes the first two by name.
    ([lease("a"), lease("b"), lease("c"), lease("d")], {"me": NOW - 1, "other": NOW - 1}, ["a", "b"], [], [], False),
    # At its share (3 services, 2 loops: 2) it claims no more, though one is free.
    ([lease("a", "me", NOW + 25, 1), lease("b", "me", NOW + 25, 1), lease("c")],
     {"me": NOW - 1, "other": NOW - 1}, [], [], [], False),
    # A loop joined: holding 3 of 3 with share 2, it hands the last one over.
    ([lease("a", "me", NOW + 25, 1), lease("b", "me", NOW + 25, 1), lease("c", "me", NOW + 25, 1)],
     {"me": NOW - 1, "new": NOW - 1}, [], [], ["c"], False),
    # 2, 2, 0 over 3 loops (share 2): 2 more than the least loaded, so one is handed over.
    ([lease("a", "me", NOW + 25, 1), lease("b", "me", NOW + 25, 1), lease("c", "x", NOW + 25, 1),
      lease("d", "x", NOW + 25, 1)], {"me": NOW - 1, "x": NOW - 1, "new": NOW - 1}, [], [], ["b"], False),
    # 2, 1, 1 is balanced enough: nothing moves.
    ([lease("a", "me", NOW + 25, 1), lease("b", "me", NOW + 25, 1), lease("c", "x", NOW + 25, 1),
      lease("d", "y", NOW + 25, 1)], {"me": NOW - 1, "x": NOW - 1, "y": NOW - 1}, [], [], [], False),
    # A dead loop is not counted in the share: 4 services, me + one live loop (the dead one's row is 40 s
    # old) -> share 2, and the dead loop's expired leases are claimable.
    ([lease("a", "dead", NOW - 10, 2), lease("b", "dead", NOW - 10, 2), lease("c", "x", NOW + 20, 1),
      lease("d", "x", NOW + 20, 1)], {"me": NOW - 1, "x": NOW - 1, "dead": NOW - 40}, ["a", "b"], [], [], False),
])
def test_plan_leases(leases: list[Lease], live: dict[str, float], claims: list[str], renewals: list[str],
                     releases: list[str], heartbeat: bool) -> None:
    plan = plan_leases(leases, NOW, "me", live, SETTINGS)
    assert (names(plan.claims), names(plan.renewals), names(plan.releases), plan.heartbeat) == (
        claims, renewals, releases, heartbeat)
    # What the loop held as it planned: what an empty plan leaves it, and what its claims add to.
    assert plan.held == tuple(item for item in leases if item.is_held_by("me", NOW))


def test_a_paused_owner_whose_lease_expired_claims_it_again_like_any_other() -> None:
    """Paused for 40 s: its own lease expired. It does not renew it (a renewal keeps the token, and what it
    planned before the pause would still commit); it claims it, and the store moves the token on."""
    mine = lease("a", "me", NOW - 10, 5)
    plan = plan_leases([mine], NOW, "me", {"me": NOW - 40}, SETTINGS)
    assert plan == LeasePlan(claims=(mine,), heartbeat=True)


def test_a_paused_owner_whose_lease_was_taken_over_neither_renews_nor_claims_it() -> None:
    """Another loop took it (its token moved to 6): for the paused loop it is someone else's live lease."""
    taken = lease("a", "other", NOW + 25, 6)
    plan = plan_leases([taken], NOW, "me", {"me": NOW - 40, "other": NOW - 5}, SETTINGS)
    assert plan == LeasePlan(heartbeat=True)


def test_stopping_releases_everything_held_and_nothing_else() -> None:
    held = [lease("a", "me", NOW + 5, 1), lease("b", "me", NOW + 20, 2)]
    plan = plan_leases([*held, lease("c", "other", NOW + 20, 1), lease("d")], NOW, "me", {"me": NOW - 1},
                       SETTINGS, stopping=True)
    assert plan == LeasePlan(releases=tuple(held), held=tuple(held))


def test_no_service_no_lease_but_the_heartbeat() -> None:
    assert plan_leases([], NOW, "me", {}, SETTINGS) == LeasePlan(heartbeat=True)
