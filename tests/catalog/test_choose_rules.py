"""The choice rule on small catalogs made for each case: markets, ties, prices, zones, GPUs.

The catalogs here are of a cloud without SkyPilot's sizing rules (``choose.CPU_FAMILIES``), so a CPU need
ranks every type; test_choose_sizing.py has those rules.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from skyserve_lite.catalog import Catalog, CatalogError, Gpu, InstanceOffer, Need

T4 = Gpu("T4", 1, 16.0)
CLOUD = "lab"  # neither families nor a default type


def offer(instance_type: str, vcpus: float = 2, memory: float = 8, ondemand: float | None = 1.0,
          spot: float | None = None, region: str = "r1", zones: tuple[str, ...] = ("r1a", "r1b"),
          gpu: Gpu | None = None, accelerator_type: str | None = None, cloud: str = CLOUD) -> InstanceOffer:
    return InstanceOffer(cloud, instance_type, region, zones, vcpus, memory, gpu, "x86_64", ondemand, spot,
                         accelerator_type)


def chosen(offers: list[InstanceOffer], need: Need, default_region: str | None = "r1") -> str:
    picked = Catalog.from_offers(offers[0].cloud, offers).choose(need, default_region)
    return f"{picked.instance_type}@{picked.region}" + (f"+{picked.accelerator_type}" if picked.accelerator_type
                                                         else "")


ANY = Need(cpus=1, cpus_at_least=True)

# (offers, need, default region) -> "type@region"
CASES = [
    pytest.param([offer("a", ondemand=1.0, spot=0.9), offer("b", ondemand=0.5, spot=None)], ANY, "r1", "b@r1",
                 id="on-demand-ranks-by-on-demand"),
    pytest.param([offer("a", ondemand=1.0, spot=0.3), offer("b", ondemand=0.5, spot=0.4)],
                 replace(ANY, use_spot=True), "r1", "a@r1", id="spot-ranks-by-spot"),
    # b has no spot price: spot asked, it ranks by its on-demand price, which is above a's spot price
    pytest.param([offer("a", ondemand=1.0, spot=0.6), offer("b", ondemand=0.5, spot=None)],
                 replace(ANY, use_spot=True), "r1", "b@r1", id="spot-falls-back-to-on-demand"),
    pytest.param([offer("a", ondemand=None, spot=0.1), offer("b", ondemand=0.5)], ANY, "r1", "b@r1",
                 id="spot-only-price-is-unpriced-on-demand"),
    pytest.param([offer("a", ondemand=None), offer("b", ondemand=9.0)], ANY, "r1", "b@r1",
                 id="unpriced-never-chosen-by-need"),
    pytest.param([offer("a", ondemand=None), offer("b", ondemand=9.0)], Need(instance_type="a"), "r1", "a@r1",
                 id="unpriced-chosen-by-name"),
    pytest.param([offer("a", vcpus=4), offer("b", vcpus=2)], ANY, "r1", "b@r1", id="tie-fewer-vcpus"),
    pytest.param([offer("a", memory=16), offer("b", memory=8)], ANY, "r1", "b@r1", id="tie-less-memory"),
    pytest.param([offer("b"), offer("a")], ANY, "r1", "a@r1", id="tie-type-name"),
    pytest.param([offer("a", region="r2", zones=("r2a",)), offer("a", region="r1")], ANY, None, "a@r1",
                 id="tie-region-name"),
    pytest.param([offer("a", region="r2", zones=("r2a",), ondemand=0.5), offer("a", region="r1")], ANY, None,
                 "a@r2", id="no-region-no-default-every-region"),
    pytest.param([offer("a", region="r2", zones=("r2a",), ondemand=0.5), offer("a", region="r1")], ANY, "r1",
                 "a@r1", id="default-region"),
    pytest.param([offer("a", region="r2", zones=("r2a",)), offer("a", region="r1", ondemand=0.5)],
                 replace(ANY, region="r2"), "r1", "a@r2", id="region-beats-default"),
    pytest.param([offer("a", ondemand=0.5, zones=("r1a",)), offer("b", zones=("r1a", "r1b"))],
                 replace(ANY, zone="r1b"), "r1", "b@r1", id="zone-keeps-offers-listing-it"),
    pytest.param([offer("a", ondemand=0.5, region="r2", zones=("r2a",)), offer("b", zones=("r1a",))],
                 replace(ANY, zone="r2a"), "r1", "a@r2", id="zone-alone-decides-region"),
    pytest.param([offer("g", ondemand=0.1, gpu=T4), offer("c", ondemand=0.5)], ANY, "r1", "c@r1",
                 id="cpu-task-never-on-a-gpu-type"),
    pytest.param([offer("g", ondemand=0.9, gpu=T4), offer("c", ondemand=0.5)], Need(accelerator="t4"), "r1",
                 "g@r1", id="accelerator-any-case-count-1"),
    pytest.param([offer("g", gpu=Gpu("T4", 2, 16)), offer("h", ondemand=2, gpu=Gpu("T4", 4, 16))],
                 Need(accelerator="T4", accelerator_count=4), "r1", "h@r1", id="accelerator-count-exact"),
    pytest.param([offer("n1", ondemand=0.1), offer("n1", ondemand=0.45, gpu=T4, accelerator_type="nvidia-tesla-t4")],
                 Need(instance_type="n1"), "r1", "n1@r1", id="named-n1-is-the-bare-machine"),
    pytest.param([offer("n1", ondemand=0.1), offer("n1", ondemand=0.45, gpu=T4, accelerator_type="nvidia-tesla-t4")],
                 Need(instance_type="n1", accelerator="T4"), "r1", "n1@r1+nvidia-tesla-t4",
                 id="named-n1-with-its-gpu"),
    pytest.param([offer("p", gpu=Gpu("A100", 8, 40))], Need(instance_type="p"), "r1", "p@r1",
                 id="named-type-with-built-in-gpus"),
    pytest.param([offer("f", ondemand=0.1, gpu=Gpu("L4", 0, 2.8)), offer("g", gpu=Gpu("L4", 1, 22))],
                 Need(accelerator="L4"), "r1", "g@r1", id="fractional-gpu-not-chosen-by-count"),
    pytest.param([offer("a", vcpus=4), offer("b", vcpus=8, ondemand=0.5)], Need(cpus=4), "r1", "a@r1",
                 id="cpus-exact"),
    pytest.param([offer("a", vcpus=4), offer("b", vcpus=8, ondemand=0.5)], Need(cpus=4, cpus_at_least=True), "r1",
                 "b@r1", id="cpus-at-least"),
    pytest.param([offer("a", memory=16), offer("b", memory=32, ondemand=0.5)], Need(memory_gib=16), "r1", "a@r1",
                 id="memory-exact"),
    pytest.param([offer("a", memory=16), offer("b", memory=32, ondemand=0.5)],
                 Need(memory_gib=16, memory_at_least=True), "r1", "b@r1", id="memory-at-least"),
    pytest.param([offer("a", ondemand=0.01, cloud="aws"), offer("m6i.2xlarge", ondemand=None, cloud="aws")], Need(),
                 "r1", "m6i.2xlarge@r1", id="nothing-asked-is-the-default-even-unpriced"),
]


@pytest.mark.parametrize(("offers", "need", "default_region", "expected"), CASES)
def test_rule(offers: list[InstanceOffer], need: Need, default_region: str | None, expected: str) -> None:
    assert chosen(offers, need, default_region) == expected


@pytest.mark.parametrize("seed", range(5))
def test_the_choice_does_not_depend_on_the_catalog_order(seed: int) -> None:
    # nine offers at one price: the order of the file must not matter, only the tie-breaking keys
    offers = [offer(name, vcpus=v, memory=m, region=r, zones=(f"{r}a",))
              for name in ("x", "y", "z") for v, m, r in ((2, 8, "r2"), (2, 8, "r1"), (4, 8, "r1"))]
    random.Random(seed).shuffle(offers)
    candidates = Catalog.from_offers(CLOUD, offers).candidates(ANY, None)
    assert [(o.instance_type, o.vcpus, o.region) for o in candidates][:4] == [
        ("x", 2, "r1"), ("x", 2, "r2"), ("y", 2, "r1"), ("y", 2, "r2")]


def test_candidates_list_every_fit_cheapest_first() -> None:
    offers = [offer("a", ondemand=3), offer("b", ondemand=1), offer("c", ondemand=None), offer("d", ondemand=2)]
    assert [o.instance_type for o in Catalog.from_offers(CLOUD, offers).candidates(ANY, "r1")] == ["b", "d", "a"]


@pytest.mark.parametrize(("offers", "need", "field"), [
    pytest.param([offer("a", ondemand=None)], ANY, "resources.cpus", id="only-unpriced"),
    pytest.param([offer("a", gpu=T4)], ANY, "resources.accelerators", id="only-gpu-types-for-a-cpu-task"),
    pytest.param([offer("a")], Need(), "resources.instance_type", id="no-default-type-for-the-cloud"),
])
def test_rule_errors(offers: list[InstanceOffer], need: Need, field: str) -> None:
    with pytest.raises(CatalogError) as caught:
        Catalog.from_offers(CLOUD, offers).choose(need, "r1")
    assert caught.value.field == field


def test_offer_price_is_the_market_asked_when_known() -> None:
    both, ondemand_only = offer("a", ondemand=1.0, spot=0.3), offer("b", ondemand=1.0)
    neither = offer("c", ondemand=None)
    assert (both.price(False), both.price(True)) == (1.0, 0.3)
    assert (ondemand_only.price(False), ondemand_only.price(True)) == (1.0, 1.0)
    assert (neither.price(False), neither.price(True)) == (None, None)
