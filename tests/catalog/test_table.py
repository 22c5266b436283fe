"""The data file format, the shipped files, and loading them: lazily, once, quickly."""

from __future__ import annotations

import gzip
import time

import pytest

from skyserve_lite.catalog import Catalog, CatalogError, Gpu, InstanceOffer, Need, load_catalog
from skyserve_lite.catalog.catalog import DATA, DATA_FILES
from skyserve_lite.catalog.prices import parse_price_snapshot
from skyserve_lite.catalog.table import HEADER, find_region_runs, parse_offers, render_row, render_table, split_rows

OFFERS = [
    InstanceOffer("gcp", "n1-standard-8", "us-central1", ("us-central1-a", "us-central1-b"), 8, 30, Gpu("T4", 2, 16),
                  "x86_64", 1.079998, None, "nvidia-tesla-t4"),
    InstanceOffer("gcp", "e2-micro", "us-central1", ("us-central1-a",), 0.25, 1, None, "x86_64", 0.008376, 0.0025),
    InstanceOffer("gcp", "t2a-standard-1", "us-east1", (), 1, 4, None, "arm64", None, None),
    InstanceOffer("gcp", "a", "us-east1-x", ("us-east1-xa",), 1, 0.612, None, "x86_64", None, None),
]


def shipped_text(cloud: str) -> str:
    data = (DATA / DATA_FILES[cloud]).read_bytes()
    return (gzip.decompress(data) if DATA_FILES[cloud].endswith(".gz") else data).decode()


def test_render_then_parse_gives_the_offers_back() -> None:
    text = render_table(OFFERS, ["made for a test"])
    assert text.startswith("# made for a test\n" + HEADER + "\n")
    rows = split_rows(text, "t")
    assert sorted(parse_offers("gcp", rows), key=repr) == sorted(OFFERS, key=repr)
    assert render_row(OFFERS[0]) == ("us-central1,n1-standard-8,us-central1-a;us-central1-b,8,30,T4,2,16,x86_64,"
                                     "1.079998,,nvidia-tesla-t4")


def test_rows_of_a_region_are_one_run_even_when_another_region_extends_its_name() -> None:
    rows = split_rows(render_table(OFFERS), "t")
    runs = find_region_runs(rows)
    assert {region: end - start for region, (start, end) in runs.items()} == {
        "us-central1": 2, "us-east1": 1, "us-east1-x": 1}


def test_a_cell_with_a_comma_is_refused() -> None:
    with pytest.raises(ValueError, match="comma"):
        render_row(InstanceOffer("aws", "a,b", "r1", (), 1, 1, None, "x86_64", None, None))


def test_a_file_of_another_format_is_refused() -> None:
    with pytest.raises(CatalogError, match="not a catalog file of this version"):
        Catalog.from_text("aws", "instance_type,region\nm5.large,us-east-1\n", "old.csv")


def test_regions_are_parsed_only_when_asked_for() -> None:
    # us-east1's row is damaged: a catalog that is never asked about us-east1 never notices
    rows = render_table(OFFERS).replace(",t2a-standard-1,,1,", ",t2a-standard-1,,one,")
    catalog = Catalog.from_text("gcp", rows)
    assert catalog.regions() == ("us-central1", "us-east1", "us-east1-x")
    # by name: a need never lands on the shared-core e2-micro (choose.CPU_FAMILIES)
    assert catalog.choose(Need(instance_type="e2-micro"), "us-central1").instance_type == "e2-micro"
    with pytest.raises(ValueError):
        catalog.offers("us-east1")


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_shipped_files_are_in_the_format_sorted_and_round_trip(cloud: str) -> None:
    text = shipped_text(cloud)
    rows = split_rows(text, cloud)
    assert rows == sorted(rows)
    offers = parse_offers(cloud, rows)
    assert [render_row(o) for o in offers] == rows
    assert all(o.cloud == cloud and o.arch in ("x86_64", "arm64") for o in offers)
    assert len({(o.instance_type, o.region, o.accelerator_type, o.gpu) for o in offers}) == len(offers)


def test_shipped_aws_catalog_is_small_and_covers_every_region_moto_has_offerings_for() -> None:
    assert (DATA / "aws.csv.gz").stat().st_size < 200_000
    assert len(load_catalog("aws").regions()) == 30
    assert {"us-east-1", "us-east-2", "us-west-2", "eu-west-1", "ap-northeast-1"} <= set(load_catalog("aws").regions())


# snapshot items the catalog has no machine for: p3 is priced but absent from moto's DescribeInstanceTypes
# data; GCP's accelerator types are priced per GPU and enter the n1 offers' prices
NOT_MACHINES = {"aws": {"p3.2xlarge", "p3.8xlarge", "p3.16xlarge"},
                "gcp": {"nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100"}}


@pytest.mark.parametrize(("cloud", "snapshot"), [("aws", "aws_prices_snapshot.csv"),
                                                 ("gcp", "gcp_prices_snapshot.csv")])
def test_every_snapshot_price_of_an_offered_machine_is_in_the_catalog(cloud: str, snapshot: str) -> None:
    prices = parse_price_snapshot((DATA / snapshot).read_text(), snapshot)
    catalog = load_catalog(cloud)
    everywhere = {o.instance_type for o in catalog.offers()}
    for (item, region), price in prices.items():
        offer = catalog.find(item, region)
        if offer is not None:
            assert offer.ondemand_price == price.ondemand
    assert {item for item, _region in prices} - everywhere == NOT_MACHINES[cloud]
    priced = {(o.instance_type, o.region) for o in catalog.offers() if o.ondemand_price is not None
              and o.accelerator_type is None}
    assert priced <= set(prices)


def test_the_aws_snapshot_is_dated_and_says_it_is_a_snapshot() -> None:
    head = (DATA / "aws_prices_snapshot.csv").read_text().split("\nitem,", 1)[0]
    assert "Snapshot date: 2026-12-01" in head and "SNAPSHOT" in head
    assert "2026-12-01" in shipped_text("aws").split("\n" + HEADER, 1)[0]


def test_load_catalog_is_cached() -> None:
    assert load_catalog("aws") is load_catalog("aws")


def test_loading_the_aws_catalog_and_choosing_in_a_region_is_fast() -> None:
    # docs/catalog.md gives the figures; this only guards against a format that parses every row on load
    started = time.perf_counter()
    catalog = Catalog.from_text("aws", shipped_text("aws"), "aws.csv.gz")
    catalog.choose(Need(accelerator="A100", accelerator_count=8), "us-east-1")
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(("text", "problem"), [
    ("instance_type,region,price\n", "the header should be"),
    ("item,region,ondemand_usd_per_hour,spot_usd_per_hour\nm5.large,r1,0.096,\nm5.large,r1,0.1,\n", "priced twice"),
    ("item,region,ondemand_usd_per_hour,spot_usd_per_hour\nm5.large,r1,-1,\n", "not positive"),
])
def test_a_bad_price_snapshot_is_refused(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_price_snapshot(text, "s.csv")
