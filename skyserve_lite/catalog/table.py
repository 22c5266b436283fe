"""The catalog's file format: one CSV per cloud, one row per (region, instance type).

Lines starting with ``#`` at the top say where the data came from. Then a header and the rows::

    region,instance_type,zones,vcpus,memory_gib,gpu_name,gpu_count,gpu_memory_gib,arch,
        ondemand_usd_per_hour,spot_usd_per_hour,accelerator_type
    us-east-1,p4d.24xlarge,us-east-1a;us-east-1b,96,1152,A100,8,40,x86_64,32.7726,,

Zones are joined with ``;``. Empty cells are unknown: no GPU, no price, no attached accelerator type (the
last column is GCP's ``nvidia-tesla-t4`` for an n1 machine with GPUs attached). No cell holds a comma or a
quote, so a row is ``line.split(",")``.

The rows are sorted as text, region first, so a region's rows are one run that ``find_region_runs``
finds by bisection: loading the catalog splits the file into lines and touches no row until its region is
asked for (AWS: 21,000 rows in 30 regions, of which a choice in one region parses about 1,300).
Rendering then parsing gives back equal offers, which is what lets a test compare a freshly built catalog
with the shipped one.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from skyserve_lite.catalog.model import CatalogError, Gpu, InstanceOffer

COLUMNS = ("region", "instance_type", "zones", "vcpus", "memory_gib", "gpu_name", "gpu_count", "gpu_memory_gib",
           "arch", "ondemand_usd_per_hour", "spot_usd_per_hour", "accelerator_type")
HEADER = ",".join(COLUMNS)
_FORBIDDEN = frozenset(',"\n\r')
_AFTER_EVERY = chr(0x10FFFF)  # sorts after any character a row can hold


def render_row(offer: InstanceOffer) -> str:
    """One offer as a line of the file. Raises ``ValueError`` for a cell that holds a comma or a quote."""
    gpu = offer.gpu
    cells = [
        offer.region, offer.instance_type, ";".join(offer.zones), _number(offer.vcpus), _number(offer.memory_gib),
        gpu.name if gpu else "", str(gpu.count) if gpu else "", _number(gpu.memory_gib) if gpu else "",
        offer.arch, _price(offer.ondemand_price), _price(offer.spot_price), offer.accelerator_type or "",
    ]
    for cell in cells:
        if _FORBIDDEN.intersection(cell):
            raise ValueError(f"catalog cell {cell!r} (of {offer.instance_type} in {offer.region}) holds a comma, "
                             "a quote or a line break")
    return ",".join(cells)


def render_table(offers: Iterable[InstanceOffer], comments: Sequence[str] = ()) -> str:
    """The file text for ``offers``, with ``comments`` as ``#`` lines above the header."""
    lines = [f"# {line}".rstrip() for line in comments]
    lines.append(HEADER)
    lines.extend(sorted(render_row(offer) for offer in offers))
    return "\n".join(lines) + "\n"


def split_rows(text: str, source: str) -> list[str]:
    """The row lines of a catalog file, in file order. Raises ``CatalogError`` when the header is not
    ``HEADER``: a file of another version of the format."""
    lines = text.splitlines()
    start = 0
    while start < len(lines) and lines[start].startswith("#"):
        start += 1
    if start == len(lines) or lines[start] != HEADER:
        raise CatalogError("resources.cloud", f"{source} is not a catalog file of this version "
                                              f"(its header should be {HEADER!r})")
    rows = lines[start + 1:]
    while rows and not rows[-1]:
        rows.pop()
    return rows


def find_region_runs(rows: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Region -> (first, end) indexes of its rows in ``rows`` (sorted, as ``render_table`` writes them):
    one bisection per region, none per row."""
    runs: dict[str, tuple[int, int]] = {}
    start = 0
    while start < len(rows):
        region = rows[start].split(",", 1)[0]
        end = bisect.bisect_left(rows, region + "," + _AFTER_EVERY, start)
        runs[region] = (start, end)
        start = end
    return runs


def parse_offers(cloud: str, rows: Iterable[str]) -> tuple[InstanceOffer, ...]:
    """Offers from row lines. Equal zone lists and GPUs are shared between offers: a region has a few
    distinct zone lists and a few dozen GPUs for about a thousand rows."""
    zones_seen: dict[str, tuple[str, ...]] = {}
    gpus_seen: dict[tuple[str, str, str], Gpu] = {}
    offers = []
    for line in rows:
        (region, instance_type, zones, vcpus, memory, gpu_name, gpu_count, gpu_memory, arch, ondemand, spot,
         accelerator_type) = line.split(",")
        zone_tuple = zones_seen.get(zones)
        if zone_tuple is None:
            zone_tuple = zones_seen[zones] = tuple(zones.split(";")) if zones else ()
        gpu = None
        if gpu_name:
            key = (gpu_name, gpu_count, gpu_memory)
            gpu = gpus_seen.get(key)
            if gpu is None:
                gpu = gpus_seen[key] = Gpu(gpu_name, int(gpu_count), float(gpu_memory))
        offers.append(InstanceOffer(
            cloud, instance_type, region, zone_tuple, float(vcpus), float(memory), gpu, arch,
            float(ondemand) if ondemand else None, float(spot) if spot else None, accelerator_type or None))
    return tuple(offers)


def _number(value: float) -> str:
    """``2`` for 2.0, ``0.612`` for 0.6123: three decimals are below any difference a task can ask for."""
    rounded = round(float(value), 3)
    return str(int(rounded)) if rounded.is_integer() else repr(rounded)


def _price(value: float | None) -> str:
    return "" if value is None else repr(value)
