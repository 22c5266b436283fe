"""Services whose last pass decided nothing, and what that pass read of them.

A service's pass is its replicas' own steps (``plan_replica``, each asked again every pass: probes,
instances and the clock move), then the steps over the service as a whole: reuse, the autoscaler, scaling
per market, the rollout, pruning, launches, the load balancer and the status. Those later steps read the
snapshot, the replicas' steps and the autoscaler's decision, and the clock only to stamp what they change.
So when a pass reads the very same rows of a service as the last pass did (the store hands back the same
decoded values while a row is unchanged), every replica's step leaves its row as it was, and the
autoscaler's decision is the one already stored, the later steps decide what they decided last time:
nothing. ``plan_service_pass`` then takes only the replicas' steps and the autoscaler's, which is what keeps
a pass over 1,000 settled services of 10 replicas from planning each service whole every two seconds.

What counts as "the very same": the service row and the replica rows by identity (the store decodes a row
again only when it changed), the specs of the versions by identity (``VersionCache``), the rest by value.
Remembered for one pass: an entry not carried into the next pass is forgotten (a service deleted, or one
whose pass decided something).
"""

from __future__ import annotations

from dataclasses import dataclass

from skyserve_lite.controller.pass_types import ServiceSnapshot
from skyserve_lite.controller.service_steps import StepCensus


@dataclass(frozen=True, slots=True)
class _Settled:
    """The snapshot a pass that decided nothing read of one service, and the census of its steps."""

    snapshot: ServiceSnapshot
    known_clouds: frozenset[str]
    census: StepCensus

    def holds_for(self, snapshot: ServiceSnapshot, known_clouds: frozenset[str]) -> bool:
        """Whether ``snapshot`` holds what the later steps read, as this one did (its metrics are the
        autoscaler's, asked again every pass)."""
        last, versions = self.snapshot, snapshot.versions
        if snapshot is last:  # read again over the very same rows (``snapshots.read_snapshot``)
            return known_clouds == self.known_clouds
        return (snapshot.service is last.service and snapshot.replicas is last.replicas
                and len(versions) == len(last.versions)
                and all(versions.get(number) is spec for number, spec in last.versions.items())
                and snapshot.lb_alive == last.lb_alive and snapshot.mode is last.mode
                and snapshot.autoscaler == last.autoscaler and snapshot.observed == last.observed
                and snapshot.reuse_identical_files == last.reuse_identical_files
                and snapshot.terminate_requested == last.terminate_requested
                and known_clouds == self.known_clouds)


class SettledServices:
    """The settled services of the last pass (``find``) and of this one (``remember``); ``next_pass``
    makes this pass's the last pass's. Not thread-safe: one per controller loop."""

    def __init__(self) -> None:
        self._last: dict[str, _Settled] = {}
        self._this: dict[str, _Settled] = {}

    def next_pass(self) -> None:
        self._last, self._this = self._this, {}

    def find(self, snapshot: ServiceSnapshot, known_clouds: frozenset[str]) -> StepCensus | None:
        """The census of the service's steps when the last pass decided nothing over these very rows."""
        settled = self._last.get(snapshot.service.name)
        if settled is None or not settled.holds_for(snapshot, known_clouds):
            return None
        return settled.census

    def carry(self, snapshot: ServiceSnapshot) -> None:
        """This pass decided nothing again for a service ``find`` found settled: it stays settled."""
        name = snapshot.service.name
        self._this[name] = self._last[name]

    def remember(self, snapshot: ServiceSnapshot, known_clouds: frozenset[str], census: StepCensus) -> None:
        """This pass decided nothing for the service, over ``snapshot``: every step kept its row."""
        self._this[snapshot.service.name] = _Settled(snapshot, known_clouds, census)
