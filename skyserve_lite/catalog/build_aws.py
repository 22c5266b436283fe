"""The AWS catalog from EC2's own answers. Pure: ``scripts/build_catalog.py aws`` makes the calls.

Inputs, as boto3 returns them:

- ``DescribeInstanceTypes`` items: vCPUs (``VCpuInfo.DefaultVCpus``), memory (``MemoryInfo.SizeInMiB``),
  architectures, and the accelerators: ``GpuInfo`` (NVIDIA, AMD), else ``NeuronInfo`` (Inferentia,
  Trainium), else ``InferenceAcceleratorInfo``;
- ``DescribeInstanceTypeOfferings`` by region (which types a region has) and by availability zone (where);
- prices by (instance type, region), from the Price List API and spot price history or from a snapshot.

A type offered in a region becomes one offer there, with the zones that offer it. Mac types (dedicated
hosts only) are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skyserve_lite.catalog.accelerators import canonical_aws_gpu
from skyserve_lite.catalog.model import Gpu, InstanceOffer
from skyserve_lite.catalog.prices import Price, PriceTable

_ARCHES = ("x86_64", "arm64")  # in the order a type supporting both (none today) is filed under


@dataclass(frozen=True)
class AwsTypeSpec:
    instance_type: str
    vcpus: float
    memory_gib: float
    gpu: Gpu | None
    arch: str


def compute_type_spec(info: Mapping[str, Any]) -> AwsTypeSpec | None:
    """The catalog's view of one DescribeInstanceTypes item; None for a type only a Mac host runs."""
    arches = info.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
    arch = next((a for a in _ARCHES if a in arches), None)
    if arch is None:
        return None
    return AwsTypeSpec(
        instance_type=str(info["InstanceType"]),
        vcpus=float(info["VCpuInfo"]["DefaultVCpus"]),
        memory_gib=round(int(info["MemoryInfo"]["SizeInMiB"]) / 1024, 3),
        gpu=compute_gpu(info),
        arch=arch,
    )


def compute_gpu(info: Mapping[str, Any]) -> Gpu | None:
    """The accelerators of a DescribeInstanceTypes item: p4de's 8x A100 with 81920 MiB -> ``8x A100-80GB``."""
    devices: Sequence[Mapping[str, Any]] = (
        info.get("GpuInfo", {}).get("Gpus")
        or info.get("NeuronInfo", {}).get("NeuronDevices")
        or info.get("InferenceAcceleratorInfo", {}).get("Accelerators")
        or ()
    )
    if not devices:
        return None
    device = devices[0]  # every type today has one kind of accelerator
    memory_mib = int(device.get("MemoryInfo", {}).get("SizeInMiB", 0))
    count = sum(int(d.get("Count", 0)) for d in devices)
    return Gpu(canonical_aws_gpu(str(device["Name"]), memory_mib), count, round(memory_mib / 1024, 3))


def compute_aws_offers(instance_types: Iterable[Mapping[str, Any]],
                       offerings: Mapping[str, Mapping[str, Sequence[str]]],
                       prices: PriceTable) -> list[InstanceOffer]:
    """One offer per (type, region) of ``offerings`` (region -> instance type -> its zones there) for the
    types ``instance_types`` describes; a type offered but not described is skipped (it has no specs)."""
    specs = {s.instance_type: s for s in map(compute_type_spec, instance_types) if s is not None}
    offers = []
    for region, types in offerings.items():
        for instance_type, zones in types.items():
            spec = specs.get(instance_type)
            if spec is None:
                continue
            price = prices.get((instance_type, region), Price())
            offers.append(InstanceOffer("aws", instance_type, region, tuple(sorted(zones)), spec.vcpus,
                                        spec.memory_gib, spec.gpu, spec.arch, price.ondemand, price.spot))
    return offers


def compute_offerings(region: str, region_offerings: Iterable[Mapping[str, Any]],
                      zone_offerings: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Instance type -> zones of ``region``, from that region's DescribeInstanceTypeOfferings items with
    LocationType ``region`` and ``availability-zone``. A type the region offers in no zone keeps an empty
    zone list; a zone offering of a type the region does not list is ignored."""
    types: dict[str, list[str]] = {str(item["InstanceType"]): [] for item in region_offerings
                                   if item["Location"] == region}
    for item in zone_offerings:
        zones = types.get(str(item["InstanceType"]))
        if zones is not None:
            zones.append(str(item["Location"]))
    return types
