"""Instance catalogs: which instance types each cloud offers where, at what price, and the cheapest that
fits a task's resources.

    >>> from skyserve_lite.catalog import Need, load_catalog
    >>> offer = load_catalog("aws").choose(Need(accelerator="A100", accelerator_count=8), "us-east-1")
    >>> offer.instance_type, offer.ondemand_price
    ('p4d.24xlarge', 32.7726)

- ``model``: the values (``Gpu``, ``InstanceOffer``, ``Need``) and ``CatalogError``;
- ``catalog``: ``Catalog`` and ``load_catalog`` (the shipped data files, read on first use);
- ``choose``: the rule that picks an offer (SkyPilot's sizing of CPU-only needs included), and its errors;
  ``disks``: disk tiers as volume types;
- ``table``: the data file format; ``build_aws``, ``build_gcp``, ``prices``, ``accelerators``: what
  ``scripts/build_catalog.py`` turns the clouds' answers into offers with.

Nothing here reads a file or the network at import; see docs/catalog.md.
"""

from skyserve_lite.catalog.accelerators import is_same_accelerator
from skyserve_lite.catalog.catalog import Catalog, load_catalog
from skyserve_lite.catalog.choose import CPU_FAMILIES, DEFAULT_INSTANCE_TYPES, describe_sizing
from skyserve_lite.catalog.disks import DiskChoice, disk_for
from skyserve_lite.catalog.model import CLOUDS, CatalogError, Gpu, InstanceOffer, Need

__all__ = [
    "CLOUDS",
    "CPU_FAMILIES",
    "DEFAULT_INSTANCE_TYPES",
    "Catalog",
    "CatalogError",
    "DiskChoice",
    "Gpu",
    "InstanceOffer",
    "Need",
    "describe_sizing",
    "disk_for",
    "is_same_accelerator",
    "load_catalog",
]
