"""Which offers fit a task's resources, cheapest first, and why none does. Pure.

The rule, in the order the constraints are applied (the first one that leaves nothing is the one an error
names):

1. place: ``region``, else the caller's default region, else every region; ``zone`` keeps the offers that
   list it (``zone`` alone, without a region, decides the region itself);
2. ``instance_type``: that type only;
3. accelerators: none unless asked (a CPU task never lands on a GPU machine, nor a named GCP n1 on one with
   GPUs attached); else that name in any case, and exactly that count (1 when not given);
4. a CPU-only need (no ``instance_type``, no accelerators) is sized as SkyPilot sizes it: only from
   ``CPU_FAMILIES`` (never a burstable or shared-core type), and with ``cpus`` but no ``memory``, at least
   ``DEFAULT_MEMORY_PER_VCPU`` GiB per vCPU of the offer;
5. ``cpus``, ``memory``: equal, or at least that much with ``4+``;
6. price: offers the catalog has no price for are left out, unless ``instance_type`` named the type.

What remains is ordered by the price of the market asked (the spot price for ``use_spot`` when known, else
on-demand), then fewer vCPUs, less memory, fewer GPUs, the type's name and the region's, so the same
catalog and task always give the same choice. With no machine constraint at all the answer is the cloud's
default type (``DEFAULT_INSTANCE_TYPES``, SkyPilot's 8 vCPUs and 32 GiB), priced or not; where the place
lacks it, the cheapest of SkyPilot's default shape there. ``describe_sizing`` says which of these rules
filled in what a task left unsaid.

When a constraint leaves nothing, and the same constraints would fit in another region, the error names
``resources.region`` (or ``resources.zone``) and where they would fit; otherwise it names the constraint's
own field and what the catalog has instead.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from skyserve_lite.catalog.accelerators import is_same_accelerator
from skyserve_lite.catalog.model import CatalogError, InstanceOffer, Need

# SkyPilot sizes a task that names neither an instance type nor accelerators from these families only (its AWS
# and GCP catalogs' default families): current general-purpose (4 GiB per vCPU), compute (2 on AWS, 1 on
# n2-highcpu) and memory (8) families. So a need never lands on a burstable type (AWS t2/t3/t3a/t4g: a
# t3.micro's 2 vCPUs run at a 10% baseline on credits, with 1 GiB), a shared-core one (GCP e2-micro/small/
# medium, f1-micro, g1-small: a fraction of a core) or an older generation that ties a newer one on price
# (m5.large and m6i.large are both $0.096 in us-east-1; the name would pick m5).
CPU_FAMILIES: Mapping[str, tuple[str, ...]] = {
    "aws": ("c6i", "c6id", "c7i", "m6i", "m6id", "m7i", "r6i", "r6id", "r7i"),
    "gcp": ("n2-highcpu", "n2-highmem", "n2-standard", "n4-highcpu", "n4-highmem", "n4-standard"),
}
# SkyPilot's fill-ins for what a CPU-only task leaves unsaid: memory, at least 4 GiB per vCPU of the offer
# (``cpus: 4+`` is m6i.xlarge, 4 vCPUs and 16 GiB, not c6i.xlarge's 8 GiB); nothing at all, 8+ vCPUs.
DEFAULT_MEMORY_PER_VCPU = 4.0
DEFAULT_VCPUS = 8.0
# A task that names nothing gets SkyPilot's default: the cheapest of its families with 8+ vCPUs and 4 GiB per
# vCPU, which in every priced region of the shipped catalogs is this type (8 vCPUs, 32 GiB; tests check it).
# Named rather than looked up so that a region the catalog has no prices for still gets it. The providers keep
# their own default for versions stored before placements were resolved: those launch what they always did.
DEFAULT_INSTANCE_TYPES = {"aws": "m6i.2xlarge", "gcp": "n2-standard-8"}

# What ``describe_sizing`` says, and plans show after a candidate's need.
SIZED_BY_DEFAULT = "no resources given: SkyPilot's default 8 vCPUs, 32 GiB"
SIZED_BY_MEMORY_RATIO = "memory not given: 4 GiB per vCPU, SkyPilot's CPU families"
SIZED_BY_FAMILIES = "SkyPilot's CPU families"

_LISTED = 12  # values an error lists before it elides the rest


class OfferSource(Protocol):
    """What the chooser reads: a cloud's offers, by region."""

    @property
    def cloud(self) -> str: ...

    def offers(self, region: str | None = None) -> Sequence[InstanceOffer]: ...

    def regions(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class _Step:
    """One shape constraint: the field it comes from, which offers it keeps, and what to say when it keeps
    none: ``explain(offers that reached it, where they are, the constraints before it)``, e.g.
    ``explain(..., " in us-east-1", " with 8x A100")``."""

    field: str
    keeps: Callable[[InstanceOffer], bool]
    explain: Callable[[Sequence[InstanceOffer], str, str], str]
    prior: str
    # more to say when the constraint fits nowhere at all (not merely elsewhere): "similar: p4d.24xlarge"
    hint: Callable[[Sequence[InstanceOffer]], str] | None = None


def compute_sort_key(offer: InstanceOffer, spot: bool) -> tuple[float, float, float, int, str, str, str]:
    """Cheapest first; ties by fewer vCPUs, less memory, fewer GPUs, then names. Unpriced offers last."""
    price = offer.price(spot)
    return (math.inf if price is None else price, offer.vcpus, offer.memory_gib,
            offer.gpu.count if offer.gpu else 0, offer.instance_type, offer.region, offer.accelerator_type or "")


def find_candidates(source: OfferSource, need: Need, default_region: str | None) -> list[InstanceOffer]:
    """Every offer that satisfies ``need``, cheapest first (see the module's rule). Never empty: raises
    ``CatalogError`` naming the constraint at fault instead."""
    if need.is_unconstrained:
        return _find_default(source, need, default_region)
    region = _region_asked(need, default_region)
    scope = _find_place(source, need, region)
    steps = _plan_steps(source.cloud, need)
    where = _describe_place(region, need.zone, default_region if need.region is None else None)
    fits, failed = _apply(steps, scope)
    if failed is not None:
        step, reached = failed
        raise _explain_failure(source, steps, need, region, step, step.explain(reached, where, step.prior), reached)
    if need.instance_type is None:
        priced = [o for o in fits if o.price(need.use_spot) is not None]
        if not priced:
            raise _explain_unpriced(source, steps, fits, where, region, need)
        fits = priced
    return sorted(fits, key=lambda o: compute_sort_key(o, need.use_spot))


def _find_default(source: OfferSource, need: Need, default_region: str | None) -> list[InstanceOffer]:
    """For a task that names nothing: the default type at the place asked, priced or not; where the place lacks
    it (AWS ap-southeast-4 has no m6i), the offers of SkyPilot's default shape there (8+ vCPUs, 4 GiB per vCPU,
    its CPU families), priced or not, cheapest first. Raises when the place has neither, or is unknown."""
    default = DEFAULT_INSTANCE_TYPES.get(source.cloud)
    if default is None:
        raise CatalogError("resources.instance_type", f"{source.cloud} has no default instance type; name one")
    # An unknown region or zone is the task's fault, not the default type's: raise it without the remark.
    scope = _find_place(source, need, _region_asked(need, default_region))
    if not any(o.instance_type == default for o in scope):
        shaped, _ = _apply(_plan_steps(source.cloud, replace(need, cpus=DEFAULT_VCPUS, cpus_at_least=True)), scope)
        if shaped:
            return sorted(shaped, key=lambda o: compute_sort_key(o, need.use_spot))
    try:
        return find_candidates(source, replace(need, instance_type=default), default_region)
    except CatalogError as exc:
        raise CatalogError(exc.field, f"{exc.problem} (the default instance type, since the task names no "
                                      f"instance_type, cpus, memory or accelerators)") from exc


def describe_sizing(cloud: str, need: Need) -> str:
    """Which of SkyPilot's sizing rules chose for ``need``: ``SIZED_BY_DEFAULT`` when it asks nothing,
    ``SIZED_BY_MEMORY_RATIO`` for ``cpus`` without ``memory``, ``SIZED_BY_FAMILIES`` for other CPU-only needs;
    "" when the task named the type or accelerators (their own vCPUs and memory count) or the cloud has no
    such rule."""
    if need.is_unconstrained:
        return SIZED_BY_DEFAULT if cloud in DEFAULT_INSTANCE_TYPES else ""
    if need.instance_type is not None or need.accelerator is not None or cloud not in CPU_FAMILIES:
        return ""
    return SIZED_BY_MEMORY_RATIO if need.memory_gib is None else SIZED_BY_FAMILIES


def _region_asked(need: Need, default_region: str | None) -> str | None:
    """The region to look in: the task's; else none when it names a zone (the zone decides); else the
    caller's default; None means every region."""
    if need.region is not None:
        return need.region
    return None if need.zone is not None else default_region


def _find_place(source: OfferSource, need: Need, region: str | None) -> Sequence[InstanceOffer]:
    """The offers of the region and zone asked. Raises for a region or zone the catalog does not have."""
    regions = source.regions()
    if region is not None and region not in regions:
        whose = " (the default region)" if need.region is None else ""
        raise CatalogError("resources.region", f"the {source.cloud} catalog has no region {region!r}{whose}; "
                                               f"regions: {_listing(regions)}")
    scope = source.offers(region)
    if need.zone is None:
        return scope
    in_zone = [o for o in scope if need.zone in o.zones]
    if in_zone:
        return in_zone
    homes = sorted({o.region for o in source.offers() if need.zone in o.zones})
    if homes and region is not None:
        problem = f"zone {need.zone!r} is in {homes[0]}, not in {region}"
    else:
        zones = sorted({z for o in scope for z in o.zones})
        close = difflib.get_close_matches(need.zone, zones, n=6, cutoff=0.8)
        listed = f"similar: {', '.join(sorted(close))}" if close else f"zones: {_listing(zones)}"
        problem = f"the {source.cloud} catalog has no zone {need.zone!r}; {listed}"
    raise CatalogError("resources.zone", problem)


def _plan_steps(cloud: str, need: Need) -> list[_Step]:
    """The shape constraints ``need`` asks for, in the order they are applied."""
    steps: list[_Step] = []
    asked: list[str] = []  # the constraints before the next step, in words
    among = ""  # the offers the next step looks among, in words: " of SkyPilot's CPU families"

    def add(step_field: str, keeps: Callable[[InstanceOffer], bool],
            explain: Callable[[Sequence[InstanceOffer], str, str], str], words: str | None,
            hint: Callable[[Sequence[InstanceOffer]], str] | None = None) -> None:
        steps.append(_Step(step_field, keeps, explain, among + (f" with {', '.join(asked)}" if asked else ""), hint))
        if words is not None:
            asked.append(words)

    wanted_type = need.instance_type
    if wanted_type is not None:
        name = wanted_type.casefold()
        add("resources.instance_type", lambda o: o.instance_type.casefold() == name,
            lambda reached, where, prior: f"the {cloud} catalog has no instance type {wanted_type!r}{where}",
            wanted_type, lambda reached: _similar_types(wanted_type, reached))
    accelerator = need.accelerator
    if accelerator is None:
        keeps = _has_no_gpu if wanted_type is None else _has_nothing_attached
        add("resources.accelerators", keeps,
            lambda reached, where, prior: f"every {cloud} offer{where}{prior} has accelerators; "
                                          "ask for them with resources.accelerators", None)
    else:
        count = need.wanted_accelerator_count
        add("resources.accelerators", lambda o: o.gpu is not None and is_same_accelerator(accelerator, o.gpu.name),
            lambda reached, where, prior: _explain_accelerator(cloud, accelerator, reached, where, prior), None)
        add("resources.accelerators", lambda o: o.gpu is not None and o.gpu.count == count,
            lambda reached, where, prior: _explain_count(cloud, accelerator, count, reached, where),
            f"{count}x {accelerator}")
    families = CPU_FAMILIES.get(cloud) if wanted_type is None and accelerator is None else None
    hint: Callable[[Sequence[InstanceOffer]], str] | None = None
    if families is not None:
        listed = ", ".join(families)
        add("resources.cpus" if need.cpus is not None else "resources.memory",
            lambda o: _family_of(o.instance_type) in families,
            lambda reached, where, prior: f"no {cloud} instance type{where} is of SkyPilot's CPU families "
                                          f"({listed}); name another type with resources.instance_type", None)
        among = " of SkyPilot's CPU families"
        hint = _hint_families(listed)
    if need.cpus is not None:
        add("resources.cpus", _at_least_or_equal(lambda o: o.vcpus, need.cpus, need.cpus_at_least),
            _explain_amount(cloud, "vCPUs", need.cpus, need.cpus_at_least, lambda o: o.vcpus),
            f"{need.cpus:g}{'+' if need.cpus_at_least else ''} vCPUs", hint)
    if need.memory_gib is not None:
        add("resources.memory", _at_least_or_equal(lambda o: o.memory_gib, need.memory_gib, need.memory_at_least),
            _explain_amount(cloud, "GiB memory", need.memory_gib, need.memory_at_least, lambda o: o.memory_gib),
            None, hint)
    elif families is not None:
        add("resources.memory", _has_default_memory, lambda reached, where, prior: _explain_ratio(
            cloud, reached, where, prior), None, hint)
    return steps


def _apply(steps: Sequence[_Step], offers: Sequence[InstanceOffer]
           ) -> tuple[list[InstanceOffer], tuple[_Step, Sequence[InstanceOffer]] | None]:
    """The offers every step keeps; or, when a step keeps none, that step and the offers that reached it."""
    current: Sequence[InstanceOffer] = offers
    for step in steps:
        kept = [o for o in current if step.keeps(o)]
        if not kept:
            return [], (step, current)
        current = kept
    return list(current), None


def _has_no_gpu(offer: InstanceOffer) -> bool:
    return offer.gpu is None


def _has_nothing_attached(offer: InstanceOffer) -> bool:
    return offer.accelerator_type is None


def _family_of(instance_type: str) -> str:
    """``m6i.xlarge`` -> ``m6i``; ``n2-standard-8`` -> ``n2-standard``; ``e2-micro`` -> ``e2``."""
    if "." in instance_type:
        return instance_type.split(".", 1)[0]
    return instance_type.rsplit("-", 1)[0]


def _has_default_memory(offer: InstanceOffer) -> bool:
    # 1e-3 GiB of slack: a catalog's GiB may be a rounded MiB count
    return offer.memory_gib >= DEFAULT_MEMORY_PER_VCPU * offer.vcpus - 1e-3


def _at_least_or_equal(value: Callable[[InstanceOffer], float], wanted: float,
                       at_least: bool) -> Callable[[InstanceOffer], bool]:
    if at_least:
        return lambda o: value(o) >= wanted
    return lambda o: math.isclose(value(o), wanted, abs_tol=1e-3)


def _explain_failure(source: OfferSource, steps: Sequence[_Step], need: Need, region: str | None, step: _Step,
                     problem: str, reached: Sequence[InstanceOffer]) -> CatalogError:
    """The error for constraints that leave nothing at the place asked: the place's field when they would
    fit in another zone of the region (``resources.zone``) or another region (``resources.region``), the
    failing constraint's own field when they fit nowhere."""
    if need.zone is not None:
        home = region or next((o.region for o in source.offers() if need.zone in o.zones), None)
        in_region, _ = _apply(steps, source.offers(home)) if home else ([], None)
        if in_region:
            zones = sorted({z for o in in_region for z in o.zones})
            return CatalogError("resources.zone", f"{problem}; {need.describe()} is offered in {home} "
                                                  f"zones: {_listing(zones)}")
    if region is not None or need.zone is not None:
        elsewhere, _ = _apply(steps, source.offers())
        if elsewhere:
            return CatalogError("resources.region", f"{problem}; {need.describe()} is offered in: "
                                                    f"{_describe_regions(elsewhere)}")
    return CatalogError(step.field, problem + (step.hint(reached) if step.hint else ""))


def _describe_place(region: str | None, zone: str | None, default_region: str | None) -> str:
    if zone is not None:
        return f" in zone {zone}"
    if region is None:
        return ""
    return f" in {region}" + (" (the default region)" if region == default_region else "")


def _describe_regions(offers: Sequence[InstanceOffer]) -> str:
    return _listing(sorted({o.region for o in offers}))


def _listing(values: Sequence[str], limit: int = _LISTED) -> str:
    shown = ", ".join(values[:limit])
    return f"{shown}, ... ({len(values)} in all)" if len(values) > limit else shown


def _numbers(values: Sequence[float], near: float) -> str:
    """Distinct values sorted; when there are many, the ones nearest ``near`` (what the task meant)."""
    distinct = sorted(set(values))
    if len(distinct) > _LISTED:
        distinct = sorted(sorted(distinct, key=lambda v: (abs(v - near), v))[:_LISTED])
        return ", ".join(f"{v:g}" for v in distinct) + " (the nearest of more)"
    return ", ".join(f"{v:g}" for v in distinct)


def _similar_types(wanted: str, reached: Sequence[InstanceOffer]) -> str:
    close = difflib.get_close_matches(wanted, sorted({o.instance_type for o in reached}), n=3)
    return f"; similar: {', '.join(close)}" if close else ""


def _explain_accelerator(cloud: str, accelerator: str, reached: Sequence[InstanceOffer], where: str,
                         prior: str) -> str:
    names = sorted({o.gpu.name for o in reached if o.gpu is not None}, key=str.casefold)
    there = " there" if where else ""
    offered = f"accelerators offered{there}: {_listing(names)}" if names else f"none{there} has accelerators"
    return f"no {cloud} instance type{where}{prior} has {accelerator}; {offered}"


def _explain_count(cloud: str, accelerator: str, count: int, reached: Sequence[InstanceOffer], where: str) -> str:
    counts = sorted({o.gpu.count for o in reached if o.gpu is not None and o.gpu.count > 0})
    name = reached[0].gpu.name if reached and reached[0].gpu else accelerator
    there = " there" if where else ""
    return (f"no {cloud} instance type{where} has {count}x {name}; counts of {name} offered{there}: "
            f"{', '.join(str(c) for c in counts)}")


def _explain_amount(cloud: str, unit: str, wanted: float, at_least: bool, value: Callable[[InstanceOffer], float]
                    ) -> Callable[[Sequence[InstanceOffer], str, str], str]:
    def explain(reached: Sequence[InstanceOffer], where: str, prior: str) -> str:
        values = [value(o) for o in reached]
        there = " there" if where else ""
        if at_least:
            return f"no {cloud} instance type{where}{prior} has {wanted:g}+ {unit}; the most{there} is {max(values):g}"
        return (f"no {cloud} instance type{where}{prior} has exactly {wanted:g} {unit} (write {wanted:g}+ for at "
                f"least); {unit} offered{there}: {_numbers(values, wanted)}")
    return explain


def _hint_families(listed: str) -> Callable[[Sequence[InstanceOffer]], str]:
    return lambda reached: f"; SkyPilot's CPU families are {listed}: name another type with resources.instance_type"


def _explain_ratio(cloud: str, reached: Sequence[InstanceOffer], where: str, prior: str) -> str:
    most = max((o.memory_gib / o.vcpus for o in reached if o.vcpus), default=0.0)
    there = " there" if where else ""
    return (f"no {cloud} instance type{where}{prior} has {DEFAULT_MEMORY_PER_VCPU:g} GiB memory per vCPU (SkyPilot's "
            f"fill-in when memory is not given); the most{there} is {most:.3g}; set resources.memory")


def _explain_unpriced(source: OfferSource, steps: Sequence[_Step], fits: Sequence[InstanceOffer], where: str,
                      region: str | None, need: Need) -> CatalogError:
    """Offers fit but none has a price: ``resources.region`` when some are priced in another region, else
    the last constraint's field."""
    types = sorted({o.instance_type for o in fits})
    one = len(types) == 1
    problem = (f"{_listing(types, limit=5)}{where} {'fits' if one else 'fit'} {need.describe()} but the catalog "
               f"has no price for {'it' if one else 'them'}, so none is chosen; name one with "
               f"resources.instance_type to use it anyway")
    if region is not None or need.zone is not None:
        elsewhere, _ = _apply(steps, source.offers())
        priced = [o for o in elsewhere if o.price(need.use_spot) is not None]
        if priced:
            return CatalogError("resources.region", f"{problem}; priced in: {_describe_regions(priced)}")
    return CatalogError(steps[-1].field, problem)
