"""Resolving a task's resource candidates to placements: what each need lands on, in which order, and the
errors; then the launch plan `serve up --dry-run` prints."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import yaml

from skyserve_lite.catalog import load_catalog
from skyserve_lite.errors import SpecError
from skyserve_lite.plan.placement import DEFAULT_IMAGES, plan_launch, resolve_placements
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.spec.placement import Placement, Resolution

NO_DEFAULTS: Mapping[str, str | None] = {}


def task(resources: dict[str, object], **service: object) -> str:
    return yaml.safe_dump({"resources": resources, "run": "serve", "service": service or {"replicas": 1}})


def resolve(text: str, regions: Mapping[str, str | None] = NO_DEFAULTS) -> Resolution:
    return resolve_placements(parse_task(text), "t.yaml", regions, load_catalog)


@pytest.mark.parametrize(("resources", "expected"), [
    pytest.param({"cloud": "aws", "accelerators": "A100:8"}, [("p4d.24xlarge", "us-east-1", 32.7726)],
                 id="aws-a100x8"),
    pytest.param({"cloud": "aws"}, [("m6i.2xlarge", "us-east-1", 0.384)], id="aws-nothing-asked-is-the-default"),
    pytest.param({"cloud": "aws", "cpus": 4, "memory": 16}, [("m6i.xlarge", "us-east-1", 0.192)], id="aws-exact"),
    pytest.param({"cloud": "aws", "accelerators": {"A10G": 1, "L4": 1}},
                 [("g6.xlarge", "us-east-1", 0.8048), ("g5.xlarge", "us-east-1", 1.006)],
                 id="any-of-cheapest-first"),
    pytest.param({"cloud": "aws", "accelerators": ["A10G:1", "L4:1"]},
                 [("g5.xlarge", "us-east-1", 1.006), ("g6.xlarge", "us-east-1", 0.8048)],
                 id="ordered-as-written"),
    pytest.param({"cloud": "aws", "ordered": [{"region": "us-west-2"}, {"region": "us-east-2"}], "cpus": "2+"},
                 [("m6i.large", "us-west-2", 0.096), ("m6i.large", "us-east-2", 0.096)], id="ordered-regions"),
    pytest.param({"infra": "gcp", "accelerators": "L4:1"}, [("g2-standard-4", "us-central1", None)],
                 id="gcp-l4"),
    pytest.param({"infra": "gcp/us-central1", "accelerators": "A100-80GB:8"}, [("a2-ultragpu-8g", "us-central1", None)],
                 id="gcp-a100-80gb"),
])
def test_need_lands_on(resources: dict[str, object], expected: list[tuple[str, str, float | None]]) -> None:
    placements = resolve(task(resources)).ondemand
    got = [(p.instance_type, p.region, p.price_per_hour) for p in placements]
    assert [(t, r) for t, r, _ in got] == [(t, r) for t, r, _ in expected]
    for (_, _, price), (_, _, want) in zip(got, expected, strict=True):
        if want is not None:
            assert price == pytest.approx(want)
        else:
            assert price is not None and price > 0


def test_a_default_region_from_the_environment_is_where_a_regionless_candidate_runs() -> None:
    [placement] = resolve(task({"cloud": "aws", "cpus": "2+"}), {"aws": "us-west-2"}).ondemand
    assert placement.region == "us-west-2"
    assert placement.zones and all(zone.startswith("us-west-2") for zone in placement.zones)


def test_images_default_per_cloud_arch_and_gpu_and_a_named_one_wins() -> None:
    [cpu] = resolve(task({"cloud": "aws"})).ondemand
    assert cpu.image == DEFAULT_IMAGES[("aws", "x86_64", False)] and cpu.image_is_default
    [gpu] = resolve(task({"cloud": "aws", "accelerators": "T4:1"})).ondemand
    assert gpu.image == DEFAULT_IMAGES[("aws", "x86_64", True)] and "nvidia" in gpu.image
    [arm] = resolve(task({"cloud": "aws", "instance_type": "m6g.large"})).ondemand
    assert arm.image == DEFAULT_IMAGES[("aws", "arm64", False)]
    [named] = resolve(task({"cloud": "aws", "image_id": "ami-0123"})).ondemand
    assert named.image == "ami-0123" and not named.image_is_default
    [gce] = resolve(task({"infra": "gcp"})).ondemand
    assert gce.image is not None and gce.image.startswith("projects/ubuntu-os-cloud/")


@pytest.mark.parametrize(("resources", "disk"), [
    pytest.param({"cloud": "aws", "disk_tier": "high", "disk_size": 100}, ("gp3", 7000, 437), id="aws-high"),
    pytest.param({"cloud": "aws", "disk_tier": "best"}, ("io2", 20000, None), id="aws-best"),
    pytest.param({"infra": "gcp", "disk_tier": "high"}, ("pd-ssd", None, None), id="gcp-high"),
    pytest.param({"cloud": "aws"}, (None, None, None), id="no-tier-keeps-the-image-disk"),
])
def test_disk_tier(resources: dict[str, object], disk: tuple[str | None, int | None, int | None]) -> None:
    [placement] = resolve(task(resources)).ondemand
    assert (placement.disk_type, placement.disk_iops, placement.disk_throughput) == disk


def test_spot_tasks_get_a_placement_list_per_market() -> None:
    resolution = resolve(task({"cloud": "aws", "use_spot": True, "accelerators": "A10G:1"}))
    assert [p.is_spot for p in resolution.ondemand] == [False]
    assert [p.is_spot for p in resolution.spot] == [True]
    assert resolution.for_market(True) == resolution.spot and resolution.for_market(False) == resolution.ondemand


def test_a_candidate_the_cloud_lacks_is_left_out_saying_why() -> None:
    resolution = resolve(task({"cloud": "aws", "any_of": [{"accelerators": "Z100:1"}, {"accelerators": "T4:1"}]}))
    assert [p.instance_type for p in resolution.ondemand] == ["g4dn.xlarge"]
    [reason] = resolution.skipped
    assert reason.startswith("Z100:1: ")


@pytest.mark.parametrize(("resources", "field", "message"), [
    pytest.param({"accelerators": "A100:1"}, "resources.accelerators",
                 "the local cloud runs replicas as processes on this machine, without accelerators", id="local-gpu"),
    pytest.param({"cloud": "aws", "accelerators": {"Z100": 1, "Y200": 2}}, "resources.accelerators",
                 "no candidate fits on aws (candidates considered: Y200:2: no aws instance type has Y200",
                 id="none-fits-names-every-candidate"),
    pytest.param({"cloud": "aws", "accelerators": "A100:3"}, "resources.accelerators", "A100", id="count-not-offered"),
    pytest.param({"cloud": "aws", "instance_type": "m99.huge"}, "resources.instance_type", "m99.huge",
                 id="unknown-type"),
    pytest.param({"cloud": "aws", "region": "eu-west-1", "cpus": "4+"}, "resources.region", "priced in: us-east-1",
                 id="unpriced-region"),
])
def test_no_placement_is_an_error_naming_the_field(resources: dict[str, object], field: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        resolve(task(resources))
    assert caught.value.path == field
    assert message in caught.value.problem


def test_local_tasks_have_one_local_placement_whatever_shape_they_ask() -> None:
    resolution = resolve(task({"cpus": "4+", "memory": "16+"}))
    assert resolution.ondemand == (Placement(cloud="local"),)
    assert resolution.ondemand[0].describe() == "local process on this machine"


def test_resolution_survives_its_json() -> None:
    resolution = resolve(task({"cloud": "aws", "use_spot": True, "disk_tier": "high",
                               "accelerators": {"A10G": 1, "Z100": 1}}))
    assert Resolution.from_json(resolution.to_json()) == resolution


def test_placement_describes_need_machine_place_price_and_market() -> None:
    [placement] = resolve(task({"cloud": "aws", "accelerators": "A100:8"})).ondemand
    assert placement.describe() == "A100:8 -> p4d.24xlarge (us-east-1, $32.77/h, on-demand)"


# resources -> what the plan says of the first placement: the need, the sizing rule that chose, the machine
@pytest.mark.parametrize(("resources", "described"), [
    pytest.param({"cloud": "aws"}, "the default instance type (no resources given: SkyPilot's default 8 vCPUs, "
                                   "32 GiB) -> m6i.2xlarge (us-east-1, $0.38/h, on-demand)", id="aws-nothing"),
    pytest.param({"cloud": "aws", "cpus": "4+"}, "cpus 4+ (memory not given: 4 GiB per vCPU, SkyPilot's CPU "
                                                 "families) -> m6i.xlarge (us-east-1, $0.19/h, on-demand)",
                 id="aws-cpus-only"),
    pytest.param({"cloud": "aws", "cpus": "4+", "memory": "8+"},
                 "cpus 4+, memory 8+GB (SkyPilot's CPU families) -> c6i.xlarge (us-east-1, $0.17/h, on-demand)",
                 id="aws-cpus-and-memory"),
    pytest.param({"infra": "gcp", "cpus": "2+"}, "cpus 2+ (memory not given: 4 GiB per vCPU, SkyPilot's CPU "
                                                 "families) -> n2-standard-2 (us-central1, $0.10/h, on-demand)",
                 id="gcp-cpus-only"),
    pytest.param({"infra": "gcp"}, "the default instance type (no resources given: SkyPilot's default 8 vCPUs, "
                                   "32 GiB) -> n2-standard-8 (us-central1, $0.39/h, on-demand)", id="gcp-nothing"),
    pytest.param({"cloud": "aws", "instance_type": "t3.micro"},
                 "t3.micro -> t3.micro (us-east-1, $0.01/h, on-demand)", id="named-type-no-rule"),
    pytest.param({"cloud": "aws", "accelerators": "T4:1", "cpus": "4+"},
                 "T4:1, cpus 4+ -> g4dn.xlarge (us-east-1, $0.53/h, on-demand)", id="accelerator-no-rule"),
])
def test_the_plan_says_which_sizing_rule_chose(resources: dict[str, object], described: str) -> None:
    placement = resolve(task(resources)).ondemand[0]
    assert placement.describe() == described
    assert Placement.from_json(placement.to_json()) == placement


def test_a_placement_stored_before_sizing_was_recorded_reads_without_it() -> None:
    stored = {"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"], "instance_type": "t3.micro",
              "price_per_hour": 0.0104, "image": "ami-1", "need": "cpus 2+"}
    placement = Placement.from_json(stored)
    assert (placement.instance_type, placement.sizing) == ("t3.micro", "")
    assert placement.describe() == "cpus 2+ -> t3.micro (us-east-1, $0.01/h, on-demand)"
    assert placement.to_json() == stored  # written back as it was: no empty field added


@pytest.mark.parametrize(("resources", "policy", "markets"), [
    pytest.param({"cloud": "aws"}, {"replicas": 2}, ["on-demand", "on-demand"], id="fixed"),
    pytest.param({"cloud": "aws", "use_spot": True},
                 {"replica_policy": {"min_replicas": 3, "max_replicas": 5, "target_qps_per_replica": 1,
                                     "base_ondemand_fallback_replicas": 1}},
                 ["on-demand", "spot", "spot"], id="spot-with-base-fallback"),
    pytest.param({"cloud": "aws", "use_spot": True},
                 {"replica_policy": {"min_replicas": 2, "max_replicas": 4, "target_qps_per_replica": 1,
                                     "dynamic_ondemand_fallback": True}},
                 ["on-demand", "on-demand", "spot", "spot"], id="dynamic-fallback-covers-unready-spot"),
    pytest.param({"cloud": "aws"}, {"replica_policy": {"min_replicas": 1, "max_replicas": 3,
                                                       "target_qps_per_replica": 1, "num_overprovision": 1}},
                 ["on-demand", "on-demand"], id="overprovision"),
])
def test_launch_plan_starts_the_initial_target_split_by_market(resources: dict[str, object],
                                                                policy: dict[str, object], markets: list[str]) -> None:
    spec = parse_task(task(resources, **policy))
    spec = spec.__class__(**{**spec.__dict__, "resolution": resolve_placements(spec, "t", NO_DEFAULTS, load_catalog)})
    plan = plan_launch("svc", spec)
    assert [r.market for r in plan.replicas] == markets
    assert [r.replica for r in plan.replicas] == list(range(1, len(markets) + 1))
    assert all(p.is_spot == (r.market == "spot") for r in plan.replicas for p in r.placements)
    if "spot" in markets:  # the shipped catalog has no spot prices: the total is unknown, not on-demand's
        assert plan.hourly_price is None
        assert "spot price not in catalog" in plan.replicas[-1].placements[0].describe()
    else:
        assert plan.hourly_price == pytest.approx(0.384 * len(markets))
    assert plan.to_json()["replicas"][0]["placements"][0]["instance_type"] == "m6i.2xlarge"


def test_a_region_the_catalog_lacks_takes_a_named_type_as_written_unpriced() -> None:
    [placement] = resolve(task({"infra": "gcp/europe-west1", "instance_type": "n1-standard-4"})).ondemand
    assert (placement.region, placement.instance_type, placement.price_per_hour) == ("europe-west1", "n1-standard-4",
                                                                                      None)
    assert placement.zones == ()  # the provider lists the region's zones
    assert placement.describe() == "n1-standard-4 -> n1-standard-4 (europe-west1, price not in catalog, on-demand)"
    [default] = resolve(task({"infra": "gcp/europe-west1"})).ondemand
    assert default.instance_type == "n2-standard-8"
    assert default.sizing == "no resources given: SkyPilot's default 8 vCPUs, 32 GiB"
    with pytest.raises(SpecError) as caught:  # a need only the catalog can answer
        resolve(task({"infra": "gcp/europe-west1", "cpus": "4+"}))
    assert caught.value.path == "resources.region"
    for cloud, region in (("aws", "us-east-7"), ("gcp", "uscentral")):  # typos, refused as before
        with pytest.raises(SpecError) as caught:
            resolve(task({"infra": f"{cloud}/{region}", "instance_type": "m5.large"}))
        assert caught.value.path in ("resources.region", "resources.instance_type")
