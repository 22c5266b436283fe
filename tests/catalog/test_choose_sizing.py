"""SkyPilot's sizing of CPU-only tasks: its instance families only (no burstable or shared-core type), 4 GiB per
vCPU when memory is not given, 8 vCPUs and 32 GiB when nothing is; and which rule chose (``describe_sizing``)."""

from __future__ import annotations

import pytest

from skyserve_lite.catalog import Catalog, InstanceOffer, Need, describe_sizing, load_catalog
from skyserve_lite.catalog.choose import SIZED_BY_DEFAULT, SIZED_BY_FAMILIES, SIZED_BY_MEMORY_RATIO

# (cloud, need, default region) -> (instance type, hourly price, the rule that chose)
SHIPPED = [
    # t3.micro ($0.0104, 1 GiB) was the choice before: burstable types are never chosen by a need
    pytest.param("aws", Need(cpus=2, cpus_at_least=True), "us-east-1", ("m6i.large", 0.096, SIZED_BY_MEMORY_RATIO),
                 id="aws-cpus-2+"),
    # 4 GiB per vCPU: c6i.xlarge ($0.17, 8 GiB) is left out, m6i.xlarge has 16
    pytest.param("aws", Need(cpus=4, cpus_at_least=True), "us-east-1", ("m6i.xlarge", 0.192, SIZED_BY_MEMORY_RATIO),
                 id="aws-cpus-4+"),
    pytest.param("aws", Need(cpus=8), "us-east-1", ("m6i.2xlarge", 0.384, SIZED_BY_MEMORY_RATIO), id="aws-cpus-8"),
    # memory given: no ratio, and the compute family is the cheapest (t3.xlarge, $0.1664, before)
    pytest.param("aws", Need(cpus=4, cpus_at_least=True, memory_gib=8, memory_at_least=True), "us-east-1",
                 ("c6i.xlarge", 0.17, SIZED_BY_FAMILIES), id="aws-cpus-4+-memory-8+"),
    pytest.param("aws", Need(cpus=2, cpus_at_least=True, memory_gib=4, memory_at_least=True), "us-east-1",
                 ("c6i.large", 0.085, SIZED_BY_FAMILIES), id="aws-cpus-2+-memory-4+"),
    pytest.param("aws", Need(memory_gib=64, memory_at_least=True), "us-east-1",
                 ("r6i.2xlarge", 0.504, SIZED_BY_FAMILIES), id="aws-memory-64+"),
    # m5.large before; SkyPilot's default is 8 vCPUs, 32 GiB
    pytest.param("aws", Need(), "us-east-1", ("m6i.2xlarge", 0.384, SIZED_BY_DEFAULT), id="aws-nothing"),
    # e2-highcpu-2 ($0.049468) before; the shared-core e2-micro/small/medium are not of the families either
    pytest.param("gcp", Need(cpus=2, cpus_at_least=True), "us-central1",
                 ("n2-standard-2", 0.097118, SIZED_BY_MEMORY_RATIO), id="gcp-cpus-2+"),
    # n2-highcpu-4 ($0.143392) has 4 GB, 1 per vCPU
    pytest.param("gcp", Need(cpus=4, cpus_at_least=True), "us-central1",
                 ("n2-standard-4", 0.194236, SIZED_BY_MEMORY_RATIO), id="gcp-cpus-4+"),
    pytest.param("gcp", Need(cpus=4, cpus_at_least=True, memory_gib=4, memory_at_least=True), "us-central1",
                 ("n2-highcpu-4", 0.143392, SIZED_BY_FAMILIES), id="gcp-cpus-4+-memory-4+"),
    pytest.param("gcp", Need(memory_gib=64, memory_at_least=True), "us-central1",
                 ("n2-highmem-8", 0.524056, SIZED_BY_FAMILIES), id="gcp-memory-64+"),
    # e2-medium before
    pytest.param("gcp", Need(), "us-central1", ("n2-standard-8", 0.388472, SIZED_BY_DEFAULT), id="gcp-nothing"),
    # what the task names is what it gets, whatever its family or memory: no rule applies
    pytest.param("aws", Need(instance_type="t3.micro"), "us-east-1", ("t3.micro", 0.0104, ""), id="aws-named-t3"),
    pytest.param("gcp", Need(instance_type="e2-medium"), "us-central1", ("e2-medium", 0.033503, ""),
                 id="gcp-named-e2"),
    # accelerators: the GPU type's own vCPUs and memory count, with no ratio and no family
    pytest.param("aws", Need(accelerator="T4"), "us-east-1", ("g4dn.xlarge", 0.526, ""), id="aws-T4"),
    pytest.param("aws", Need(accelerator="L4", cpus=16, cpus_at_least=True), "us-east-1", ("g6.4xlarge", 1.3232, ""),
                 id="aws-L4-cpus-16+"),
    pytest.param("gcp", Need(accelerator="L4"), "us-central1", ("g2-standard-4", 0.70683, ""), id="gcp-L4"),
]


@pytest.mark.parametrize(("cloud", "need", "default_region", "expected"), SHIPPED)
def test_need_lands_on_and_says_which_rule_chose(cloud: str, need: Need, default_region: str,
                                                 expected: tuple[str, float, str]) -> None:
    offer = load_catalog(cloud).choose(need, default_region)
    assert (offer.instance_type, offer.ondemand_price, describe_sizing(cloud, need)) == expected


def offer(instance_type: str, vcpus: float, memory: float, price: float | None, cloud: str = "aws") -> InstanceOffer:
    return InstanceOffer(cloud, instance_type, "r1", ("r1a",), vcpus, memory, None, "x86_64", price, None)


# (offers, need) -> the type chosen in r1
SMALL = [
    # SkyPilot's ratio is of the offer's own vCPUs, not of the cpus asked: "cpus: 2+" does not mean "memory: 8+",
    # which c6i.xlarge (4 vCPUs, 8 GiB) would meet, cheaper
    pytest.param([offer("c6i.xlarge", 4, 8, 0.05), offer("m6i.large", 2, 8, 0.096)], Need(cpus=2, cpus_at_least=True),
                 "m6i.large", id="ratio-per-vcpu-of-the-offer"),
    pytest.param([offer("t3.micro", 2, 1, 0.01), offer("t3a.large", 2, 8, 0.07), offer("t4g.large", 2, 8, 0.06),
                  offer("t2.large", 2, 8, 0.09), offer("m6i.large", 2, 8, 0.096)], Need(cpus=2, cpus_at_least=True),
                 "m6i.large", id="aws-burstable-never"),
    pytest.param([offer("m5.large", 2, 8, 0.096), offer("m6i.large", 2, 8, 0.096)], Need(cpus=2, cpus_at_least=True),
                 "m6i.large", id="aws-older-generation-never"),
    pytest.param([offer("m6id.large", 2, 8, 0.1), offer("m7i.large", 2, 8, 0.09)], Need(cpus=2, memory_gib=8),
                 "m7i.large", id="aws-newer-families-count"),
    pytest.param([offer(t, v, m, p, "gcp") for t, v, m, p in (
        ("e2-micro", 0.25, 1, 0.008), ("e2-small", 0.5, 2, 0.017), ("e2-medium", 1, 4, 0.034),
        ("f1-micro", 0.2, 0.6, 0.0076), ("g1-small", 0.5, 1.7, 0.0257), ("e2-standard-2", 2, 8, 0.067),
        ("n1-standard-2", 2, 7.5, 0.095), ("n4-standard-2", 2, 8, 0.096), ("n2-standard-2", 2, 8, 0.097))],
        Need(memory_gib=1, memory_at_least=True), "n4-standard-2", id="gcp-shared-core-never"),
]


@pytest.mark.parametrize(("offers", "need", "expected"), SMALL)
def test_families_and_ratio(offers: list[InstanceOffer], need: Need, expected: str) -> None:
    assert Catalog.from_offers(offers[0].cloud, offers).choose(need, "r1").instance_type == expected


@pytest.mark.parametrize(("region", "expected"), [
    pytest.param("us-east-1", ["m6i.2xlarge"], id="priced-region"),
    pytest.param("eu-west-1", ["m6i.2xlarge"], id="unpriced-region-still-the-default-type"),
    # no m6i in these regions: SkyPilot's default shape there, 8 vCPUs and 32 GiB, unpriced, by name
    pytest.param("ap-southeast-4", ["m7i.2xlarge", "r7i.2xlarge"], id="no-m6i-m7i"),
    pytest.param("eu-south-2", ["m6id.2xlarge", "m7i.2xlarge"], id="no-m6i-m6id"),
])
def test_nothing_asked_where_the_default_type_is_missing(region: str, expected: list[str]) -> None:
    candidates = load_catalog("aws").candidates(Need(), region)
    assert [o.instance_type for o in candidates[:len(expected)]] == expected
    assert all(o.vcpus >= 8 and o.memory_gib >= 4 * o.vcpus for o in candidates)


@pytest.mark.parametrize(("cloud", "need", "expected"), [
    pytest.param("aws", Need(), SIZED_BY_DEFAULT, id="nothing"),
    pytest.param("aws", Need(region="us-east-1", use_spot=True), SIZED_BY_DEFAULT, id="place-and-market-only"),
    pytest.param("gcp", Need(cpus=4), SIZED_BY_MEMORY_RATIO, id="cpus-alone"),
    pytest.param("gcp", Need(memory_gib=8), SIZED_BY_FAMILIES, id="memory-alone"),
    pytest.param("aws", Need(cpus=4, memory_gib=8), SIZED_BY_FAMILIES, id="both"),
    pytest.param("aws", Need(cpus=4, instance_type="m5.xlarge"), "", id="named-type"),
    pytest.param("aws", Need(cpus=4, accelerator="T4"), "", id="accelerator"),
    pytest.param("lab", Need(cpus=4), "", id="cloud-without-families"),
    pytest.param("lab", Need(), "", id="cloud-without-a-default-type"),
])
def test_describe_sizing(cloud: str, need: Need, expected: str) -> None:
    assert describe_sizing(cloud, need) == expected
