"""Disk tiers as volume types (SkyPilot's table) and offers as a plan prints them."""

from __future__ import annotations

from enum import Enum

import pytest

from skyserve_lite.catalog import CatalogError, DiskChoice, InstanceOffer, disk_for


def machine(cloud: str, instance_type: str, vcpus: float = 8) -> InstanceOffer:
    return InstanceOffer(cloud, instance_type, "r1", ("r1a",), vcpus, 32, None, "x86_64", 1.0, None)


@pytest.mark.parametrize(("cloud", "instance_type", "vcpus", "tier", "expected"), [
    ("aws", "m5.large", 2, "low", DiskChoice("standard")),
    ("aws", "m5.large", 2, "medium", DiskChoice("gp3", 3500, 218)),
    ("aws", "m5.large", 2, None, DiskChoice("gp3", 3500, 218)),
    ("aws", "p4d.24xlarge", 96, "high", DiskChoice("gp3", 7000, 437)),
    ("aws", "p4d.24xlarge", 96, "ultra", DiskChoice("io2", 20000)),
    ("aws", "p4d.24xlarge", 96, "best", DiskChoice("io2", 20000)),
    ("gcp", "n2-standard-64", 64, "low", DiskChoice("pd-standard")),
    ("gcp", "n2-standard-64", 64, "medium", DiskChoice("pd-balanced")),
    ("gcp", "n2-standard-64", 64, "high", DiskChoice("pd-ssd")),
    ("gcp", "n2-standard-64", 64, "ultra", DiskChoice("pd-extreme", 20000)),
    ("gcp", "n2-standard-64", 64, "best", DiskChoice("pd-extreme", 20000)),
    ("gcp", "n2-standard-32", 32, "ultra", DiskChoice("pd-ssd")),  # pd-extreme needs 64+ vCPUs
    ("gcp", "n2-standard-32", 32, "best", DiskChoice("pd-ssd")),
    ("gcp", "n1-standard-8", 8, "ultra", DiskChoice("pd-ssd")),
    ("gcp", "e2-medium", 1, "low", DiskChoice("pd-standard")),
    ("gcp", "e2-medium", 1, "best", DiskChoice("pd-ssd")),
    ("gcp", "a2-highgpu-8g", 96, "ultra", DiskChoice("pd-ssd")),
    ("gcp", "g2-standard-4", 4, "low", DiskChoice("pd-balanced")),
    ("gcp", "g2-standard-4", 4, "high", DiskChoice("pd-ssd")),
    ("gcp", "g2-standard-4", 4, "ultra", DiskChoice("pd-ssd")),
    ("gcp", "a3-highgpu-8g", 208, "low", DiskChoice("pd-balanced")),
    ("gcp", "a3-highgpu-8g", 208, "high", DiskChoice("pd-ssd")),
    ("gcp", "a3-highgpu-8g", 208, "best", DiskChoice("hyperdisk-balanced")),
    ("gcp", "a3-ultragpu-8g", 224, "low", DiskChoice("hyperdisk-balanced")),
    ("gcp", "n4-standard-8", 8, "medium", DiskChoice("hyperdisk-balanced")),
])
def test_disk_for(cloud: str, instance_type: str, vcpus: float, tier: str | None, expected: DiskChoice) -> None:
    assert disk_for(cloud, tier, machine(cloud, instance_type, vcpus)) == expected


class Tier(str, Enum):  # how the task spec's DiskTier looks: a str enum of the tier names
    ULTRA = "ultra"


def test_disk_for_takes_a_str_enum() -> None:
    assert disk_for("aws", Tier.ULTRA, machine("aws", "m5.large")) == DiskChoice("io2", 20000)


@pytest.mark.parametrize(("cloud", "tier", "field"), [
    ("aws", "fastest", "resources.disk_tier"),
    ("local", "low", "resources.cloud"),
])
def test_disk_for_errors(cloud: str, tier: str, field: str) -> None:
    with pytest.raises(CatalogError) as caught:
        disk_for(cloud, tier, machine("aws", "m5.large"))
    assert caught.value.field == field
