"""Lease values the store reads and applies (``controller.leases`` decides them): one per service, owned by one
controller loop at a time, with a fencing token that grows at every takeover."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Lease:
    """One service's lease as read. ``token`` 0: the service has no lease row yet (never claimed);
    ``owner`` None: released (its row and token stay)."""

    service: str
    owner: str | None
    expires_at: float
    token: int

    def is_held_by(self, loop_id: str, now: float) -> bool:
        return self.owner == loop_id and self.expires_at > now

    def is_free(self, now: float) -> bool:
        """Whether any loop may claim it: never claimed, released, or expired (its owner stopped renewing)."""
        return self.owner is None or self.expires_at <= now


@dataclass(frozen=True)
class LeasePlan:
    """What one loop does to the leases this pass. Claims and releases name the lease as it was read: the
    store applies each only while the row still has that token (a compare-and-set), so of two loops claiming
    one free service in the same instant one wins and the other's claim changes nothing."""

    claims: tuple[Lease, ...] = ()
    renewals: tuple[Lease, ...] = ()
    releases: tuple[Lease, ...] = ()
    heartbeat: bool = False  # write this loop's controller row (its liveness) now
    # The leases this loop held when it planned (unexpired, as read): what it holds after an empty plan, and
    # what a claim adds to.
    held: tuple[Lease, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not (self.claims or self.renewals or self.releases or self.heartbeat)


@dataclass(frozen=True)
class Fence:
    """The leases a pass plans with: inside ``Store.fenced`` the store writes a service's rows only while
    ``owner`` still holds it with the token in ``tokens``; the rows of any other service are dropped."""

    owner: str
    tokens: Mapping[str, int] = field(default_factory=dict)
