"""``cloud.launch_in_batches`` across a request's placements, against a recording cloud: a placement whose zones
have no capacity passes the request on to the next, adoption looks in every placement's region, and the
instance says where it landed and what had no capacity."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from skyserve_lite.errors import PermanentProviderError
from skyserve_lite.providers import cloud
from skyserve_lite.providers.base import Instance, InstanceState, LaunchOutcome, LaunchRequest
from skyserve_lite.providers.cloud import LaunchGroup, ZoneCapacityError
from skyserve_lite.spec.model import Cloud, Resources, ServiceSpec, TaskSpec
from skyserve_lite.spec.placement import Placement, Resolution

G6 = Placement(cloud="aws", candidate=0, region="us-east-1", zones=("us-east-1a", "us-east-1b"),
               instance_type="g6.xlarge", price_per_hour=0.8, need="L4:1")
G5 = Placement(cloud="aws", candidate=1, region="us-west-2", zones=("us-west-2a",), instance_type="g5.xlarge",
               price_per_hour=1.0, need="A10G:1")


@dataclass
class RecordingCloud:
    """Launches succeed unless the instance type is in ``full``; every call is recorded."""

    full: set[str] = field(default_factory=set)
    launched: list[tuple[str, str, str, tuple[int, ...]]] = field(default_factory=list)  # type, region, zone, ids
    lookups: list[str] = field(default_factory=list)
    existing: dict[str, dict[tuple[str, int, str], Instance]] = field(default_factory=dict)

    def find_launched(self, region: str, tokens: Collection[str]) -> dict[tuple[str, int, str], Instance]:
        self.lookups.append(region)
        return self.existing.get(region, {})

    def launch_group(self, group: LaunchGroup) -> list[LaunchOutcome]:
        instance_type = group.placement.instance_type or "?"

        def launch_in(zone: str, detail: str | None) -> list[LaunchOutcome]:
            if instance_type in self.full:
                raise ZoneCapacityError(f"no {instance_type} in {zone}", "InsufficientInstanceCapacity")
            self.launched.append((instance_type, group.region, zone, group.replica_ids))
            return [LaunchOutcome(r.replica_id, instance=Instance(
                f"i-{r.replica_id}", r.service, r.replica_id, r.version, InstanceState.PENDING,
                region=group.region, zone=zone, detail=detail)) for r in group.requests]

        return cloud.launch_across_zones(group, group.placement.zone_order, instance_type, launch_in)


def request(replica_id: int, placements: Sequence[Placement] = (G6, G5)) -> LaunchRequest:
    spec = TaskSpec(run="serve", service=ServiceSpec(), resources=Resources(cloud=Cloud.AWS),
                    resolution=Resolution(ondemand=tuple(placements)))
    return LaunchRequest(service="svc", replica_id=replica_id, version=1, spec=spec, launch_token="tok",
                         is_spot=False)


def launch(fake: RecordingCloud, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
    return cloud.launch_in_batches(fake, requests, None, fits=lambda batch: True, no_region="no region")


def test_the_first_placement_with_capacity_is_used_and_nothing_else_is_tried() -> None:
    fake = RecordingCloud()
    outcomes = launch(fake, [request(1), request(2)])
    assert fake.launched == [("g6.xlarge", "us-east-1", "us-east-1a", (1, 2))]
    assert all(o.instance is not None and o.instance.detail is None for o in outcomes)


def test_no_capacity_on_the_first_candidate_falls_back_to_the_next_and_says_so() -> None:
    fake = RecordingCloud(full={"g6.xlarge"})
    outcomes = launch(fake, [request(1), request(2)])
    assert fake.launched == [("g5.xlarge", "us-west-2", "us-west-2a", (1, 2))]
    for outcome in outcomes:
        assert outcome.instance is not None and outcome.instance.region == "us-west-2"
        detail = outcome.instance.detail or ""
        assert detail.startswith("landed on candidate 2: A10G:1 -> g5.xlarge (us-west-2, $1.00/h, on-demand)")
        assert "no capacity before: L4:1 -> g6.xlarge (us-east-1" in detail
        assert "tried us-east-1a: InsufficientInstanceCapacity; us-east-1b: InsufficientInstanceCapacity" in detail


def test_no_capacity_anywhere_is_one_transient_outcome_naming_every_candidate() -> None:
    fake = RecordingCloud(full={"g6.xlarge", "g5.xlarge"})
    [outcome] = launch(fake, [request(1)])
    assert outcome.instance is None and not outcome.permanent and outcome.no_capacity
    assert outcome.error is not None
    assert outcome.error.startswith("no on-demand capacity for g5.xlarge in us-west-2")
    assert "(and before it: L4:1 -> g6.xlarge" in outcome.error


def test_an_instance_an_earlier_attempt_started_on_a_later_candidate_is_adopted() -> None:
    adopted = Instance("i-old", "svc", 1, 1, InstanceState.RUNNING, region="us-west-2")
    fake = RecordingCloud(existing={"us-west-2": {("svc", 1, "tok"): adopted}})
    [outcome] = launch(fake, [request(1)])
    assert outcome.instance is not None and outcome.instance.instance_id == "i-old"
    # what it landed on comes from the placement of its region, as for a fresh launch
    assert (outcome.instance.instance_type, outcome.instance.accelerator) == ("g5.xlarge", None)
    assert sorted(fake.lookups) == ["us-east-1", "us-west-2"]  # one lookup per region of the placements
    assert fake.launched == []


def test_requests_without_a_resolution_use_the_task_fields_as_before() -> None:
    spec = TaskSpec(run="serve", service=ServiceSpec(), resources=Resources(cloud=Cloud.AWS, zone="us-east-1c",
                                                                             instance_type="m5.large"))
    legacy = LaunchRequest(service="svc", replica_id=1, version=1, spec=spec, launch_token="tok", is_spot=False)
    fake = RecordingCloud()
    [outcome] = cloud.launch_in_batches(fake, [legacy], "us-east-1", fits=lambda b: True, no_region="x")
    assert outcome.instance is not None
    assert fake.launched == [("m5.large", "us-east-1", "us-east-1c", (1,))]
    [none] = cloud.launch_in_batches(RecordingCloud(), [legacy], None, fits=lambda b: True, no_region="no region")
    assert none.permanent and none.error == "no region"


@dataclass
class PartlyReachable(RecordingCloud):
    """A cloud whose inventory cannot be read in ``down`` regions."""

    down: set[str] = field(default_factory=set)

    def find_launched(self, region: str, tokens: Collection[str]) -> dict[tuple[str, int, str], Instance]:
        if region in self.down:
            raise PermanentProviderError(f"AuthFailure in {region}")
        return super().find_launched(region, tokens)


def test_an_unreachable_fallback_region_does_not_fail_a_launch_in_the_first() -> None:
    fake = PartlyReachable(down={"us-west-2"})
    [outcome] = launch(fake, [request(1)])
    assert outcome.instance is not None and outcome.instance.region == "us-east-1"
    [first_down] = launch(PartlyReachable(down={"us-east-1"}), [request(2)])
    assert first_down.instance is None and first_down.permanent and "AuthFailure in us-east-1" in (
        first_down.error or "")
