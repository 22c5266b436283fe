"""Hourly prices for the catalog builders: the snapshot files, AWS's Price List answers, spot history. Pure.

A snapshot file is a CSV with ``#`` comment lines saying what it is and when it was taken::

    item,region,ondemand_usd_per_hour,spot_usd_per_hour
    m5.large,us-east-1,0.096,

``item`` is an instance type (AWS), a machine type or an accelerator type priced per GPU (GCP). An empty
price is unknown.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SNAPSHOT_COLUMNS = ("item", "region", "ondemand_usd_per_hour", "spot_usd_per_hour")


@dataclass(frozen=True)
class Price:
    ondemand: float | None = None
    spot: float | None = None


PriceTable = Mapping[tuple[str, str], Price]  # (item, region) -> price


def parse_price_snapshot(text: str, source: str = "<string>") -> dict[tuple[str, str], Price]:
    """The prices of a snapshot file. Raises ``ValueError`` for a wrong header, a repeated row or a price
    that is not a positive number."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not lines or tuple(lines[0].split(",")) != SNAPSHOT_COLUMNS:
        raise ValueError(f"{source}: the header should be {','.join(SNAPSHOT_COLUMNS)}")
    prices: dict[tuple[str, str], Price] = {}
    for number, (item, region, ondemand, spot) in enumerate(csv.reader(lines[1:]), start=2):
        if (item, region) in prices:
            raise ValueError(f"{source}: row {number}: {item} in {region} is priced twice")
        prices[(item, region)] = Price(_positive(ondemand, source, number), _positive(spot, source, number))
    return prices


def _positive(text: str, source: str, number: int) -> float | None:
    if not text:
        return None
    value = float(text)
    if not value > 0:
        raise ValueError(f"{source}: row {number}: price {text!r} is not positive")
    return value


def parse_price_list_product(document: str) -> tuple[str, str, float] | None:
    """``(instance type, region code, USD per hour)`` from one ``pricing.get_products`` PriceList entry
    (a JSON string) for Linux, shared tenancy, no pre-installed software; None for any other product, or
    one without an hourly on-demand price."""
    product = json.loads(document)
    attributes = product.get("product", {}).get("attributes", {})
    wanted = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
    if any(attributes.get(key) != value for key, value in wanted.items()):
        return None
    instance_type, region = attributes.get("instanceType"), attributes.get("regionCode")
    if not instance_type or not region:
        return None
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if dimension.get("unit") == "Hrs" and usd and float(usd) > 0:
                return str(instance_type), str(region), float(usd)
    return None


def compute_spot_prices(history: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Instance type -> spot price from ``ec2.describe_spot_price_history`` items of one region: the newest
    price of each zone, then the highest of the zones, so the catalog's one figure per region is what any
    of its zones charged at the time of the build, not the luckiest zone's."""
    newest: dict[tuple[str, str], tuple[Any, float]] = {}
    for item in history:
        if "SpotPrice" not in item:
            continue
        key = (str(item["InstanceType"]), str(item.get("AvailabilityZone", "")))
        stamp, price = item.get("Timestamp"), float(item["SpotPrice"])
        seen = newest.get(key)
        if seen is None or (stamp is not None and (seen[0] is None or stamp > seen[0])):
            newest[key] = (stamp, price)
    highest: dict[str, float] = {}
    for (instance_type, _zone), (_stamp, price) in newest.items():
        highest[instance_type] = max(price, highest.get(instance_type, 0.0))
    return highest


def render_price_snapshot(prices: PriceTable, comments: Iterable[str] = ()) -> str:
    """The text of a snapshot file for ``prices`` (rows sorted), e.g. to keep what a builder fetched."""
    lines = [f"# {line}".rstrip() for line in comments]
    lines.append(",".join(SNAPSHOT_COLUMNS))
    for (item, region), price in sorted(prices.items()):
        lines.append(",".join([item, region, _text(price.ondemand), _text(price.spot)]))
    return "\n".join(lines) + "\n"


def _text(value: float | None) -> str:
    return "" if value is None else repr(value)
