"""``scripts/build_catalog.py gcp``: the real client library against a fake of Compute Engine's listings on
127.0.0.1 serving the curated inventory gives the shipped catalog; the n1 + GPU rules as a table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("google.cloud.compute_v1")

from google.auth.credentials import AnonymousCredentials

from skyserve_lite.catalog.build_gcp import GcpAcceleratorType, GcpMachineType, compute_gcp_offers
from skyserve_lite.catalog.catalog import DATA
from skyserve_lite.catalog.prices import Price
from skyserve_lite.catalog.table import split_rows
from tests.catalog.gce_catalog_fake import FakeCatalogApi, serve_catalog_api
from tests.catalog.script import build_catalog_script


def shipped_rows() -> list[str]:
    return split_rows((DATA / "gcp.csv").read_text(), "gcp.csv")


@pytest.fixture
def api() -> Iterator[tuple[FakeCatalogApi, str]]:
    inventory = build_catalog_script().curated_gcp_inventory()
    fake = FakeCatalogApi(inventory.machine_types, inventory.accelerator_types, page_size=150)
    with serve_catalog_api(fake) as endpoint:
        yield fake, endpoint


def test_the_listings_through_the_client_library_are_the_curated_inventory(api: tuple[FakeCatalogApi, str]) -> None:
    fake, endpoint = api
    script = build_catalog_script()
    fetched = script.fetch_gcp_inventory("p", AnonymousCredentials(), endpoint)  # type: ignore[no-untyped-call]
    curated = script.curated_gcp_inventory()
    assert sorted(fetched.machine_types, key=repr) == sorted(curated.machine_types, key=repr)
    assert sorted(fetched.accelerator_types, key=repr) == sorted(curated.accelerator_types, key=repr)
    pages = [query.get("pageToken") for path, query in fake.requests if path.endswith("/aggregated/machineTypes")]
    assert pages[0] is None and len(pages) == -(-len(curated.machine_types) // 150)  # every page was walked


def test_the_script_against_the_api_builds_the_shipped_catalog(api: tuple[FakeCatalogApi, str],
                                                               tmp_path: Path) -> None:
    _fake, endpoint = api
    out = tmp_path / "gcp.csv"
    assert build_catalog_script().main(["gcp", "--project", "p", "--endpoint", endpoint, "--anonymous",
                                        "--out", str(out)]) == 0
    assert split_rows(out.read_text(), str(out)) == shipped_rows()


def test_the_curated_build_is_the_shipped_file_byte_for_byte(tmp_path: Path) -> None:
    out = tmp_path / "gcp.csv"
    assert build_catalog_script().main(["gcp", "--curated", "--out", str(out)]) == 0
    assert out.read_bytes() == (DATA / "gcp.csv").read_bytes()


def test_regions_narrow_the_build(api: tuple[FakeCatalogApi, str], tmp_path: Path) -> None:
    _fake, endpoint = api
    out = tmp_path / "gcp.csv"
    build_catalog_script().main(["gcp", "--project", "p", "--endpoint", endpoint, "--anonymous", "--regions",
                                 "us-west1", "--out", str(out)])
    rows = split_rows(out.read_text(), str(out))
    assert rows and rows == [r for r in shipped_rows() if r.startswith("us-west1,")]


# --- the n1 + GPU rules -------------------------------------------------------------------------------------------
def n1(cpus: int, zones: tuple[str, ...] = ("us-central1-a", "us-central1-b")) -> list[GcpMachineType]:
    return [GcpMachineType(f"n1-standard-{cpus}", z, cpus, int(3.75 * cpus * 1024)) for z in zones]


GPUS = [GcpAcceleratorType("nvidia-tesla-v100", "us-central1-a", 8),
        GcpAcceleratorType("nvidia-tesla-v100", "us-central1-b", 2),
        GcpAcceleratorType("nvidia-tesla-t4", "us-central1-b", 4)]


@pytest.mark.parametrize(("cpus", "expected"), [
    # (accelerator type, count, zones): one V100 takes up to 12 vCPUs, 2 up to 24, 4 up to 48, 8 up to 96;
    # us-central1-b takes at most 2 V100s; T4s only in us-central1-b
    (8, {("nvidia-tesla-t4", 1, "b"), ("nvidia-tesla-t4", 2, "b"), ("nvidia-tesla-t4", 4, "b"),
         ("nvidia-tesla-v100", 1, "ab"), ("nvidia-tesla-v100", 2, "ab"), ("nvidia-tesla-v100", 4, "a"),
         ("nvidia-tesla-v100", 8, "a")}),
    (16, {("nvidia-tesla-t4", 1, "b"), ("nvidia-tesla-t4", 2, "b"), ("nvidia-tesla-t4", 4, "b"),
          ("nvidia-tesla-v100", 2, "ab"), ("nvidia-tesla-v100", 4, "a"), ("nvidia-tesla-v100", 8, "a")}),
    (64, {("nvidia-tesla-t4", 4, "b"), ("nvidia-tesla-v100", 8, "a")}),
])
def test_n1_takes_the_gpus_its_size_allows_where_the_zone_has_them(cpus: int,
                                                                    expected: set[tuple[str, int, str]]) -> None:
    offers = compute_gcp_offers(n1(cpus), GPUS, {})
    attached = {(o.accelerator_type, o.gpu.count, "".join(z[-1] for z in o.zones))
                for o in offers if o.accelerator_type and o.gpu}
    assert attached == expected
    assert [o.accelerator_type for o in offers].count(None) == 1  # and the machine alone


def test_an_n1_with_gpus_costs_the_machine_plus_the_gpus() -> None:
    prices = {("n1-standard-8", "us-central1"): Price(0.379998, 0.08), ("nvidia-tesla-v100", "us-central1"):
              Price(2.48, None)}
    offers = {(o.accelerator_type, o.gpu.count if o.gpu else 0): o for o in compute_gcp_offers(n1(8), GPUS, prices)}
    assert offers[(None, 0)].ondemand_price == 0.379998
    assert offers[("nvidia-tesla-v100", 4)].ondemand_price == 10.299998
    assert offers[("nvidia-tesla-v100", 4)].spot_price is None  # the GPU's spot price is unknown
    assert offers[("nvidia-tesla-t4", 1)].ondemand_price is None  # the T4 is not priced


def test_built_in_gpus_shared_core_and_arm() -> None:
    offers = {o.instance_type: o for o in compute_gcp_offers([
        GcpMachineType("a2-ultragpu-1g", "us-central1-a", 12, 174080, (("nvidia-a100-80gb", 1),)),
        GcpMachineType("e2-micro", "us-central1-a", 2, 1024, (), True),
        GcpMachineType("t2a-standard-1", "us-central1-a", 1, 4096, (), False, "ARM64"),
    ], [], {})}
    gpu = offers["a2-ultragpu-1g"].gpu
    assert gpu is not None and (gpu.name, gpu.count, gpu.memory_gib) == ("A100-80GB", 1, 80)
    assert offers["a2-ultragpu-1g"].accelerator_type is None
    assert (offers["e2-micro"].vcpus, offers["e2-micro"].memory_gib) == (0.25, 1)
    assert offers["t2a-standard-1"].arch == "arm64"
