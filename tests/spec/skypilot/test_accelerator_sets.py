"""SkyPilot's accelerator sets (``accelerators: {L4:8, A10g:8}``, keys without values) and SkyServe's
per-accelerator rates (``target_qps_per_replica: {"A100:1": 5}``), from YAML text to candidates, rates and the
catalog's placements; names match without regard to case. Each refusal names the field it is about."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.api import bind_submission
from skyserve_lite.errors import SpecError
from skyserve_lite.spec.inputs import with_inputs
from skyserve_lite.spec.model import CandidateOrder, LoadBalancingPolicy
from skyserve_lite.spec.parse import parse_task, read_task
from skyserve_lite.state.secrets import SecretStore


def with_accelerators(spelled: str) -> str:
    """A task whose `resources.accelerators` is ``spelled`` exactly as a user writes it (flow or block YAML)."""
    block = spelled if spelled.startswith("\n") else " " + spelled
    return f"run: python -m http.server $PORT\nservice:\n  replicas: 1\nresources:\n  accelerators:{block}\n"


# YAML as written -> (each candidate's accelerator, how they are tried, the section's own accelerator)
SETS = [
    # YAML reads `{L4:8, A10g:8}` as keys 'L4:8' and 'A10g:8' with null values: the key says it all
    pytest.param("{L4:8, A10g:8, A100:4, A100-80GB:2}", ("L4:8", "A10g:8", "A100:4", "A100-80GB:2"),
                 CandidateOrder.ANY_OF, None, id="set-with-counts"),
    pytest.param("{L4, A10g}", ("L4:1", "A10g:1"), CandidateOrder.ANY_OF, None, id="set-without-counts-is-one-each"),
    pytest.param("\n    L4:8:\n    A10g:8:", ("L4:8", "A10g:8"), CandidateOrder.ANY_OF, None, id="set-block-style"),
    pytest.param("{L4: 1, A10G: 2}", ("L4:1", "A10G:2"), CandidateOrder.ANY_OF, None, id="mapping-name-to-count"),
    pytest.param("[L4:1, A10g:1]", ("L4:1", "A10g:1"), CandidateOrder.ORDERED, None, id="list-is-ordered"),
    # one accelerator is no set: the section's own, no candidates
    pytest.param("{A100: 8}", (), CandidateOrder.ANY_OF, "A100:8", id="mapping-of-one"),
    pytest.param("{A100:8}", (), CandidateOrder.ANY_OF, "A100:8", id="set-of-one"),
    pytest.param("A100:8", (), CandidateOrder.ANY_OF, "A100:8", id="string"),
    # the same name with another count is another machine shape, not a repetition
    pytest.param("{L4:1, l4:2}", ("L4:1", "l4:2"), CandidateOrder.ANY_OF, None, id="same-name-other-count"),
]


@pytest.mark.parametrize(("spelled", "candidates", "order", "section"), SETS)
def test_an_accelerator_set_becomes_one_candidate_each(spelled: str, candidates: tuple[str, ...],
                                                       order: CandidateOrder, section: str | None) -> None:
    spec = parse_task(with_accelerators(spelled))
    assert tuple(c.accelerator.describe() for c in spec.candidates if c.accelerator is not None) == candidates
    assert len(spec.candidates) == len(candidates)
    assert spec.candidate_order is order
    assert (spec.resources.accelerator.describe() if spec.resources.accelerator else None) == section


SET_REFUSALS = [
    pytest.param('{"A100:1": 2}', "resources.accelerators.A100:1", "give the count once", id="count-given-twice"),
    pytest.param("{L4:1, l4:1}", "resources.accelerators", "l4:1 is named twice", id="duplicate-any-case"),
    pytest.param("{L4: 1, l4: 1}", "resources.accelerators", "named twice", id="duplicate-name-to-count"),
    pytest.param("[L4, l4]", "resources.accelerators", "named twice", id="duplicate-in-list"),
    pytest.param("{L4:8, L4: 8}", "resources.accelerators", "named twice", id="duplicate-across-spellings"),
    pytest.param("{}", "resources.accelerators", "names no accelerator", id="empty-set"),
    pytest.param("{L4:x}", "resources.accelerators.L4:x", "must look like NAME:COUNT", id="count-not-a-number"),
    pytest.param("{L4:0.5}", "resources.accelerators.L4:0.5", "fractional accelerators", id="fractional-count"),
    pytest.param("{L4: 0}", "resources.accelerators.L4", "at least 1", id="zero-count"),
    pytest.param("{L4:1, A100:1, L4:1}", "", "duplicate key 'L4:1'", id="yaml-duplicate-key"),
]


@pytest.mark.parametrize(("spelled", "path", "problem"), SET_REFUSALS)
def test_an_accelerator_set_is_refused_naming_the_field(spelled: str, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_task(with_accelerators(spelled))
    assert caught.value.path == path
    assert problem in caught.value.problem


# accelerators as written -> --infra -> (first placement's type, the GPUs it has): the catalog's names match
# whatever the case the task wrote
CATALOG = [
    pytest.param("A10g", "aws", ("g5.xlarge", "A10G:1"), id="A10g-on-aws"),
    pytest.param("a10g", "aws", ("g5.xlarge", "A10G:1"), id="a10g-on-aws"),
    pytest.param("A10G", "aws", ("g5.xlarge", "A10G:1"), id="A10G-on-aws"),
    pytest.param("l4", "gcp", ("g2-standard-4", "L4:1"), id="l4-on-gcp"),
    # the set: cheapest first; A100:4 and A100-80GB:2 exist on no aws type and are left out
    pytest.param("{L4:8, A10g:8, A100:4, A100-80GB:2}", "aws", ("g6.48xlarge", "L4:8"), id="set-on-aws"),
]


@pytest.mark.parametrize(("spelled", "infra", "expected"), CATALOG)
def test_accelerator_names_match_the_catalog_without_regard_to_case(
        spelled: str, infra: str, expected: tuple[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "SKY_LITE_GCP_REGION"):
        monkeypatch.delenv(name, raising=False)
    task = with_inputs(read_task(with_accelerators(spelled)), (), [], infra)
    bound, inputs = bind_submission(task, None, SecretStore(tmp_path), keep_secrets=False)
    assert inputs.infra == infra
    first = bound.spec.resolution.ondemand[0] if bound.spec.resolution else None
    assert first is not None and (first.instance_type, first.accelerator) == expected


def test_the_set_on_aws_places_the_two_aws_offers_and_says_why_the_others_are_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    task = with_inputs(read_task(with_accelerators("{L4:8, A10g:8, A100:4, A100-80GB:2}")), (), [], "aws")
    bound, _ = bind_submission(task, None, SecretStore(tmp_path), keep_secrets=False)
    resolution = bound.spec.resolution
    assert resolution is not None
    assert [(p.instance_type, p.accelerator) for p in resolution.ondemand] == [("g6.48xlarge", "L4:8"),
                                                                                ("g5.48xlarge", "A10G:8")]
    assert [line.split(": ")[0] for line in resolution.skipped] == ["A100:4", "A100-80GB:2"]


def with_rates(rates: str, accelerators: str = "{A100:1, L4:1}", policy: str = "instance_aware_least_load") -> str:
    return (f"run: python -m http.server $PORT\nresources:\n  accelerators: {accelerators}\nservice:\n"
            f"  load_balancing_policy: {policy}\n  replica_policy:\n    min_replicas: 1\n    max_replicas: 4\n"
            f"    target_qps_per_replica: {rates}\n")


# rates as written -> (each accelerator's rate as kept, the load balancer's policy string)
RATES = [
    pytest.param('{"A100:1": 5, "L4:1": 2}', (("A100", 5.0), ("L4", 2.0)),
                 "instance_aware_least_load:a100=5,l4=2", id="skyserve-keys-with-counts"),
    pytest.param("{A100: 5, L4: 2}", (("A100", 5.0), ("L4", 2.0)), "instance_aware_least_load:a100=5,l4=2",
                 id="keys-by-name"),
    pytest.param('{"a100:1": 5, l4: 2.5}', (("a100", 5.0), ("l4", 2.5)), "instance_aware_least_load:a100=5,l4=2.5",
                 id="keys-any-case"),
    # the count of a key is not matched: a replica's rate is by the accelerator it landed on
    pytest.param('{"A100:8": 5, "L4:1": 2}', (("A100", 5.0), ("L4", 2.0)), "instance_aware_least_load:a100=5,l4=2",
                 id="count-in-key-not-matched"),
]


@pytest.mark.parametrize(("rates", "kept", "lb_policy"), RATES)
def test_per_accelerator_rates_are_kept_by_name(rates: str, kept: tuple[tuple[str, float], ...],
                                                lb_policy: str) -> None:
    service = parse_task(with_rates(rates)).service
    assert service.replica_policy.qps_per_accelerator == kept
    assert service.replica_policy.target_qps_per_replica == min(rate for _, rate in kept)
    assert service.load_balancing_policy is LoadBalancingPolicy.INSTANCE_AWARE_LEAST_LOAD
    assert service.lb_policy == lb_policy


_QPS = "service.replica_policy.target_qps_per_replica"

RATE_REFUSALS = [
    # the field named is the key as the file writes it, as every other refusal of a key does
    pytest.param(with_rates('{"A100:1": 5, "H100:1": 2}'), f"{_QPS}.H100:1", "not an accelerator of resources",
                 id="rate-for-accelerator-not-in-resources"),
    pytest.param(with_rates("{A100: 5, H100: 2}"), f"{_QPS}.H100", "not an accelerator of resources",
                 id="rate-by-name-for-accelerator-not-in-resources"),
    pytest.param(with_rates("{A100: 5}", accelerators="L4"), f"{_QPS}.A100", "l4", id="rate-lists-the-named-ones"),
    pytest.param(with_rates('{"A100:1": 5, a100: 2}'), f"{_QPS}.a100", "given a rate twice",
                 id="duplicate-name-any-case"),
    pytest.param(with_rates('{"A100:1": 5, "A100:8": 2}'), f"{_QPS}.A100:8", "given a rate twice",
                 id="duplicate-name-other-count"),
    pytest.param(with_rates("{}"), _QPS, "names no accelerator", id="no-rates"),
    pytest.param(with_rates('{"A100:1": 0}'), f"{_QPS}.A100:1", "greater than 0", id="zero-rate"),
    pytest.param(with_rates('{"A100:1": fast}'), f"{_QPS}.A100:1", "must be a number", id="rate-not-a-number"),
]


@pytest.mark.parametrize(("text", "path", "problem"), RATE_REFUSALS)
def test_per_accelerator_rates_are_refused_naming_the_key(text: str, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_task(text)
    assert caught.value.path == path
    assert problem in caught.value.problem
