"""SkyPilot's ``infra:`` with wildcards: ``*`` for any part (``gcp/*/us-central1-a``, ``*/us-east-1``, ``*``). A
named cloud with a zone alone gets the zone's region; no cloud (``*``) is left for the submission to choose.
Refusals name the field the infra was written in."""

from __future__ import annotations

import pytest

from skyserve_lite.errors import SpecError
from skyserve_lite.spec.model import Cloud
from skyserve_lite.spec.parse import Infra, parse_infra, parse_task

# infra as written -> (cloud, region, zone), and how it is written back (``Infra.describe``, what is stored)
READ = [
    pytest.param("gcp/*/us-central1-a", Infra(Cloud.GCP, "us-central1", "us-central1-a"),
                 "gcp/us-central1/us-central1-a", id="gcp-any-region-zone"),
    pytest.param("aws/*", Infra(Cloud.AWS), "aws", id="aws-any-region"),
    pytest.param("aws/*/*", Infra(Cloud.AWS), "aws", id="aws-any-region-any-zone"),
    pytest.param("aws/*/us-east-1a", Infra(Cloud.AWS, "us-east-1", "us-east-1a"), "aws/us-east-1/us-east-1a",
                 id="aws-any-region-zone"),
    pytest.param("aws/*/us-west-2-lax-1a", Infra(Cloud.AWS, "us-west-2", "us-west-2-lax-1a"),
                 "aws/us-west-2/us-west-2-lax-1a", id="aws-local-zone"),
    pytest.param("gcp/us-central1/*", Infra(Cloud.GCP, "us-central1"), "gcp/us-central1", id="gcp-region-any-zone"),
    pytest.param("*", Infra(None), "*", id="any-cloud"),
    pytest.param(" * ", Infra(None), "*", id="any-cloud-spaced"),
    pytest.param("*/*/*", Infra(None), "*", id="any-of-everything"),
    pytest.param("*/us-east-1", Infra(None, "us-east-1"), "*/us-east-1", id="any-cloud-region"),
    # without a cloud the zone's region is not guessed: the zone is named alike on no two clouds
    pytest.param("*/*/us-central1-a", Infra(None, None, "us-central1-a"), "*/*/us-central1-a", id="any-cloud-zone"),
    pytest.param("AWS/us-east-1", Infra(Cloud.AWS, "us-east-1"), "aws/us-east-1", id="cloud-any-case"),
    pytest.param("local", Infra(Cloud.LOCAL), "local", id="local"),
    pytest.param("local/*", Infra(Cloud.LOCAL), "local", id="local-any-region"),
]


@pytest.mark.parametrize(("text", "infra", "described"), READ)
def test_infra_reads_wildcards(text: str, infra: Infra, described: str) -> None:
    assert parse_infra(text, "resources.infra", "svc.yaml") == infra
    assert infra.describe() == described
    assert parse_infra(described, "--infra", "svc.yaml") == infra


REFUSED = [
    pytest.param("local/x", "the local cloud has no regions or zones", id="local-region"),
    pytest.param("local/*/x", "the local cloud has no regions or zones", id="local-zone"),
    pytest.param("gcp/*/bogus", "'bogus' is not named like a zone of gcp", id="gcp-zone-not-a-zone"),
    pytest.param("aws/*/us-central1-a", "a zone of aws (like us-east-1a)", id="gcp-zone-on-aws"),
    pytest.param("gcp/us-central1/us-east1-b", "zone 'us-east1-b' is not in region 'us-central1'",
                 id="zone-of-another-region"),
    pytest.param("gcp/us-central1/a/b", "must look like CLOUD, CLOUD/REGION or CLOUD/REGION/ZONE", id="four-parts"),
    pytest.param("gcp//us-central1-a", "must look like CLOUD", id="empty-part"),
    pytest.param("oci/*", "cloud 'oci' is not offered by sky-lite", id="other-cloud"),
    pytest.param("mars", "unknown cloud 'mars'", id="unknown-cloud"),
]


@pytest.mark.parametrize(("text", "problem"), REFUSED)
def test_infra_is_refused_naming_where_it_was_written(text: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_infra(text, "resources.infra", "svc.yaml")
    assert (caught.value.path, caught.value.source) == ("resources.infra", "svc.yaml")
    assert problem in caught.value.problem


def task(resources: str) -> str:
    return f"run: python -m http.server $PORT\nservice:\n  replicas: 1\nresources:\n{resources}"


# `resources` as written -> (cloud, region, zone) of the candidates, in order
TASKS = [
    pytest.param("  infra: gcp/*/us-central1-a\n", [(Cloud.GCP, "us-central1", "us-central1-a")], id="gcp-zone"),
    pytest.param("  infra: aws/*\n", [(Cloud.AWS, None, None)], id="aws-any-region"),
    pytest.param("  infra: aws/*/us-east-1a\n", [(Cloud.AWS, "us-east-1", "us-east-1a")], id="aws-zone"),
    pytest.param("  infra: '*'\n", [(None, None, None)], id="any-cloud"),
    pytest.param("  infra: '*/us-east-1'\n", [(None, "us-east-1", None)], id="any-cloud-region"),
    pytest.param("  infra: '*/*/us-central1-a'\n", [(None, None, "us-central1-a")], id="any-cloud-zone"),
    pytest.param("  infra: gcp/*\n  zone: us-central1-b\n", [(Cloud.GCP, "us-central1", "us-central1-b")],
                 id="zone-field-beside-wildcard"),
    pytest.param("  any_of:\n    - infra: gcp/*/us-central1-a\n    - infra: gcp/*/us-east1-b\n",
                 [(Cloud.GCP, "us-central1", "us-central1-a"), (Cloud.GCP, "us-east1", "us-east1-b")],
                 id="candidates-each-their-zone"),
]


@pytest.mark.parametrize(("resources", "placements"), TASKS)
def test_a_task_with_wildcard_infra_parses_to_its_placement(
        resources: str, placements: list[tuple[Cloud | None, str | None, str | None]]) -> None:
    spec = parse_task(task(resources))
    assert [(c.cloud, c.region, c.zone) for c in spec.resource_candidates] == placements


TASK_REFUSALS = [
    pytest.param("  infra: local/x\n", "resources.infra", "the local cloud has no regions or zones", id="local-region"),
    pytest.param("  infra: gcp/*/bogus\n", "resources.infra", "'bogus' is not named like a zone of gcp",
                 id="gcp-bogus-zone"),
    pytest.param("  infra: aws/*\n  cloud: gcp\n", "resources.infra", "says cloud 'aws' but resources.cloud says 'gcp'",
                 id="contradicts-cloud"),
    pytest.param("  infra: gcp/*/us-central1-a\n  zone: us-central1-b\n", "resources.infra",
                 "says zone 'us-central1-a' but resources.zone says 'us-central1-b'", id="contradicts-zone"),
    pytest.param("  any_of:\n    - infra: gcp/*/us-central1-a\n    - infra: aws/*\n", "resources.any_of",
                 "candidates on more than one cloud", id="candidates-on-two-clouds"),
    pytest.param("  any_of:\n    - infra: gcp/*/nowhere\n", "resources.any_of[0].infra", "not named like a zone of gcp",
                 id="candidate-bogus-zone"),
    pytest.param("  infra: kubernetes/my-context\n", "resources.infra", "cloud 'kubernetes' is not offered",
                 id="kubernetes"),
]


@pytest.mark.parametrize(("resources", "path", "problem"), TASK_REFUSALS)
def test_a_task_with_bad_infra_is_refused_naming_the_field(resources: str, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_task(task(resources))
    assert caught.value.path == path
    assert problem in caught.value.problem
