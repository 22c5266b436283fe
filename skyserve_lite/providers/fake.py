"""An in-memory provider that records every call and lets tests script what happens.

It is a peer of the real providers: the controller cannot tell it apart. Tests drive it with
``set_state`` (a process exits, a spot instance is preempted), ``fail_next_launch`` (the next launch
outcomes fail), ``fail_inventory`` (the next ``list_instances`` raises) and ``logs`` (what ``read_log``
finds), then assert on ``calls``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from skyserve_lite.errors import TransientProviderError
from skyserve_lite.providers import cloud
from skyserve_lite.providers.base import Instance, InstanceState, LaunchOutcome, LaunchRequest, ReplicaLog


@dataclass(frozen=True)
class Call:
    """One recorded call: its name and arguments in a comparable form."""

    method: str
    args: tuple[object, ...] = ()


@dataclass
class FakeProvider:
    name: str = "fake"
    # Instances start RUNNING (a workload that boots at once) unless told otherwise.
    initial_state: InstanceState = InstanceState.RUNNING
    instances: dict[str, Instance] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    logs: dict[tuple[str, int], ReplicaLog] = field(default_factory=dict)  # (service, replica id) -> its log
    # Eventual consistency: instances launched while ``lagging`` is set are not listed by
    # ``list_instances`` until ``catch_up`` (as EC2's DescribeInstances lags RunInstances).
    lagging: bool = False
    unlisted: set[str] = field(default_factory=set)
    # Whether a lookup by id (``find_instances``) sees unlisted instances; False: it lags as well.
    found_by_id: bool = True
    # Instance types with no capacity in any zone. While set, launches go through ``cloud.launch_in_batches``
    # over each request's placements (the fake is then a batching cloud: every region and zone exists).
    full_types: set[str] = field(default_factory=set)
    _next_id: int = 1
    # The instances of each (service, replica id): a launch's adoption check looks at those, not at every
    # instance (a scan that made launching 10,000 replicas quadratic: 13.5 s of a 16 s pass).
    _by_replica: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    _launch_failures: list[tuple[str, bool]] = field(default_factory=list)
    _inventory_failures: int = 0

    # --- scripting -------------------------------------------------------------------------------
    def fail_next_launch(self, error: str, *, permanent: bool, times: int = 1) -> None:
        self._launch_failures.extend([(error, permanent)] * times)

    def fail_inventory(self, times: int = 1) -> None:
        self._inventory_failures += times

    def set_state(self, instance_id: str, state: InstanceState, detail: str | None = None) -> None:
        self.instances[instance_id] = dataclasses.replace(self.instances[instance_id], state=state,
                                                          detail=detail)

    def add_instance(self, instance: Instance) -> None:
        """An instance the controller did not launch through this object (crash recovery tests)."""
        self.instances[instance.instance_id] = instance
        self._by_replica.setdefault((instance.service, instance.replica_id), []).append(instance.instance_id)

    def instance_for(self, service: str, replica_id: int) -> Instance:
        return next(i for i in self.instances.values()
                    if i.service == service and i.replica_id == replica_id)

    def calls_to(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    # --- Provider --------------------------------------------------------------------------------
    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        self.calls.append(Call("launch", tuple((r.service, r.replica_id, r.version) for r in requests)))
        if self.full_types:
            return cloud.launch_in_batches(self, requests, "fake-region", fits=lambda _batch: True,
                                           no_region="no region")
        return [self._launch_one(request) for request in requests]

    def _launch_one(self, request: LaunchRequest, region: str | None = None, zone: str | None = None,
                    detail: str | None = None) -> LaunchOutcome:
        existing = self._live(request.service, request.replica_id)
        if existing is not None:
            return LaunchOutcome(request.replica_id, instance=existing)
        if self._launch_failures:
            error, permanent = self._launch_failures.pop(0)
            return LaunchOutcome(request.replica_id, error=error, permanent=permanent)
        instance_id = f"fake-{self._next_id}"
        self._next_id += 1
        instance = Instance(
            instance_id=instance_id, service=request.service, replica_id=request.replica_id,
            version=request.version, state=self.initial_state,
            url=f"http://fake-replica.invalid/{instance_id}", is_spot=request.is_spot, region=region, zone=zone,
            detail=detail,
        )
        self.instances[instance_id] = instance
        self._by_replica.setdefault((request.service, request.replica_id), []).append(instance_id)
        if self.lagging:
            self.unlisted.add(instance_id)
        return LaunchOutcome(request.replica_id, instance=instance)

    def _live(self, service: str, replica_id: int) -> Instance | None:
        live = (self.instances[i] for i in self._by_replica.get((service, replica_id), ()))
        return next((i for i in live if i.state is not InstanceState.TERMINATED), None)

    # --- cloud.BatchCloud, while ``full_types`` is set ---------------------------------------------------
    def find_launched(self, region: str, tokens: Collection[str]) -> dict[tuple[str, int, str], Instance]:
        return {}  # adoption is by (service, replica id) in ``_launch_one``

    def launch_group(self, group: cloud.LaunchGroup) -> list[LaunchOutcome]:
        instance_type = group.placement.instance_type or "default"

        def launch_in(zone: str, detail: str | None) -> list[LaunchOutcome]:
            if instance_type in self.full_types:
                raise cloud.ZoneCapacityError(f"no capacity for {instance_type} in {zone}", "NoCapacity")
            return [self._launch_one(r, group.region, zone, detail) for r in group.requests]

        return cloud.launch_across_zones(group, group.placement.zone_order or (f"{group.region}-a",), instance_type,
                                         launch_in)

    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        self.calls.append(Call("list_instances"))
        if self._inventory_failures:
            self._inventory_failures -= 1
            raise TransientProviderError("scripted inventory failure")
        return [i for i in self.instances.values()
                if i.state is not InstanceState.TERMINATED and i.instance_id not in self.unlisted]

    def find_instances(self, instance_ids: Sequence[str], regions: Collection[str] = ()) -> list[Instance]:
        """By id, the unlisted ones too (a lookup by id sees what a lagging listing does not)."""
        self.calls.append(Call("find_instances", tuple(sorted(instance_ids))))
        return [self.instances[i] for i in instance_ids
                if i in self.instances and (self.found_by_id or i not in self.unlisted)]

    def catch_up(self) -> None:
        """The inventory lists every instance from now on."""
        self.lagging = False
        self.unlisted.clear()

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self.calls.append(Call("terminate", tuple(sorted(instance_ids))))
        for instance_id in instance_ids:
            if instance_id in self.instances:
                self.set_state(instance_id, InstanceState.TERMINATED)

    def release_service(self, service: str) -> None:
        self.calls.append(Call("release_service", (service,)))
        self.released.append(service)

    def read_log(self, service: str, replica_id: int, instance_id: str | None,
                 region: str | None) -> ReplicaLog | None:
        self.calls.append(Call("read_log", (service, replica_id, instance_id, region)))
        return self.logs.get((service, replica_id))

    def abandon(self) -> None:
        self.calls.append(Call("abandon"))
