"""``scripts/build_catalog.py aws``: under moto it reproduces the shipped catalog; the pure parts as tables;
the Price List path against a fake session that records its calls."""

from __future__ import annotations

import datetime
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("moto")

from skyserve_lite.catalog import Gpu, load_catalog
from skyserve_lite.catalog.build_aws import compute_aws_offers, compute_gpu, compute_offerings, compute_type_spec
from skyserve_lite.catalog.catalog import DATA
from skyserve_lite.catalog.prices import Price, compute_spot_prices, parse_price_list_product, parse_price_snapshot
from skyserve_lite.catalog.table import parse_offers, render_row, split_rows
from tests.catalog.script import build_catalog_script

KNOWN = ["p4d.24xlarge", "p4de.24xlarge", "p3dn.24xlarge", "g5.xlarge", "m5.large", "g6f.large", "inf2.xlarge",
         "t3.micro"]
REGIONS = ["us-east-1", "us-east-2", "us-west-2"]


def shipped_rows() -> list[str]:
    return split_rows(gzip.decompress((DATA / "aws.csv.gz").read_bytes()).decode(), "aws.csv.gz")


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The script's main, run with --moto (inside moto.mock_aws) for a few known types in three regions."""
    out = tmp_path_factory.mktemp("catalog") / "aws.csv.gz"
    script = build_catalog_script()
    assert script.main(["aws", "--moto", "--regions", ",".join(REGIONS), "--instance-types", ",".join(KNOWN),
                        "--out", str(out)]) == 0
    return split_rows(gzip.decompress(out.read_bytes()).decode(), str(out))


def test_the_moto_build_agrees_with_the_shipped_file(rebuilt: list[str]) -> None:
    wanted = {(t, r) for t in KNOWN for r in REGIONS}
    shipped = [row for row in shipped_rows() if tuple(row.split(",")[1::-1]) in wanted]
    assert rebuilt == shipped
    assert len(rebuilt) >= 20


@pytest.mark.parametrize(("instance_type", "vcpus", "memory", "gpu", "price"), [
    ("p4d.24xlarge", 96, 1152, Gpu("A100", 8, 40), 32.7726),
    ("g5.xlarge", 4, 16, Gpu("A10G", 1, 22.352), 1.006),
    ("m5.large", 2, 8, None, 0.096),
])
def test_the_moto_build_has_the_known_specs(rebuilt: list[str], instance_type: str, vcpus: float, memory: float,
                                            gpu: Gpu | None, price: float) -> None:
    offers = {o.instance_type: o for o in parse_offers("aws", rebuilt) if o.region == "us-east-1"}
    offer = offers[instance_type]
    assert (offer.vcpus, offer.memory_gib, offer.gpu, offer.ondemand_price) == (vcpus, memory, gpu, price)
    assert offer.zones and all(z.startswith("us-east-1") for z in offer.zones)
    assert load_catalog("aws").find(instance_type, "us-east-1") == offer


@pytest.mark.timeout(120)
def test_a_whole_region_rebuilt_under_moto_is_the_shipped_region(tmp_path: Path) -> None:
    out = tmp_path / "aws.csv.gz"
    assert build_catalog_script().main(["aws", "--moto", "--regions", "eu-west-3", "--out", str(out)]) == 0
    rebuilt = split_rows(gzip.decompress(out.read_bytes()).decode(), str(out))
    assert rebuilt == [row for row in shipped_rows() if row.startswith("eu-west-3,")]
    assert len(rebuilt) > 300


# --- the pure parts ---------------------------------------------------------------------------------------------
def item(name: str, vcpus: int = 4, mib: int = 16384, arches: tuple[str, ...] = ("x86_64",),
         **accelerators: Any) -> dict[str, Any]:
    return {"InstanceType": name, "VCpuInfo": {"DefaultVCpus": vcpus}, "MemoryInfo": {"SizeInMiB": mib},
            "ProcessorInfo": {"SupportedArchitectures": list(arches)}, **accelerators}


def gpus(name: str, count: int, mib: int, manufacturer: str = "NVIDIA") -> dict[str, Any]:
    return {"Gpus": [{"Name": name, "Manufacturer": manufacturer, "Count": count, "MemoryInfo": {"SizeInMiB": mib}}]}


@pytest.mark.parametrize(("info", "expected"), [
    (item("p4d", GpuInfo=gpus("A100", 8, 40960)), Gpu("A100", 8, 40)),
    (item("p4de", GpuInfo=gpus("A100", 8, 81920)), Gpu("A100-80GB", 8, 80)),
    (item("p3", GpuInfo=gpus("V100", 1, 16384)), Gpu("V100", 1, 16)),
    (item("p3dn", GpuInfo=gpus("V100", 8, 32768)), Gpu("V100-32GB", 8, 32)),
    (item("g4dn", GpuInfo=gpus("T4", 1, 16384)), Gpu("T4", 1, 16)),
    (item("g6", GpuInfo=gpus("L4", 1, 22888)), Gpu("L4", 1, 22.352)),
    (item("g6f", GpuInfo=gpus("L4", 0, 2861)), Gpu("L4", 0, 2.794)),
    (item("g7e", GpuInfo=gpus("RTX PRO Server 6000", 1, 98304)), Gpu("RTXPRO6000", 1, 96)),
    (item("inf2", NeuronInfo={"NeuronDevices": [{"Name": "Inferentia2", "Count": 1,
                                                  "MemoryInfo": {"SizeInMiB": 32768}}]}), Gpu("Inferentia2", 1, 32)),
    (item("dl2q", InferenceAcceleratorInfo={"Accelerators": [{"Name": "Qualcomm AI100", "Count": 8,
                                                               "MemoryInfo": {"SizeInMiB": 16000}}]}),
     Gpu("AI100", 8, 15.625)),
    (item("m5"), None),
])
def test_compute_gpu(info: dict[str, Any], expected: Gpu | None) -> None:
    assert compute_gpu(info) == expected


@pytest.mark.parametrize(("arches", "expected"), [
    (("x86_64",), "x86_64"), (("i386", "x86_64"), "x86_64"), (("arm64",), "arm64"), (("x86_64_mac",), None),
    (("arm64_mac",), None),
])
def test_compute_type_spec_arch(arches: tuple[str, ...], expected: str | None) -> None:
    spec = compute_type_spec(item("t", arches=arches))
    assert (spec.arch if spec else None) == expected


def test_compute_offerings_joins_regions_and_zones() -> None:
    offered = compute_offerings(
        "us-east-1",
        [{"InstanceType": "m5.large", "Location": "us-east-1"}, {"InstanceType": "x.large", "Location": "us-east-1"}],
        [{"InstanceType": "m5.large", "Location": "us-east-1b"}, {"InstanceType": "m5.large", "Location": "us-east-1a"},
         {"InstanceType": "other.large", "Location": "us-east-1a"}])
    assert offered == {"m5.large": ["us-east-1b", "us-east-1a"], "x.large": []}
    offers = compute_aws_offers([item("m5.large", 2, 8192)], {"us-east-1": offered},
                                {("m5.large", "us-east-1"): Price(0.096, 0.04)})
    assert [(o.instance_type, o.zones, o.vcpus, o.memory_gib, o.ondemand_price, o.spot_price) for o in offers] == [
        ("m5.large", ("us-east-1a", "us-east-1b"), 2, 8, 0.096, 0.04)]  # x.large has no specs: skipped


PRODUCT = {
    "product": {"attributes": {"instanceType": "p4d.24xlarge", "regionCode": "us-east-1", "operatingSystem": "Linux",
                               "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}},
    "terms": {"OnDemand": {"X.JRTCKXETXF": {"priceDimensions": {"X.JRTCKXETXF.6YS6EN2CT7": {
        "unit": "Hrs", "pricePerUnit": {"USD": "32.7726000000"}}}}}},
}


@pytest.mark.parametrize(("change", "expected"), [
    ({}, ("p4d.24xlarge", "us-east-1", 32.7726)),
    ({"operatingSystem": "Windows"}, None),
    ({"tenancy": "Dedicated"}, None),
    ({"capacitystatus": "UnusedCapacityReservation"}, None),
])
def test_parse_price_list_product(change: dict[str, str], expected: tuple[str, str, float] | None) -> None:
    product = json.loads(json.dumps(PRODUCT))
    product["product"]["attributes"].update(change)
    assert parse_price_list_product(json.dumps(product)) == expected


def test_spot_prices_are_the_newest_per_zone_then_the_highest_zone() -> None:
    t0, t1 = datetime.datetime(2026, 12, 1, 10), datetime.datetime(2026, 12, 1, 11)
    history: list[dict[str, Any]] = [
        {"InstanceType": "m5.large", "AvailabilityZone": "a", "SpotPrice": "0.050", "Timestamp": t0},
        {"InstanceType": "m5.large", "AvailabilityZone": "a", "SpotPrice": "0.030", "Timestamp": t1},
        {"InstanceType": "m5.large", "AvailabilityZone": "b", "SpotPrice": "0.040", "Timestamp": t0},
        {"InstanceType": "c5.large", "AvailabilityZone": "a"},  # no price: ignored
    ]
    assert compute_spot_prices(history) == {"m5.large": 0.04}


# --- the Price List path, against a fake session ---------------------------------------------------------------
class FakeClient:
    def __init__(self, service: str, region: str, calls: list[tuple[str, str, str, dict[str, Any]]],
                 pages: dict[str, list[dict[str, Any]]]) -> None:
        self.service, self.region, self.calls, self.pages = service, region, calls, pages

    def get_paginator(self, method: str) -> FakeClient:
        self._method = method
        return self

    def paginate(self, **params: Any) -> Iterator[dict[str, Any]]:
        self.calls.append((self.service, self.region, self._method, params))
        where = f".{params['LocationType']}" if "LocationType" in params else ""
        yield from self.pages.get(f"{self.service}.{self._method}.{self.region}{where}", [{}])

    def describe_regions(self) -> dict[str, Any]:
        self.calls.append((self.service, self.region, "describe_regions", {}))
        return {"Regions": [{"RegionName": "us-east-1"}]}


class FakeSession:
    """A boto3 session whose clients answer from ``pages`` (``service.method.region[.LocationType]`` -> pages)
    and record every call."""

    def __init__(self, pages: dict[str, list[dict[str, Any]]]) -> None:
        self.pages = pages
        self.calls: list[tuple[str, str, str, dict[str, Any]]] = []

    def client(self, service: str, region_name: str) -> FakeClient:
        return FakeClient(service, region_name, self.calls, self.pages)


def test_api_prices_come_from_the_price_list_and_the_spot_history(tmp_path: Path) -> None:
    session = FakeSession({
        "ec2.describe_instance_type_offerings.us-east-1.region": [{"InstanceTypeOfferings": [
            {"InstanceType": "p4d.24xlarge", "Location": "us-east-1"}]}],
        "ec2.describe_instance_type_offerings.us-east-1.availability-zone": [{"InstanceTypeOfferings": [
            {"InstanceType": "p4d.24xlarge", "Location": "us-east-1a"}]}],
        "ec2.describe_instance_types.us-east-1": [{"InstanceTypes": [
            item("p4d.24xlarge", 96, 1179648, GpuInfo=gpus("A100", 8, 40960))]}],
        "pricing.get_products.us-east-1": [{"PriceList": [json.dumps(PRODUCT)]}],
        "ec2.describe_spot_price_history.us-east-1": [{"SpotPriceHistory": [
            {"InstanceType": "p4d.24xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "9.83"}]}],
    })
    saved = tmp_path / "prices.csv"
    offers = build_catalog_script().build_aws(session, "api", save_prices=saved)
    assert [render_row(o) for o in offers] == ["us-east-1,p4d.24xlarge,us-east-1a,96,1152,A100,8,40,x86_64,"
                                               "32.7726,9.83,"]
    pricing = [params for service, _r, method, params in session.calls if method == "get_products"]
    assert pricing[0]["ServiceCode"] == "AmazonEC2"
    assert {"Type": "TERM_MATCH", "Field": "regionCode", "Value": "us-east-1"} in pricing[0]["Filters"]
    spot = [params for _s, _r, method, params in session.calls if method == "describe_spot_price_history"]
    assert spot[0]["ProductDescriptions"] == ["Linux/UNIX"]
    assert parse_price_snapshot(saved.read_text()) == {("p4d.24xlarge", "us-east-1"): Price(32.7726, 9.83)}
    assert "Snapshot date: " in saved.read_text()
