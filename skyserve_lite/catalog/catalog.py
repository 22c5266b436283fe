"""A cloud's catalog, read from the package's data files on first use.

``load_catalog("aws")`` reads ``data/aws.csv.gz`` once per process (the first call; later calls return
the same object) and splits it into lines; a region's rows become ``InstanceOffer`` values the first time
that region is asked for, so a choice in one region never builds the other regions' offers.
"""

from __future__ import annotations

import functools
import gzip
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from skyserve_lite.catalog.choose import DEFAULT_INSTANCE_TYPES, find_candidates
from skyserve_lite.catalog.model import CLOUDS, CatalogError, InstanceOffer, Need
from skyserve_lite.catalog.table import find_region_runs, parse_offers, split_rows

DATA = Path(__file__).parent / "data"
DATA_FILES = {"aws": "aws.csv.gz", "gcp": "gcp.csv"}


class Catalog:
    """The offers of one cloud, by region. Immutable once made: ``from_offers`` for values at hand (tests,
    a catalog built by ``scripts/build_catalog.py``), ``load_catalog`` for the shipped one."""

    def __init__(self, cloud: str, offers: dict[str, tuple[InstanceOffer, ...]] | None = None,
                 rows: Sequence[str] = ()) -> None:
        """``offers`` by region, or ``rows``: sorted row lines of the file format (``table``), parsed a region
        at a time when first asked for."""
        self.cloud = cloud
        self._rows = rows
        self._runs = find_region_runs(rows)
        self._offers: dict[str, tuple[InstanceOffer, ...]] = dict(offers or {})
        self._regions = tuple(sorted({*self._runs, *self._offers}))
        self._every: tuple[InstanceOffer, ...] | None = None
        self._accelerators: tuple[str, ...] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_offers(cls, cloud: str, offers: Iterable[InstanceOffer]) -> Catalog:
        by_region: dict[str, list[InstanceOffer]] = {}
        for offer in offers:
            by_region.setdefault(offer.region, []).append(offer)
        return cls(cloud, offers={region: tuple(found) for region, found in by_region.items()})

    @classmethod
    def from_text(cls, cloud: str, text: str, source: str = "<string>") -> Catalog:
        """A catalog of the file format in ``table``; raises ``CatalogError`` for another format."""
        return cls(cloud, rows=split_rows(text, source))

    def regions(self) -> tuple[str, ...]:
        return self._regions

    def offers(self, region: str | None = None) -> Sequence[InstanceOffer]:
        """The offers of ``region`` (empty for a region the catalog lacks), or of every region in region
        order when None."""
        if region is None:
            if self._every is None:
                self._every = tuple(offer for name in self._regions for offer in self._region(name))
            return self._every
        return self._region(region)

    def find(self, instance_type: str, region: str) -> InstanceOffer | None:
        """The offer of ``instance_type`` (any case) in ``region``, None when the catalog has none there. For
        a GCP n1 type this is the machine alone, not one of its offers with GPUs attached."""
        wanted = instance_type.casefold()
        for offer in self._region(region):
            if offer.instance_type.casefold() == wanted and offer.accelerator_type is None:
                return offer
        return None

    def candidates(self, need: Need, default_region: str | None = None) -> list[InstanceOffer]:
        """Every offer that fits ``need``, cheapest first; raises ``CatalogError`` when none does (the rule:
        ``skyserve_lite.catalog.choose``)."""
        return find_candidates(self, need, default_region)

    def choose(self, need: Need, default_region: str | None = None) -> InstanceOffer:
        """The cheapest offer that fits ``need``; raises ``CatalogError`` naming the constraint at fault."""
        return self.candidates(need, default_region)[0]

    def known_accelerators(self) -> tuple[str, ...]:
        """Every accelerator name the catalog has, in any region, sorted case-insensitively."""
        if self._accelerators is None:
            names = {o.gpu.name for o in self.offers() if o.gpu is not None}
            self._accelerators = tuple(sorted(names, key=str.casefold))
        return self._accelerators

    @property
    def default_instance_type(self) -> str | None:
        return DEFAULT_INSTANCE_TYPES.get(self.cloud)

    def _region(self, region: str) -> tuple[InstanceOffer, ...]:
        found = self._offers.get(region)
        if found is None:
            with self._lock:
                found = self._offers.get(region)
                if found is None:
                    start, end = self._runs.get(region, (0, 0))
                    found = self._offers[region] = parse_offers(self.cloud, self._rows[start:end])
        return found


def load_catalog(cloud: str) -> Catalog:
    """The shipped catalog of ``cloud`` (``aws``, ``gcp``), read on the first call and cached. Raises
    ``CatalogError`` (``resources.cloud``) for a cloud without one."""
    if cloud not in DATA_FILES:
        raise CatalogError("resources.cloud", f"no instance catalog for cloud {cloud!r}; "
                                              f"catalogs: {', '.join(CLOUDS)}")
    return _load(cloud)


@functools.cache
def _load(cloud: str) -> Catalog:
    name = DATA_FILES[cloud]
    data = (DATA / name).read_bytes()
    text = (gzip.decompress(data) if name.endswith(".gz") else data).decode()
    return Catalog.from_text(cloud, text, source=name)
