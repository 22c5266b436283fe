"""The chooser over the shipped catalogs: a task's resources -> the instance type it gets, per cloud."""

from __future__ import annotations

import pytest

from skyserve_lite.catalog import CPU_FAMILIES, DEFAULT_INSTANCE_TYPES, Need, load_catalog

# (cloud, need, default region) -> (instance type, region, attached accelerator type, hourly price)
CASES = [
    pytest.param("aws", Need(accelerator="A100", accelerator_count=8), "us-east-1",
                 ("p4d.24xlarge", "us-east-1", None, 32.7726), id="aws-A100:8"),
    pytest.param("aws", Need(accelerator="a100-80gb", accelerator_count=8), "us-east-1",
                 ("p4de.24xlarge", "us-east-1", None, 40.9657), id="aws-A100-80GB:8-any-case"),
    pytest.param("aws", Need(accelerator="V100-32GB", accelerator_count=8), "us-east-1",
                 ("p3dn.24xlarge", "us-east-1", None, 31.212), id="aws-V100-32GB:8"),
    pytest.param("aws", Need(accelerator="H100", accelerator_count=8), "us-west-2",
                 ("p5.48xlarge", "us-west-2", None, 98.32), id="aws-H100:8"),
    # g4dn.xlarge (T4, $0.526) is cheaper than g6.xlarge (L4) and g5.xlarge (A10G) but is not an A10G
    pytest.param("aws", Need(accelerator="A10G"), "us-east-1", ("g5.xlarge", "us-east-1", None, 1.006),
                 id="aws-A10G-count-defaults-to-1"),
    pytest.param("aws", Need(accelerator="T4", accelerator_count=4), "us-east-1",
                 ("g4dn.12xlarge", "us-east-1", None, 3.912), id="aws-T4:4"),
    pytest.param("aws", Need(accelerator="L4", accelerator_count=1, cpus=16, cpus_at_least=True), "us-east-1",
                 ("g6.4xlarge", "us-east-1", None, 1.3232), id="aws-L4:1-cpus-16+"),
    # t3.xlarge $0.1664 is burstable and c6i.xlarge $0.17 has 8 GiB, under 4 per vCPU: m6i.xlarge $0.192
    pytest.param("aws", Need(cpus=4, cpus_at_least=True), "us-east-1", ("m6i.xlarge", "us-east-1", None, 0.192),
                 id="aws-cpus-4+"),
    # m5.xlarge is the same price but not of SkyPilot's families (the name would have picked it)
    pytest.param("aws", Need(cpus=4, memory_gib=16), "us-east-1", ("m6i.xlarge", "us-east-1", None, 0.192),
                 id="aws-cpus-4-memory-16-exact"),
    pytest.param("aws", Need(cpus=4, memory_gib=32), "us-east-1", ("r6i.xlarge", "us-east-1", None, 0.252),
                 id="aws-cpus-4-memory-32"),
    pytest.param("aws", Need(cpus=32, cpus_at_least=True, memory_gib=64), "us-east-1",
                 ("c6i.8xlarge", "us-east-1", None, 1.36), id="aws-cpus-32+-memory-64"),
    pytest.param("aws", Need(memory_gib=256, memory_at_least=True), "us-east-1",
                 ("r6i.8xlarge", "us-east-1", None, 2.016), id="aws-memory-256+"),
    # the three priced regions list the same price: the region's name breaks the tie
    pytest.param("aws", Need(cpus=2, cpus_at_least=True), None, ("m6i.large", "us-east-1", None, 0.096),
                 id="aws-every-region-tie-by-region"),
    pytest.param("aws", Need(accelerator="A100", accelerator_count=8, region="us-west-2"), "us-east-1",
                 ("p4d.24xlarge", "us-west-2", None, 32.7726), id="aws-region-beats-default"),
    pytest.param("aws", Need(accelerator="A100", accelerator_count=8, zone="us-east-1d"), "us-west-2",
                 ("p4d.24xlarge", "us-east-1", None, 32.7726), id="aws-zone-decides-region"),
    pytest.param("aws", Need(instance_type="m7i.large"), "us-east-1", ("m7i.large", "us-east-1", None, None),
                 id="aws-named-type-without-price"),
    pytest.param("aws", Need(instance_type="p4d.24xlarge", use_spot=True), "us-east-1",
                 ("p4d.24xlarge", "us-east-1", None, 32.7726), id="aws-spot-without-spot-price-ranks-on-demand"),
    pytest.param("aws", Need(), "us-east-1", ("m6i.2xlarge", "us-east-1", None, 0.384), id="aws-default"),
    pytest.param("aws", Need(use_spot=True, zone="us-west-2b"), None, ("m6i.2xlarge", "us-west-2", None, 0.384),
                 id="aws-default-in-zone"),
    pytest.param("gcp", Need(accelerator="L4", accelerator_count=1), "us-central1",
                 ("g2-standard-4", "us-central1", None, 0.70683), id="gcp-L4:1"),
    pytest.param("gcp", Need(accelerator="L4", accelerator_count=2), "us-central1",
                 ("g2-standard-24", "us-central1", None, 2.00291), id="gcp-L4:2"),
    # n1-standard-1 $0.0475 + one T4 $0.35
    pytest.param("gcp", Need(accelerator="T4", accelerator_count=1), "us-central1",
                 ("n1-standard-1", "us-central1", "nvidia-tesla-t4", 0.3975), id="gcp-T4:1-on-n1"),
    # n1-standard-8 $0.379998 + one T4 $0.35
    pytest.param("gcp", Need(accelerator="t4", cpus=8, memory_gib=30), "us-central1",
                 ("n1-standard-8", "us-central1", "nvidia-tesla-t4", 0.729998), id="gcp-T4:1-cpus-8"),
    # one V100 takes up to 12 vCPUs: n1-standard-8 is the largest n1 it goes with
    pytest.param("gcp", Need(accelerator="V100", cpus=8, cpus_at_least=True), "us-west1",
                 ("n1-standard-8", "us-west1", "nvidia-tesla-v100", 2.859998), id="gcp-V100:1-cpus-8+"),
    pytest.param("gcp", Need(accelerator="P100", accelerator_count=4), "us-east1",
                 ("n1-standard-1", "us-east1", "nvidia-tesla-p100", 5.8875), id="gcp-P100:4"),
    pytest.param("gcp", Need(accelerator="A100", accelerator_count=8), "us-central1",
                 ("a2-highgpu-8g", "us-central1", None, 29.38708), id="gcp-A100:8"),
    pytest.param("gcp", Need(accelerator="A100-80GB", accelerator_count=8), "us-central1",
                 ("a2-ultragpu-8g", "us-central1", None, 40.55032), id="gcp-A100-80GB:8"),
    pytest.param("gcp", Need(instance_type="a3-highgpu-8g"), "us-central1",
                 ("a3-highgpu-8g", "us-central1", None, None), id="gcp-named-a3-without-price"),
    pytest.param("gcp", Need(instance_type="n1-standard-8"), "us-central1",
                 ("n1-standard-8", "us-central1", None, 0.379998), id="gcp-named-n1-has-no-gpus"),
    pytest.param("gcp", Need(instance_type="n1-standard-8", accelerator="T4", accelerator_count=2), "us-central1",
                 ("n1-standard-8", "us-central1", "nvidia-tesla-t4", 1.079998), id="gcp-named-n1-with-2-T4"),
    # e2-highcpu-2 ($0.049468) is not of SkyPilot's families, n2-highcpu-2 ($0.071696) has 1 GB per vCPU
    pytest.param("gcp", Need(cpus=2, cpus_at_least=True), "us-central1",
                 ("n2-standard-2", "us-central1", None, 0.097118), id="gcp-cpus-2+"),
    pytest.param("gcp", Need(cpus=4, memory_gib=16), "us-central1",
                 ("n2-standard-4", "us-central1", None, 0.194236), id="gcp-cpus-4-memory-16"),
    # 64 x $0.031611 + 256 GB x $0.004237
    pytest.param("gcp", Need(cpus=64, cpus_at_least=True, memory_gib=256, memory_at_least=True), None,
                 ("n2-standard-64", "us-central1", None, 3.107776), id="gcp-cpus-64+-memory-256+"),
    pytest.param("gcp", Need(), "us-east1", ("n2-standard-8", "us-east1", None, 0.388472), id="gcp-default"),
    pytest.param("gcp", Need(cpus=2, zone="us-west1-c"), "us-central1",
                 ("n2-standard-2", "us-west1", None, 0.097118), id="gcp-zone-decides-region"),
]


@pytest.mark.parametrize(("cloud", "need", "default_region", "expected"), CASES)
def test_choice(cloud: str, need: Need, default_region: str | None,
                expected: tuple[str, str, str | None, float | None]) -> None:
    offer = load_catalog(cloud).choose(need, default_region)
    assert (offer.instance_type, offer.region, offer.accelerator_type, offer.price(need.use_spot)) == expected
    if need.zone is not None:
        assert need.zone in offer.zones
    if need.accelerator is not None:
        assert offer.gpu is not None and offer.gpu.count == (need.accelerator_count or 1)


@pytest.mark.parametrize(("cloud", "need", "default_region", "expected"), CASES)
def test_candidates_are_cheapest_first_and_all_fit(cloud: str, need: Need, default_region: str | None,
                                                    expected: tuple[str, str, str | None, float | None]) -> None:
    candidates = load_catalog(cloud).candidates(need, default_region)
    assert candidates[0].instance_type == expected[0]
    prices = [o.price(need.use_spot) for o in candidates]
    known = [p for p in prices if p is not None]
    assert known == sorted(known)
    if need.instance_type is None:
        assert None not in prices  # an unpriced offer is never chosen by need
    for offer in candidates:
        if need.cpus is not None:
            assert offer.vcpus >= need.cpus if need.cpus_at_least else offer.vcpus == need.cpus
        if need.memory_gib is not None:
            assert offer.memory_gib >= need.memory_gib if need.memory_at_least else offer.memory_gib == need.memory_gib
        if need.accelerator is None and need.instance_type is None:
            assert offer.gpu is None
            assert family(offer.instance_type) in CPU_FAMILIES[cloud]
            if need.memory_gib is None:  # nothing asked, or cpus alone: 4 GiB per vCPU
                assert offer.memory_gib >= 4 * offer.vcpus


def family(instance_type: str) -> str:
    return instance_type.split(".")[0] if "." in instance_type else instance_type.rsplit("-", 1)[0]


@pytest.mark.parametrize(("cloud", "region"), [("aws", "us-east-1"), ("gcp", "us-central1")])
def test_the_cpu_only_choice_is_the_cheapest_priced_type_of_the_families_with_enough_vcpus_and_memory(
        cloud: str, region: str) -> None:
    catalog = load_catalog(cloud)
    priced = [o for o in catalog.offers(region) if o.gpu is None and o.ondemand_price is not None and o.vcpus >= 4
              and o.memory_gib >= 4 * o.vcpus and family(o.instance_type) in CPU_FAMILIES[cloud]]
    cheapest = min(o.ondemand_price for o in priced if o.ondemand_price is not None)
    assert catalog.choose(Need(cpus=4, cpus_at_least=True), region).ondemand_price == cheapest


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_default_type_is_what_skypilots_default_shape_picks_in_every_priced_region(cloud: str) -> None:
    # 8+ vCPUs and 4 GiB per vCPU, cheapest of the families: the type named for tasks that ask nothing
    catalog = load_catalog(cloud)
    priced = sorted({o.region for o in catalog.offers() if o.ondemand_price is not None})
    assert len(priced) >= 3
    for region in priced:
        assert catalog.choose(Need(cpus=8, cpus_at_least=True), region).instance_type == DEFAULT_INSTANCE_TYPES[cloud]
        assert catalog.choose(Need(), region).instance_type == DEFAULT_INSTANCE_TYPES[cloud]
    assert catalog.default_instance_type == {"aws": "m6i.2xlarge", "gcp": "n2-standard-8"}[cloud]


@pytest.mark.parametrize(("cloud", "instance_type", "region", "vcpus", "memory", "gpu"), [
    ("aws", "p4d.24xlarge", "us-east-1", 96, 1152, ("A100", 8, 40)),
    ("aws", "p4de.24xlarge", "us-east-1", 96, 1152, ("A100-80GB", 8, 80)),
    ("aws", "g5.xlarge", "us-east-1", 4, 16, ("A10G", 1, 22.352)),
    ("aws", "m5.large", "us-east-1", 2, 8, None),
    ("aws", "inf2.xlarge", "us-east-1", 4, 16, ("Inferentia2", 1, 32)),
    ("aws", "g5g.xlarge", "us-east-1", 4, 8, ("T4g", 1, 16)),
    ("gcp", "n1-standard-8", "us-central1", 8, 30, None),
    ("gcp", "a2-ultragpu-1g", "us-central1", 12, 170, ("A100-80GB", 1, 80)),
    ("gcp", "a3-highgpu-8g", "us-central1", 208, 1872, ("H100", 8, 80)),
    ("gcp", "g2-standard-48", "us-central1", 48, 192, ("L4", 4, 24)),
    ("gcp", "e2-micro", "us-east1", 0.25, 1, None),
])
def test_find(cloud: str, instance_type: str, region: str, vcpus: float, memory: float,
              gpu: tuple[str, int, float] | None) -> None:
    offer = load_catalog(cloud).find(instance_type, region)
    assert offer is not None
    assert (offer.vcpus, offer.memory_gib) == (vcpus, memory)
    assert ((offer.gpu.name, offer.gpu.count, offer.gpu.memory_gib) if offer.gpu else None) == gpu
    assert offer.accelerator_type is None


def test_find_says_none_for_a_type_a_region_lacks() -> None:
    assert load_catalog("aws").find("p4d.24xlarge", "af-south-1") is None
    assert load_catalog("aws").find("no-such.type", "us-east-1") is None


def test_known_accelerators() -> None:
    assert load_catalog("gcp").known_accelerators() == ("A100", "A100-80GB", "H100", "L4", "P100", "T4", "V100")
    aws = load_catalog("aws").known_accelerators()
    assert {"A100", "A100-80GB", "A10G", "H100", "L4", "L40S", "T4", "T4g", "V100-32GB", "Inferentia"} <= set(aws)
    assert aws == tuple(sorted(aws, key=str.casefold))
