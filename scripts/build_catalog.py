"""Build the instance catalogs shipped in ``skyserve_lite/catalog/data/`` from the clouds' APIs.

    python scripts/build_catalog.py aws                      # real credentials: EC2 + Price List API
    python scripts/build_catalog.py aws --prices snapshot    # specs from EC2, prices from the snapshot file
    python scripts/build_catalog.py aws --moto               # moto's copy of EC2's answers, snapshot prices
    python scripts/build_catalog.py gcp --project P          # real credentials: Compute Engine
    python scripts/build_catalog.py gcp --curated            # the curated GCP inventory below, no API

AWS: ``ec2.describe_regions``; per region ``describe_instance_type_offerings`` (LocationType ``region``
and ``availability-zone``) and ``describe_instance_types`` (paginated, for the types the region offers
that an earlier region did not describe); prices from ``pricing.get_products`` (on-demand) and
``ec2.describe_spot_price_history`` (spot), or from ``data/aws_prices_snapshot.csv``. Under ``--moto``
everything runs inside ``moto.mock_aws()``: moto answers the EC2 calls from the DescribeInstanceTypes data
it ships, and has no Price List API (and only placeholder spot prices), so prices come from the snapshot.

GCP: ``machineTypes.aggregatedList`` and ``acceleratorTypes.aggregatedList`` through google-cloud-compute
(``--endpoint`` or ``SKY_LITE_GCP_ENDPOINT`` points it elsewhere, e.g. a local fake); prices always from
``data/gcp_prices_snapshot.csv``, because the Cloud Billing Catalog API needs credentials of its own. The
shipped GCP catalog is ``--curated``: the inventory in ``curated_gcp_inventory`` below.

Only the calling is here; what the answers become is ``skyserve_lite.catalog.build_aws``/``build_gcp``.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import os
import re
import sys
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyserve_lite.catalog.build_aws import compute_aws_offers, compute_offerings
from skyserve_lite.catalog.build_gcp import GcpAcceleratorType, GcpMachineType, compute_gcp_offers
from skyserve_lite.catalog.model import InstanceOffer
from skyserve_lite.catalog.prices import (
    Price,
    compute_spot_prices,
    parse_price_list_product,
    parse_price_snapshot,
    render_price_snapshot,
)
from skyserve_lite.catalog.table import render_table

DATA = Path(__file__).resolve().parent.parent / "skyserve_lite" / "catalog" / "data"
AWS_SNAPSHOT = DATA / "aws_prices_snapshot.csv"
GCP_SNAPSHOT = DATA / "gcp_prices_snapshot.csv"
OUTPUTS = {"aws": DATA / "aws.csv.gz", "gcp": DATA / "gcp.csv"}
DESCRIBE_CHUNK = 100  # instance types per DescribeInstanceTypes request
PRICING_REGION = "us-east-1"  # the Price List API answers in us-east-1 (and two other regions)


# --- AWS ----------------------------------------------------------------------------------------------------
@dataclass
class AwsInventory:
    instance_types: list[dict[str, Any]] = field(default_factory=list)  # DescribeInstanceTypes items
    offerings: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # region -> type -> zones


def fetch_aws_inventory(session: Any, regions: Collection[str] | None = None,
                        instance_types: Collection[str] | None = None) -> AwsInventory:
    """What EC2 says about every region the account has (or ``regions``), for every instance type (or
    ``instance_types``)."""
    names = [r["RegionName"] for r in session.client("ec2", region_name=PRICING_REGION).describe_regions()["Regions"]]
    inventory = AwsInventory()
    described: set[str] = set()
    type_filter = [{"Name": "instance-type", "Values": sorted(instance_types)}] if instance_types else []
    for region in sorted(names):
        if regions and region not in regions:
            continue
        ec2 = session.client("ec2", region_name=region)
        by_region = _pages(ec2, "describe_instance_type_offerings", "InstanceTypeOfferings", LocationType="region",
                           Filters=[{"Name": "location", "Values": [region]}, *type_filter])
        by_zone = _pages(ec2, "describe_instance_type_offerings", "InstanceTypeOfferings",
                         LocationType="availability-zone", Filters=type_filter)
        offered = compute_offerings(region, by_region, by_zone)
        if not offered:
            continue
        inventory.offerings[region] = offered
        missing = sorted(set(offered) - described)
        for start in range(0, len(missing), DESCRIBE_CHUNK):
            chunk = missing[start:start + DESCRIBE_CHUNK]
            inventory.instance_types += _pages(ec2, "describe_instance_types", "InstanceTypes", InstanceTypes=chunk)
            described.update(chunk)
    return inventory


def fetch_aws_prices(session: Any, inventory: AwsInventory) -> dict[tuple[str, str], Price]:
    """On-demand prices from the Price List API and spot prices (the newest, highest over the zones) from
    the spot price history, for the offers of ``inventory``."""
    pricing = session.client("pricing", region_name=PRICING_REGION)
    prices: dict[tuple[str, str], Price] = {}
    now = datetime.datetime.now(datetime.timezone.utc)
    for region, offered in inventory.offerings.items():
        filters = [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in (
            ("regionCode", region), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
            ("preInstalledSw", "NA"), ("capacitystatus", "Used"))]
        ondemand: dict[str, float] = {}
        for document in _pages(pricing, "get_products", "PriceList", ServiceCode="AmazonEC2", Filters=filters):
            parsed = parse_price_list_product(document)
            if parsed is not None and parsed[1] == region:
                ondemand[parsed[0]] = parsed[2]
        ec2 = session.client("ec2", region_name=region)
        history = _pages(ec2, "describe_spot_price_history", "SpotPriceHistory", StartTime=now,
                         ProductDescriptions=["Linux/UNIX"])
        spot = compute_spot_prices(history)
        for instance_type in offered:
            if instance_type in ondemand or instance_type in spot:
                prices[(instance_type, region)] = Price(ondemand.get(instance_type), spot.get(instance_type))
    return prices


def build_aws(session: Any, prices_from: str, snapshot: Path = AWS_SNAPSHOT, regions: Collection[str] | None = None,
              instance_types: Collection[str] | None = None, save_prices: Path | None = None) -> list[InstanceOffer]:
    """The AWS offers, with prices from ``prices_from`` ``api`` or ``snapshot``; fetched prices are also
    written to ``save_prices`` as a snapshot file, when given."""
    inventory = fetch_aws_inventory(session, regions, instance_types)
    if prices_from == "api":
        prices = fetch_aws_prices(session, inventory)
        if save_prices is not None:
            today = datetime.date.today().isoformat()
            save_prices.write_text(render_price_snapshot(prices, [
                "AWS EC2 price snapshot for skyserve_lite's catalog, from the Price List API (on-demand) and the",
                f"spot price history, by scripts/build_catalog.py aws. Snapshot date: {today}. A SNAPSHOT, not live."]))
    else:
        prices = parse_price_snapshot(snapshot.read_text(), str(snapshot))
    return compute_aws_offers(inventory.instance_types, inventory.offerings, prices)


def _pages(client: Any, method: str, key: str, **params: Any) -> list[Any]:
    """Every item under ``key`` of every page of ``method``."""
    return [item for page in client.get_paginator(method).paginate(**params) for item in page.get(key, [])]


@contextmanager
def moto_session() -> Iterator[Any]:
    """A boto3 session inside ``moto.mock_aws()``, with placeholder credentials and no configured endpoint
    URL (``AWS_ENDPOINT_URL`` would send the calls past moto)."""
    import boto3
    import botocore.session
    from moto import mock_aws

    with mock_aws():
        core = botocore.session.Session()
        core.set_config_variable("ignore_configured_endpoint_urls", True)
        core.set_credentials("testing", "testing", "testing")
        yield boto3.Session(botocore_session=core)


# --- GCP ----------------------------------------------------------------------------------------------------
@dataclass
class GcpInventory:
    machine_types: list[GcpMachineType] = field(default_factory=list)
    accelerator_types: list[GcpAcceleratorType] = field(default_factory=list)


def fetch_gcp_inventory(project: str, credentials: Any = None, endpoint: str | None = None,
                        regions: Collection[str] | None = None) -> GcpInventory:
    """What Compute Engine says about every zone of ``project`` (or of ``regions``): machine types and
    accelerator types, deprecated ones left out."""
    from google.api_core.client_options import ClientOptions
    from google.cloud import compute_v1

    if credentials is None:
        import google.auth

        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/compute.readonly"])
    options = ClientOptions(api_endpoint=endpoint) if endpoint else None
    machines = compute_v1.MachineTypesClient(credentials=credentials, client_options=options, transport="rest")
    accelerators = compute_v1.AcceleratorTypesClient(credentials=credentials, client_options=options,
                                                     transport="rest")
    inventory = GcpInventory()
    for _scope, listed in machines.aggregated_list(request={"project": project, "max_results": 500}):
        for item in listed.machine_types:
            zone = item.zone.rsplit("/", 1)[-1]
            if _is_current(item) and _wanted(zone, regions):
                inventory.machine_types.append(GcpMachineType(
                    item.name, zone, item.guest_cpus, item.memory_mb,
                    tuple((a.guest_accelerator_type, a.guest_accelerator_count) for a in item.accelerators),
                    item.is_shared_cpu, item.architecture))
    for _scope, listed in accelerators.aggregated_list(request={"project": project, "max_results": 500}):
        for item in listed.accelerator_types:
            zone = item.zone.rsplit("/", 1)[-1]
            if _is_current(item) and _wanted(zone, regions):
                inventory.accelerator_types.append(GcpAcceleratorType(item.name, zone,
                                                                      item.maximum_cards_per_instance))
    return inventory


def _is_current(item: Any) -> bool:
    return str(getattr(getattr(item, "deprecated", None), "state", "") or "") not in ("OBSOLETE", "DELETED")


def _wanted(zone: str, regions: Collection[str] | None) -> bool:
    return not regions or zone.rsplit("-", 1)[0] in regions


# The shipped GCP catalog's inventory, from Compute Engine's machine families and GPU regions and zones
# pages (no API answers ship with anything installed here). Regions and their zones:
CURATED_ZONES = {"us-central1": "abcf", "us-east1": "bcd", "us-west1": "abc", "europe-west4": "abc"}
# accelerator type -> zones that have it, and at most how many one machine takes
CURATED_GPUS: dict[str, tuple[str, int]] = {
    "nvidia-tesla-t4": ("us-central1-a,b,c,f us-east1-c,d us-west1-a,b europe-west4-a,b,c", 4),
    "nvidia-tesla-v100": ("us-central1-a,b,c,f us-east1-c us-west1-a,b europe-west4-a,b,c", 8),
    "nvidia-tesla-p100": ("us-central1-c,f us-east1-b,c us-west1-a,b europe-west4-a", 4),
    "nvidia-l4": ("us-central1-a,b,c us-east1-b,c,d us-west1-a,b,c europe-west4-a,b,c", 8),
    "nvidia-tesla-a100": ("us-central1-a,b,c,f us-east1-b us-west1-b europe-west4-a,b", 16),
    "nvidia-a100-80gb": ("us-central1-a,c europe-west4-a", 8),
    "nvidia-h100-80gb": ("us-central1-a,c europe-west4-b,c", 8),
}
# machine types: (name, vCPUs, memory GB, built-in accelerator type or "", count); a machine with a GPU
# built in is in the zones of that GPU, every other one in every zone above
_SHARED_CORE = [("e2-micro", 2, 1), ("e2-small", 2, 2), ("e2-medium", 2, 4)]
CURATED_MACHINES: list[tuple[str, int, float, str, int]] = [
    *((f"e2-standard-{n}", n, 4 * n, "", 0) for n in (2, 4, 8, 16, 32)),
    *((f"e2-highmem-{n}", n, 8 * n, "", 0) for n in (2, 4, 8, 16)),
    *((f"e2-highcpu-{n}", n, n, "", 0) for n in (2, 4, 8, 16, 32)),
    *((f"n2-{kind}-{n}", n, per * n, "", 0) for kind, per in (("standard", 4), ("highmem", 8), ("highcpu", 1))
      for n in (2, 4, 8, 16, 32, 48, 64, 80, 96)),
    *((f"n1-standard-{n}", n, 3.75 * n, "", 0) for n in (1, 2, 4, 8, 16, 32, 64, 96)),
    *((f"g2-standard-{n}", n, 4 * n, "nvidia-l4", gpus)
      for n, gpus in ((4, 1), (8, 1), (12, 1), (16, 1), (24, 2), (32, 1), (48, 4), (96, 8))),
    *((f"a2-highgpu-{g}g", 12 * g, 85 * g, "nvidia-tesla-a100", g) for g in (1, 2, 4, 8)),
    *((f"a2-ultragpu-{g}g", 12 * g, 170 * g, "nvidia-a100-80gb", g) for g in (1, 2, 4, 8)),
    ("a3-highgpu-8g", 208, 1872, "nvidia-h100-80gb", 8),
]


def _expand_zones(text: str) -> list[str]:
    """``us-central1-a,b us-east1-c`` -> ``us-central1-a, us-central1-b, us-east1-c``."""
    zones = []
    for part in text.split():
        region, letters = part.rsplit("-", 1)
        zones += [f"{region}-{letter}" for letter in letters.split(",")]
    return zones


def curated_gcp_inventory() -> GcpInventory:
    """The inventory of the shipped GCP catalog, as ``fetch_gcp_inventory`` would return it."""
    every_zone = [f"{region}-{letter}" for region, letters in CURATED_ZONES.items() for letter in letters]
    inventory = GcpInventory()
    for name, cpus, shared_memory_gb in _SHARED_CORE:
        inventory.machine_types += [GcpMachineType(name, z, cpus, shared_memory_gb * 1024, (), True, "X86_64")
                                    for z in every_zone]
    for name, cpus, memory_gb, accelerator, count in CURATED_MACHINES:
        zones = _expand_zones(CURATED_GPUS[accelerator][0]) if accelerator else every_zone
        built_in = ((accelerator, count),) if accelerator else ()
        inventory.machine_types += [GcpMachineType(name, z, cpus, int(memory_gb * 1024), built_in, False, "X86_64")
                                    for z in zones]
    for accelerator, (zones_text, most) in CURATED_GPUS.items():
        inventory.accelerator_types += [GcpAcceleratorType(accelerator, z, most) for z in _expand_zones(zones_text)]
    return inventory


def build_gcp(inventory: GcpInventory, snapshot: Path = GCP_SNAPSHOT) -> list[InstanceOffer]:
    return compute_gcp_offers(inventory.machine_types, inventory.accelerator_types,
                              parse_price_snapshot(snapshot.read_text(), str(snapshot)))


# --- output -------------------------------------------------------------------------------------------------
def snapshot_date(snapshot: Path) -> str:
    match = re.search(r"Snapshot date: (\d{4}-\d{2}-\d{2})", snapshot.read_text())
    return match.group(1) if match else "unknown"


def write_catalog(path: Path, offers: Sequence[InstanceOffer], comments: Sequence[str]) -> None:
    """The catalog file; gzipped (with no timestamp, so equal catalogs are equal bytes) for ``.gz``."""
    text = render_table(offers, comments).encode()
    path.write_bytes(gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)


def _aws_comments(moto: bool, prices_from: str, snapshot: Path) -> list[str]:
    source = "moto's copy of them (moto.mock_aws)" if moto else "the account's regions"
    if prices_from == "api":
        prices = (f"Prices: Price List API (on-demand) and spot price history, fetched "
                  f"{datetime.date.today().isoformat()}.")
    else:
        prices = (f"Prices: {snapshot.name}, a snapshot of public list prices dated {snapshot_date(snapshot)}; "
                  "unpriced types are chosen only by name.")
    return ["skyserve_lite instance catalog: aws. Made by scripts/build_catalog.py aws; see docs/catalog.md.",
            f"Specs and zones: EC2 DescribeInstanceTypes and DescribeInstanceTypeOfferings, {source}.", prices]


def _gcp_comments(curated: bool, snapshot: Path) -> list[str]:
    source = ("the curated inventory of scripts/build_catalog.py (Compute Engine's published shapes, GPU "
              "zones as documented)" if curated else "Compute Engine machineTypes and acceleratorTypes")
    return ["skyserve_lite instance catalog: gcp. Made by scripts/build_catalog.py gcp; see docs/catalog.md.",
            f"Specs and zones: {source}.",
            f"Prices: {snapshot.name}, a snapshot of public list prices dated {snapshot_date(snapshot)}; n1 rows "
            "with an accelerator_type are the machine plus that many GPUs."]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    clouds = parser.add_subparsers(dest="cloud", required=True)
    aws = clouds.add_parser("aws", help="build aws.csv.gz from EC2")
    aws.add_argument("--moto", action="store_true", help="answer from moto's copy of EC2 (no credentials)")
    aws.add_argument("--prices", choices=("api", "snapshot"), help="default: api, or snapshot with --moto")
    aws.add_argument("--regions", help="comma-separated; default: every region")
    aws.add_argument("--instance-types", help="comma-separated; default: every type")
    aws.add_argument("--price-snapshot", type=Path, default=AWS_SNAPSHOT)
    aws.add_argument("--save-prices", type=Path, help="with --prices api: also write them as a snapshot file")
    aws.add_argument("--out", type=Path, default=OUTPUTS["aws"])
    gcp = clouds.add_parser("gcp", help="build gcp.csv from Compute Engine")
    gcp.add_argument("--project", help="default: SKY_LITE_GCP_PROJECT, else the credentials'")
    gcp.add_argument("--endpoint", default=os.environ.get("SKY_LITE_GCP_ENDPOINT"), help="another API endpoint")
    gcp.add_argument("--anonymous", action="store_true", help="send no credentials (for a local fake)")
    gcp.add_argument("--curated", action="store_true", help="the curated inventory here, not the API")
    gcp.add_argument("--regions", help="comma-separated; default: every region")
    gcp.add_argument("--price-snapshot", type=Path, default=GCP_SNAPSHOT)
    gcp.add_argument("--out", type=Path, default=OUTPUTS["gcp"])
    args = parser.parse_args(argv)
    regions = set(args.regions.split(",")) if args.regions else None

    if args.cloud == "aws":
        prices_from = args.prices or ("snapshot" if args.moto else "api")
        types = set(args.instance_types.split(",")) if args.instance_types else None
        if args.moto:
            with moto_session() as session:
                offers = build_aws(session, prices_from, args.price_snapshot, regions, types, args.save_prices)
        else:
            import boto3

            offers = build_aws(boto3.Session(), prices_from, args.price_snapshot, regions, types, args.save_prices)
        comments = _aws_comments(args.moto, prices_from, args.price_snapshot)
    else:
        if args.curated:
            inventory = curated_gcp_inventory()
            if regions:
                inventory = GcpInventory([m for m in inventory.machine_types if _wanted(m.zone, regions)],
                                         [a for a in inventory.accelerator_types if _wanted(a.zone, regions)])
        else:
            project = args.project or os.environ.get("SKY_LITE_GCP_PROJECT") or _default_project()
            credentials = None
            if args.anonymous:
                from google.auth.credentials import AnonymousCredentials

                credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
            inventory = fetch_gcp_inventory(project, credentials, args.endpoint, regions)
        offers = build_gcp(inventory, args.price_snapshot)
        comments = _gcp_comments(args.curated, args.price_snapshot)
    write_catalog(args.out, offers, comments)
    priced = sum(1 for o in offers if o.ondemand_price is not None)
    print(f"{args.out}: {len(offers)} offers in {len({o.region for o in offers})} regions, {priced} priced",
          file=sys.stderr)
    return 0


def _default_project() -> str:
    import google.auth

    _, project = google.auth.default()
    if not project:
        raise SystemExit("no Google Cloud project: pass --project (or set SKY_LITE_GCP_PROJECT)")
    return str(project)


if __name__ == "__main__":
    sys.exit(main())
