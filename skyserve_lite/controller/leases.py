"""Which services this controller owns: one lease per service, decided by ``plan_leases`` (pure), applied by
the store (``Store.apply_leases``), kept by ``LeaseHolder`` across passes.

Several controllers (loops) may share one database. A service is owned by one loop at a time through its
lease row: the owner's loop id, an expiry, and a fencing token that grows at every takeover. Only the owner
plans and acts for a service, and every write its pass makes for the service commits only while the token it
planned with still holds (``Store.fenced``): a loop that was paused past its lease and wakes up late finds
its token moved on, and its writes for that service are dropped.

Numbers, with the defaults (TTL 30 s, renewal every 10 s): a loop renews every lease it holds once per
10 s, so a lease it holds never has less than 20 s left while the loop runs; a loop that stops (kill -9, VM
gone, network cut) renews nothing more, its leases expire at most 30 s after its last renewal, and the other
loops' next pass claims them (a claim increments the token). Its controller row is 30 s old by then too, so
the survivors no longer count it when they spread services.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from skyserve_lite.clock import Clock
from skyserve_lite.state.leases import Fence, Lease, LeasePlan

__all__ = ["Fence", "Lease", "LeaseHolder", "LeasePlan", "LeaseSettings", "find_live_controllers", "new_loop_id",
           "plan_leases"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    # A lease not renewed for this long is free: a stopped controller's services move within it.
    ttl_seconds: float = 30.0
    # A loop renews its leases (and its own controller row) this often; a third of the TTL leaves two
    # renewals' margin for a slow pass or a busy database before a live loop's lease could lapse.
    renew_seconds: float = 10.0


def find_live_controllers(renewed_at: Mapping[str, float], now: float, ttl_seconds: float) -> frozenset[str]:
    """The loops whose controller row was renewed within the TTL."""
    return frozenset(loop_id for loop_id, at in renewed_at.items() if now - at < ttl_seconds)


def plan_leases(leases: Sequence[Lease], now: float, me: str, live_controllers: Mapping[str, float],
                settings: LeaseSettings, *, stopping: bool = False) -> LeasePlan:
    """This loop's lease step. ``leases``: one per service (``Store.list_leases``); ``live_controllers``:
    every loop's last renewal (``Store.list_controllers``), this one's included once it has written it.

    - Every ``renew_seconds`` the loop renews every lease it holds and its controller row.
    - It claims free leases (never claimed, released, expired) up to its fair share, ceil(services / live
      loops): 10 services, 3 live loops -> at most 4 each, so new services spread instead of all going to
      whichever loop looks first. A loop's own expired lease is claimed again like any other (its token
      grows: what it was doing while paused may not commit).
    - It hands one lease per pass back when it holds more than its share, or 2 more than the least loaded
      live loop while none is free (4 services: 2, 2, 0 -> the first releases one, the third claims it:
      1, 2, 1): a loop that joins gets work without a stampede of releases.
    - ``stopping``: it releases everything it holds (`controller down`, SIGTERM), so the others need not
      wait for the TTL.
    """
    mine = [lease for lease in leases if lease.is_held_by(me, now)]
    if stopping:
        return LeasePlan(releases=tuple(mine), held=tuple(mine))
    last = live_controllers.get(me)
    heartbeat = last is None or now - last >= settings.renew_seconds
    renewals = tuple(mine) if heartbeat else ()
    live = find_live_controllers(live_controllers, now, settings.ttl_seconds) | {me}
    share = math.ceil(len(leases) / len(live)) if leases else 0
    free = [lease for lease in leases if lease.is_free(now)]
    if len(mine) < share:
        return LeasePlan(claims=tuple(free[:share - len(mine)]), renewals=renewals, heartbeat=heartbeat,
                         held=tuple(mine))
    loads = Counter(lease.owner for lease in leases if lease.owner in live and lease.expires_at > now)
    least = min((loads.get(loop_id, 0) for loop_id in live if loop_id != me), default=len(mine))
    # While a lease is free the least loaded loop takes that one: handing another over would only churn.
    if mine and (len(mine) > share or (not free and len(mine) >= least + 2)):
        handed = mine[-1]  # the last by name: deterministic, and tests can name it
        return LeasePlan(renewals=tuple(lease for lease in renewals if lease != handed), releases=(handed,),
                         heartbeat=heartbeat, held=tuple(mine))
    return LeasePlan(renewals=renewals, heartbeat=heartbeat, held=tuple(mine))


def new_loop_id() -> str:
    """A loop's id: its host and pid (what an operator recognizes in `controller status`) and a random part
    (a pid is reused after a restart; the new loop must not inherit the old one's leases)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class LeaseStore(Protocol):
    """What ``LeaseHolder`` needs of the store (``state.store.Store`` is one)."""

    def list_leases(self) -> list[Lease]: ...

    def list_controllers(self) -> dict[str, float]: ...

    def apply_leases(self, me: str, host: str, plan: LeasePlan, now: float, ttl_seconds: float
                     ) -> dict[str, int]: ...

    def forget_controller(self, loop_id: str) -> None: ...


class LeaseHolder:
    """One loop's leases across passes: ``reconcile_leases`` at the start of each pass returns the ``Fence``
    the pass plans and writes with; ``release_all`` when the loop stops. Not thread-safe."""

    def __init__(self, store: LeaseStore, clock: Clock, loop_id: str, host: str,
                 settings: LeaseSettings | None = None) -> None:
        self._store = store
        self._clock = clock
        self.loop_id = loop_id
        self._host = host
        self._settings = settings or LeaseSettings()

    def reconcile_leases(self) -> Fence:
        """Read every lease and live loop, apply this loop's ``plan_leases``, and return what it holds now.
        A steady pass between renewals reads two tables and writes nothing."""
        now = self._clock.now()
        plan = plan_leases(self._store.list_leases(), now, self.loop_id, self._store.list_controllers(),
                           self._settings)
        if plan.is_empty:
            return Fence(self.loop_id, {lease.service: lease.token for lease in plan.held})
        held = self._store.apply_leases(self.loop_id, self._host, plan, now, self._settings.ttl_seconds)
        taken = sorted(set(held).difference(lease.service for lease in plan.held))
        if taken:
            log.info("loop %s now owns %s", self.loop_id, ", ".join(taken))
        for lease in plan.releases:
            log.info("loop %s hands service %s over", self.loop_id, lease.service)
        return Fence(self.loop_id, held)

    def release_all(self) -> None:
        """Hand every lease back and remove this loop's controller row (a clean stop)."""
        now = self._clock.now()
        plan = plan_leases(self._store.list_leases(), now, self.loop_id, {}, self._settings, stopping=True)
        self._store.apply_leases(self.loop_id, self._host, plan, now, self._settings.ttl_seconds)
        self._store.forget_controller(self.loop_id)
