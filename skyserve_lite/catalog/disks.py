"""Disk tiers (``resources.disk_tier``) as volume types, SkyPilot's mapping. Pure.

AWS (EBS)::

    low     standard                       (magnetic; no IOPS or throughput to set)
    medium  gp3   3,500 IOPS,   218 MB/s   (the default when a task names no tier)
    high    gp3   7,000 IOPS,   437 MB/s
    ultra   io2  20,000 IOPS               (io2 has no throughput setting)
    best    = ultra

gp3's throughput is its IOPS / 16, as SkyPilot sets it: 3,500 IOPS -> 218 MB/s.

GCP (persistent disk) by machine family, because not every family takes every disk type::

                  low           medium        high     ultra
    default       pd-standard   pd-balanced   pd-ssd   pd-extreme (20,000 IOPS)
    n1, a2, e2    pd-standard   pd-balanced   pd-ssd   pd-ssd     (no pd-extreme)
    n2 < 64 vCPU  pd-standard   pd-balanced   pd-ssd   pd-ssd     (pd-extreme needs 64+ vCPUs)
    g2            pd-balanced   pd-balanced   pd-ssd   pd-ssd     (no pd-standard, no pd-extreme)
    a3            pd-balanced   pd-balanced   pd-ssd   hyperdisk-balanced
    a3-ultragpu, n4, a4, g4: hyperdisk-balanced at every tier (they take no persistent disk)

``best`` is the ``ultra`` column: the best the machine family allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from skyserve_lite.catalog.model import CatalogError, InstanceOffer

TIERS = ("low", "medium", "high", "ultra", "best")
DEFAULT_TIER = "medium"
PD_EXTREME_IOPS = 20_000


@dataclass(frozen=True)
class DiskChoice:
    """A boot disk's volume type, with the IOPS and throughput to provision (None: the type's own)."""

    volume_type: str
    iops: int | None = None
    throughput_mbps: int | None = None


def _gp3(iops: int) -> DiskChoice:
    return DiskChoice("gp3", iops, iops // 16)


AWS_DISKS: dict[str, DiskChoice] = {
    "low": DiskChoice("standard"),
    "medium": _gp3(3_500),
    "high": _gp3(7_000),
    "ultra": DiskChoice("io2", 20_000),
}

GCP_DISKS: dict[str, str] = {"low": "pd-standard", "medium": "pd-balanced", "high": "pd-ssd", "ultra": "pd-extreme"}
HYPERDISK_ONLY = frozenset({"a3-ultragpu", "n4", "a4", "g4"})
# family -> the tiers it maps otherwise, applied in this order over GCP_DISKS
GCP_FAMILY_DISKS: tuple[tuple[frozenset[str], dict[str, str]], ...] = (
    (frozenset({"n1", "a2", "g2", "e2"}), {"ultra": "pd-ssd"}),
    (frozenset({"a3", "g2"}), {"low": "pd-balanced"}),
    (frozenset({"a3"}), {"ultra": "hyperdisk-balanced"}),
)


def disk_for(cloud: str, tier: str | None, offer: InstanceOffer) -> DiskChoice:
    """The disk for ``offer`` at ``tier`` (one of ``TIERS``; None is ``medium``). ``tier`` may be the spec's
    ``DiskTier`` enum, whose members are these strings. Raises ``CatalogError`` (``resources.disk_tier``)
    for another tier, ``resources.cloud`` for a cloud without disks here."""
    name = DEFAULT_TIER if tier is None else str(getattr(tier, "value", tier)).lower()
    if name not in TIERS:
        raise CatalogError("resources.disk_tier", f"unknown disk tier {name!r}; tiers: {', '.join(TIERS)}")
    tier_name = "ultra" if name == "best" else name
    if cloud == "aws":
        return AWS_DISKS[tier_name]
    if cloud == "gcp":
        volume_type = compute_gcp_disk_types(offer)[tier_name]
        return DiskChoice(volume_type, PD_EXTREME_IOPS if volume_type == "pd-extreme" else None)
    raise CatalogError("resources.cloud", f"no disk tiers for cloud {cloud!r}")


def compute_gcp_disk_types(offer: InstanceOffer) -> dict[str, str]:
    """Tier -> GCP disk type for the machine family of ``offer`` (the table in the module docstring)."""
    family = "a3-ultragpu" if offer.instance_type.startswith("a3-ultragpu") else offer.instance_type.split("-")[0]
    if family in HYPERDISK_ONLY:
        return dict.fromkeys(GCP_DISKS, "hyperdisk-balanced")
    types = dict(GCP_DISKS)
    for families, overrides in GCP_FAMILY_DISKS:
        if family in families:
            types |= overrides
    if family == "n2" and offer.vcpus < 64:
        types["ultra"] = types["high"]
    return types
