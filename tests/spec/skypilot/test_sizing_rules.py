"""SkyPilot's sizing, end to end: from the YAML a user writes, through the submission's binding (``--infra``) and
the catalog, to the ``Placement`` a plan shows, which says which rule chose (``sizing``, ``describe()``). The
catalog's own choice per need is ``tests/catalog/test_choose_sizing.py``'s; here it is the path from the text."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.api import bind_submission
from skyserve_lite.catalog.choose import SIZED_BY_DEFAULT, SIZED_BY_FAMILIES, SIZED_BY_MEMORY_RATIO
from skyserve_lite.errors import SpecError
from skyserve_lite.plan.placement import LaunchPlan, plan_launch
from skyserve_lite.spec.inputs import with_inputs
from skyserve_lite.spec.parse import read_task
from skyserve_lite.state.secrets import SecretStore


@pytest.fixture(autouse=True)
def no_default_regions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog's cheapest region, whoever runs the tests."""
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "SKY_LITE_GCP_REGION"):
        monkeypatch.delenv(name, raising=False)


def plan(resources: str, infra: str | None, home: Path) -> LaunchPlan:
    """`serve up --dry-run`'s plan of a task with ``resources`` (YAML lines, or "" for none) and ``--infra``."""
    text = "run: python -m http.server $PORT\nservice:\n  replicas: 1\n" + (f"resources:\n{resources}" if resources
                                                                              else "")
    task = with_inputs(read_task(text, "svc.yaml"), (), [], infra)
    bound, _ = bind_submission(task, None, SecretStore(home), keep_secrets=False)
    return plan_launch("svc", bound.spec)


_FAMILIES_RATIO = SIZED_BY_MEMORY_RATIO

# resources as written, --infra -> (the first placement's type, region, the rule that chose)
SIZED = [
    pytest.param("  cpus: 2+\n", "aws", ("m6i.large", "us-east-1", _FAMILIES_RATIO), id="aws-cpus-2+"),
    pytest.param("  cpus: 4+\n", "aws", ("m6i.xlarge", "us-east-1", _FAMILIES_RATIO), id="aws-cpus-4+"),
    pytest.param("  cpus: 4+\n  memory: 8+\n", "aws", ("c6i.xlarge", "us-east-1", SIZED_BY_FAMILIES),
                 id="aws-cpus-4+-memory-8+"),
    pytest.param("", "aws", ("m6i.2xlarge", "us-east-1", SIZED_BY_DEFAULT), id="aws-nothing"),
    pytest.param("", "gcp", ("n2-standard-8", "us-central1", SIZED_BY_DEFAULT), id="gcp-nothing"),
    pytest.param("  cpus: 2+\n", "gcp", ("n2-standard-2", "us-central1", _FAMILIES_RATIO), id="gcp-cpus-2+"),
    # the cloud written in the file, not on the command line
    pytest.param("  infra: aws\n  cpus: 2+\n", None, ("m6i.large", "us-east-1", _FAMILIES_RATIO), id="infra-in-file"),
    pytest.param("  cloud: aws\n  cpus: '4+'\n  memory: '8GB+'\n", None, ("c6i.xlarge", "us-east-1", SIZED_BY_FAMILIES),
                 id="cloud-in-file-memory-units"),
    pytest.param("  cpus: 2+\n", "aws/us-west-2", ("m6i.large", "us-west-2", _FAMILIES_RATIO), id="aws-region"),
    # no cloud anywhere: a region keeps the task off local, the cheapest cloud sizes it
    pytest.param("  region: us-east-1\n  cpus: 2+\n", None, ("m6i.large", "us-east-1", _FAMILIES_RATIO),
                 id="cloud-chosen-then-sized"),
    # what the task names is what it gets: no rule applies
    pytest.param("  instance_type: t3.micro\n", "aws", ("t3.micro", "us-east-1", ""), id="named-burstable-kept"),
    pytest.param("  accelerators: L4\n", "aws", ("g6.xlarge", "us-east-1", ""), id="accelerator-no-rule"),
]


@pytest.mark.parametrize(("resources", "infra", "expected"), SIZED)
def test_a_cpu_task_is_sized_as_skypilot_sizes_it(resources: str, infra: str | None, expected: tuple[str, str, str],
                                                  tmp_path: Path) -> None:
    first = plan(resources, infra, tmp_path).replicas[0].placements[0]
    assert (first.instance_type, first.region, first.sizing) == expected
    assert first.describe().startswith(f"{first.need} ({first.sizing}) -> " if first.sizing else f"{first.need} -> ")


def test_the_plan_says_which_rule_chose(tmp_path: Path) -> None:
    first = plan("  cpus: 2+\n", "aws", tmp_path).replicas[0].placements[0]
    assert first.describe() == ("cpus 2+ (memory not given: 4 GiB per vCPU, SkyPilot's CPU families) -> m6i.large "
                                "(us-east-1, $0.10/h, on-demand)")


def test_each_candidate_says_its_own_rule(tmp_path: Path) -> None:
    resources = "  any_of:\n    - cpus: 4+\n      memory: 8+\n    - cpus: 2+\n    - instance_type: m6i.large\n"
    placements = plan(resources, "aws", tmp_path).replicas[0].placements
    # cheapest first; the same type chosen by a rule and by name says so apart
    assert [(p.instance_type, p.sizing) for p in placements] == [
        ("m6i.large", _FAMILIES_RATIO), ("m6i.large", ""), ("c6i.xlarge", SIZED_BY_FAMILIES)]


_BURSTABLE = ("t2.", "t3.", "t3a.", "t4g.", "e2-micro", "e2-small", "e2-medium", "f1-", "g1-")

NEEDS = [
    pytest.param(needs, id=needs.strip().replace("\n  ", ",").replace(": ", "=") or "nothing")
    for needs in ("", "  cpus: 0.5+\n", "  cpus: 1+\n", "  cpus: 2\n", "  cpus: 2+\n", "  memory: 0.5+\n",
                  "  memory: 1+\n", "  memory: 2+\n", "  memory: 4+\n", "  cpus: 1+\n  memory: 1+\n",
                  "  cpus: 2+\n  memory: 2+\n", "  cpus: 0.5+\n  memory: 0.5+\n")
]


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
@pytest.mark.parametrize("needs", NEEDS)
def test_a_need_never_lands_on_a_burstable_or_shared_core_type(needs: str, cloud: str, tmp_path: Path) -> None:
    first = plan(needs, cloud, tmp_path).replicas[0].placements[0]
    assert first.instance_type is not None and not first.instance_type.startswith(_BURSTABLE)
    assert first.sizing in (SIZED_BY_DEFAULT, SIZED_BY_FAMILIES, _FAMILIES_RATIO)


# a need no type of SkyPilot's families meets exactly is refused naming the field, with the way out
REFUSED = [
    pytest.param("  cpus: 1\n", "aws", "resources.cpus", "write 1+ for at least", id="aws-exactly-1-cpu"),
    pytest.param("  memory: 2\n", "aws", "resources.memory", "write 2+ for at least", id="aws-exactly-2-gib"),
    pytest.param("  cpus: 4\n  memory: 4\n", "aws", "resources.memory", "with 4 vCPUs has exactly 4 GiB",
                 id="aws-4-cpus-4-gib"),
    pytest.param("  cpus: 2\n  memory: 4\n", "gcp", "resources.memory", "write 4+ for at least", id="gcp-2-cpus-4-gib"),
]


@pytest.mark.parametrize(("resources", "infra", "path", "problem"), REFUSED)
def test_a_need_no_family_meets_is_refused_naming_the_field(resources: str, infra: str, path: str, problem: str,
                                                            tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        plan(resources, infra, tmp_path)
    assert caught.value.path == path
    assert problem in caught.value.problem
