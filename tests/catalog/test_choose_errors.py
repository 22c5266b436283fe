"""Resources nothing fits: the error names the constraint's field and says what the catalog has instead."""

from __future__ import annotations

import pytest

from skyserve_lite.catalog import CatalogError, Need, load_catalog
from skyserve_lite.errors import SkyLiteError

# (cloud, need, default region) -> (field, fragments of the message, in order)
CASES = [
    pytest.param("aws", Need(accelerator="H300", accelerator_count=8), "us-east-1",
                 ("resources.accelerators", ["no aws instance type in us-east-1", "has H300",
                                             "accelerators offered there: A100, A100-80GB, A10G"]),
                 id="unknown-accelerator"),
    pytest.param("gcp", Need(accelerator="B200"), None,
                 ("resources.accelerators", ["no gcp instance type has B200",
                                             "accelerators offered: A100, A100-80GB, H100, L4, P100, T4, V100"]),
                 id="unknown-accelerator-every-region"),
    pytest.param("aws", Need(accelerator="A100", accelerator_count=4), "us-east-1",
                 ("resources.accelerators", ["no aws instance type in us-east-1", "has 4x A100",
                                             "counts of A100 offered there: 8"]), id="count-not-offered"),
    pytest.param("gcp", Need(accelerator="T4", accelerator_count=3), "us-central1",
                 ("resources.accelerators", ["has 3x T4", "counts of T4 offered there: 1, 2, 4"]),
                 id="count-not-offered-gcp"),
    pytest.param("aws", Need(instance_type="p4d.24xlarge", region="af-south-1"), "us-east-1",
                 ("resources.region", ["no instance type 'p4d.24xlarge' in af-south-1",
                                       "p4d.24xlarge is offered in: ", "us-east-1"]), id="region-without-the-type"),
    pytest.param("gcp", Need(accelerator="H100", accelerator_count=8), "us-east1",
                 ("resources.region", ["no gcp instance type in us-east1 (the default region) has H100",
                                       "8x H100 is offered in: europe-west4, us-central1"]),
                 id="default-region-without-the-accelerator"),
    pytest.param("aws", Need(instance_type="p4d.24xlarg"), "us-east-1",
                 ("resources.instance_type", ["no instance type 'p4d.24xlarg' in us-east-1",
                                              "similar: p4d.24xlarge"]), id="unknown-instance-type"),
    pytest.param("aws", Need(cpus=3), "us-east-1",
                 ("resources.cpus", ["no aws instance type in us-east-1 (the default region) of SkyPilot's CPU "
                                     "families has exactly 3 vCPUs", "write 3+ for at least",
                                     "vCPUs offered there: 2, 4, 8",
                                     "SkyPilot's CPU families are c6i, c6id, c7i, m6i, m6id, m7i, r6i, r6id, r7i: name "
                                     "another type with resources.instance_type"]),
                 id="exact-cpus-not-offered"),
    # t3.micro has 1 vCPU (burstable), but no type of the families SkyPilot sizes CPU tasks from has
    pytest.param("aws", Need(cpus=1), "us-east-1",
                 ("resources.cpus", ["of SkyPilot's CPU families has exactly 1 vCPUs", "vCPUs offered there: 2, 4",
                                     "name another type with resources.instance_type"]),
                 id="one-vcpu-only-burstable"),
    pytest.param("gcp", Need(memory_gib=1), "us-central1",
                 ("resources.memory", ["no gcp instance type in us-central1 (the default region) of SkyPilot's CPU "
                                       "families has exactly 1 GiB memory", "GiB memory offered there: 2, 4, 8",
                                       "SkyPilot's CPU families are n2-highcpu, n2-highmem, n2-standard"]),
                 id="shared-core-memory-only"),
    pytest.param("aws", Need(cpus=1000, cpus_at_least=True), "us-east-1",
                 ("resources.cpus", ["has 1000+ vCPUs", "the most there is"]), id="too-many-cpus"),
    pytest.param("gcp", Need(accelerator="V100", cpus=16), "us-central1",
                 ("resources.cpus", ["with 1x V100 has exactly 16 vCPUs", "vCPUs offered there: 1, 2, 4, 8"]),
                 id="cpus-not-offered-with-the-gpu"),
    pytest.param("aws", Need(cpus=2, memory_gib=3), "us-east-1",
                 ("resources.memory", ["with 2 vCPUs has exactly 3 GiB memory", "GiB memory offered there:"]),
                 id="exact-memory-not-offered"),
    pytest.param("aws", Need(cpus=2, region="mars-1"), None,
                 ("resources.region", ["the aws catalog has no region 'mars-1'", "regions: af-south-1"]),
                 id="unknown-region"),
    pytest.param("aws", Need(region="mars-1"), None,
                 ("resources.region", ["no region 'mars-1'"]), id="unknown-region-default-type"),
    pytest.param("gcp", Need(cpus=2), "mars1",
                 ("resources.region", ["no region 'mars1' (the default region)"]), id="unknown-default-region"),
    pytest.param("aws", Need(cpus=2, region="us-east-1", zone="us-west-2a"), None,
                 ("resources.zone", ["zone 'us-west-2a' is in us-west-2, not in us-east-1"]), id="zone-elsewhere"),
    pytest.param("aws", Need(cpus=2, zone="us-east-1z"), None,
                 ("resources.zone", ["no zone 'us-east-1z'"]), id="unknown-zone"),
    pytest.param("aws", Need(accelerator="A100", accelerator_count=8, zone="us-east-1f"), None,
                 ("resources.zone", ["no aws instance type in zone us-east-1f has A100",
                                     "8x A100 is offered in us-east-1 zones: us-east-1a, us-east-1b"]),
                 id="zone-without-the-accelerator"),
    pytest.param("gcp", Need(accelerator="H100", accelerator_count=8), "us-central1",
                 ("resources.accelerators", ["a3-highgpu-8g in us-central1", "fits 8x H100",
                                             "no price for it", "name one with resources.instance_type"]),
                 id="fits-but-unpriced"),
    pytest.param("aws", Need(accelerator="A100", accelerator_count=8), "eu-west-1",
                 ("resources.region", ["p4d.24xlarge in eu-west-1", "no price",
                                       "priced in: us-east-1, us-east-2, us-west-2"]),
                 id="fits-but-priced-only-elsewhere"),
    pytest.param("aws", Need(instance_type="m5.large", accelerator="T4"), "us-east-1",
                 ("resources.accelerators", ["no aws instance type in us-east-1", "with m5.large has T4",
                                             "none there has accelerators"]),
                 id="named-type-without-the-accelerator"),
]


@pytest.mark.parametrize(("cloud", "need", "default_region", "expected"), CASES)
def test_error(cloud: str, need: Need, default_region: str | None, expected: tuple[str, list[str]]) -> None:
    field, fragments = expected
    with pytest.raises(CatalogError) as caught:
        load_catalog(cloud).choose(need, default_region)
    error = caught.value
    assert error.field == field
    assert str(error).startswith(f"{field}: ")
    at = 0
    for fragment in fragments:
        found = str(error).find(fragment, at)
        assert found >= 0, f"{fragment!r} not in {str(error)[at:]!r}"
        at = found + len(fragment)


def test_catalog_errors_are_sky_lite_errors_with_a_spec_exit_code() -> None:
    assert issubclass(CatalogError, SkyLiteError)
    assert CatalogError("resources.cpus", "x").exit_code == 2


def test_the_default_type_unpriced_in_a_region_is_still_the_default() -> None:
    # europe-west4 has no prices in the snapshot; a task that names nothing still gets the default type
    offer = load_catalog("gcp").choose(Need(), "europe-west4")
    assert (offer.instance_type, offer.region, offer.ondemand_price) == ("n2-standard-8", "europe-west4", None)


def test_unknown_cloud() -> None:
    with pytest.raises(CatalogError) as caught:
        load_catalog("azure")
    assert caught.value.field == "resources.cloud"
    assert "no instance catalog for cloud 'azure'; catalogs: aws, gcp" in str(caught.value)
