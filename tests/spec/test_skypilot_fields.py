"""SkyPilot's own task fields: resources by need, `infra`, candidates, secrets, the service extras.

Each table row is one YAML fragment and what it parses to (or the field and message it is refused with).
"""

from __future__ import annotations

from operator import attrgetter

import pytest
import yaml

from skyserve_lite.errors import SpecError
from skyserve_lite.spec.config import find_config_changes
from skyserve_lite.spec.model import (
    Accelerator,
    Amount,
    CandidateOrder,
    Cloud,
    DiskTier,
    Resources,
    TlsFiles,
)
from skyserve_lite.spec.parse import parse_infra, parse_task, read_task, to_service_name


def task(**fields: object) -> str:
    doc: dict[str, object] = {"run": "python -m http.server $PORT", "service": {"replicas": 1}}
    doc.update(fields)
    return yaml.safe_dump(doc, sort_keys=False)


def resources(**fields: object) -> str:
    return task(resources=fields)


def policy(**fields: object) -> str:
    return task(service={"replica_policy": fields})


VALID = [
    # --- resources by need ---------------------------------------------------------------------------
    pytest.param(resources(cpus=4), "resources.cpus", Amount(4.0), id="cpus-int"),
    pytest.param(resources(cpus="4+"), "resources.cpus", Amount(4.0, at_least=True), id="cpus-at-least"),
    pytest.param(resources(cpus="0.5"), "resources.cpus", Amount(0.5), id="cpus-fraction"),
    pytest.param(resources(memory=16), "resources.memory", Amount(16.0), id="memory-int"),
    pytest.param(resources(memory="32+"), "resources.memory", Amount(32.0, at_least=True), id="memory-at-least"),
    pytest.param(resources(memory="8GB"), "resources.memory", Amount(8.0), id="memory-gb"),
    pytest.param(resources(memory="1TB+"), "resources.memory", Amount(1024.0, at_least=True), id="memory-tb"),
    pytest.param(resources(memory="512MB"), "resources.memory", Amount(0.5), id="memory-mb"),
    pytest.param(resources(accelerators="A100:8"), "resources.accelerator", Accelerator("A100", 8),
                 id="accelerator-count"),
    pytest.param(resources(accelerators="L4"), "resources.accelerator", Accelerator("L4", 1),
                 id="accelerator-alone-is-one"),
    pytest.param(resources(accelerators={"H100": 8}), "resources.accelerator", Accelerator("H100", 8),
                 id="accelerator-mapping-of-one"),
    pytest.param(resources(accelerators="A100-80GB:2.0"), "resources.accelerator",
                 Accelerator("A100-80GB", 2), id="accelerator-whole-float"),
    pytest.param(resources(disk_tier="best"), "resources.disk_tier", DiskTier.BEST, id="disk-tier"),
    pytest.param(resources(disk_tier="HIGH"), "resources.disk_tier", DiskTier.HIGH, id="disk-tier-case"),
    pytest.param(resources(accelerators="A100:1"), "candidates", (), id="one-accelerator-no-candidates"),
    # --- infra -------------------------------------------------------------------------------------
    pytest.param(resources(infra="aws"), "resources.cloud", Cloud.AWS, id="infra-cloud"),
    pytest.param(resources(infra="aws/us-east-1"), "resources.region", "us-east-1", id="infra-region"),
    pytest.param(resources(infra="gcp/us-central1/us-central1-a"), "resources.zone", "us-central1-a",
                 id="infra-zone"),
    pytest.param(resources(infra="AWS/us-east-1", cloud="aws", region="us-east-1"), "resources.cloud",
                 Cloud.AWS, id="infra-agrees-with-cloud"),
    pytest.param(resources(infra="gcp"), "cloud", Cloud.GCP, id="infra-sets-task-cloud"),
    # --- candidates --------------------------------------------------------------------------------
    pytest.param(resources(accelerators={"L4": 1, "A10G": 1}), "candidates",
                 (Resources(accelerator=Accelerator("L4", 1)), Resources(accelerator=Accelerator("A10G", 1))),
                 id="accelerators-mapping-is-any-of"),
    pytest.param(resources(accelerators={"L4": 1, "A10G": 1}), "candidate_order", CandidateOrder.ANY_OF,
                 id="accelerators-mapping-order"),
    pytest.param(resources(accelerators=["A100:8", "H100:8"]), "candidate_order", CandidateOrder.ORDERED,
                 id="accelerators-list-is-ordered"),
    pytest.param(resources(accelerators=["A100:8", "H100:8"]), "resources.accelerator", None,
                 id="accelerators-list-section-has-none"),
    pytest.param(resources(cpus="4+", any_of=[{"accelerators": "A100:1"}, {"accelerators": "L4:1"}]),
                 "candidates", (Resources(cpus=Amount(4, True), accelerator=Accelerator("A100", 1)),
                                Resources(cpus=Amount(4, True), accelerator=Accelerator("L4", 1))),
                 id="any-of-over-the-section"),
    pytest.param(resources(infra="aws", use_spot=True, ordered=[{"region": "us-east-1"}, {"region": "us-west-2"}]),
                 "candidates", (Resources(cloud=Cloud.AWS, region="us-east-1", use_spot=True),
                                Resources(cloud=Cloud.AWS, region="us-west-2", use_spot=True)),
                 id="ordered-regions-keep-cloud-and-spot"),
    pytest.param(resources(region="us-east-1", any_of=[{"infra": "aws/us-west-2"}, {"infra": "aws"}]),
                 "candidates", (Resources(cloud=Cloud.AWS, region="us-west-2"), Resources(cloud=Cloud.AWS)),
                 id="candidate-infra-replaces-section-placement"),
    pytest.param(resources(any_of=[{"infra": "gcp", "accelerators": "L4:1"}, {"accelerators": "A100:1"}]),
                 "cloud", Cloud.GCP, id="one-candidate-names-the-cloud"),
    pytest.param(resources(any_of=[{"accelerators": {"L4": 1, "T4": 1}}, {"cpus": 8}]), "candidates",
                 (Resources(accelerator=Accelerator("L4", 1)), Resources(accelerator=Accelerator("T4", 1)),
                  Resources(cpus=Amount(8))), id="candidate-with-several-accelerators-expands"),
    # --- envs and secrets ------------------------------------------------------------------------
    pytest.param(task(envs={"MODEL": None, "A": "x"}), "envs", (("A", "x"),), id="env-null-not-in-envs"),
    pytest.param(task(envs={"MODEL": None, "A": "x"}), "unset_envs", ("MODEL",), id="env-null-is-unset"),
    pytest.param(task(secrets={"HF_TOKEN": None}), "secrets", (("HF_TOKEN", ""),), id="secret-null"),
    # --- the rest ------------------------------------------------------------------------------------
    pytest.param(task(num_nodes=1), "name", None, id="num-nodes-one"),
    pytest.param(task(name="deepseek-r1-A100"), "name", "deepseek-r1-A100", id="task-name-capitals"),
    pytest.param(task(name="llama_3.1"), "name", "llama_3.1", id="task-name-underscore-dot"),
    pytest.param(task(service={"replicas": 1, "tls": {"keyfile": "k.pem", "certfile": "c.pem"}}), "service.tls",
                 TlsFiles("k.pem", "c.pem"), id="tls"),
    pytest.param(policy(min_replicas=1, max_replicas=3, target_qps_per_replica=2, num_overprovision=1),
                 "service.replica_policy.num_overprovision", 1, id="num-overprovision"),
    pytest.param(task(resources={"accelerators": {"A100": 1, "L4": 1}},
                      service={"load_balancing_policy": "instance_aware_least_load", "replica_policy": {
                          "min_replicas": 1, "max_replicas": 4, "target_qps_per_replica": {"A100": 5, "L4": 2}}}),
                 "service.replica_policy.qps_per_accelerator", (("A100", 5.0), ("L4", 2.0)),
                 id="qps-per-accelerator"),
    pytest.param(task(resources={"accelerators": {"A100": 1, "L4": 1}},
                      service={"load_balancing_policy": "instance_aware_least_load", "replica_policy": {
                          "min_replicas": 1, "max_replicas": 4, "target_qps_per_replica": {"A100": 5, "L4": 2}}}),
                 "service.replica_policy.target_qps_per_replica", 2.0, id="qps-per-accelerator-smallest-counts"),
]


@pytest.mark.parametrize(("text", "field", "expected"), VALID)
def test_skypilot_field_parses_to(text: str, field: str, expected: object) -> None:
    assert attrgetter(field)(parse_task(text)) == expected


def test_candidates_keep_shared_fields_and_order_as_written() -> None:
    spec = parse_task(resources(ports=8000, labels={"team": "ml"}, disk_size=100,
                                accelerators={"L4": 1, "A10G": 1, "A100": 1}))
    assert [c.accelerator for c in spec.candidates] == [Accelerator("L4", 1), Accelerator("A10G", 1),
                                                         Accelerator("A100", 1)]
    assert {(c.ports, c.labels, c.disk_size) for c in spec.candidates} == {((8000,), (("team", "ml"),), 100)}
    assert spec.resource_candidates == spec.candidates


ERRORS = [
    pytest.param(resources(cpus="four"), "resources.cpus", "must look like '4' or '4+', got 'four'", id="cpus-word"),
    pytest.param(resources(cpus="4GB"), "resources.cpus", "must look like '4' or '4+'", id="cpus-with-unit"),
    pytest.param(resources(cpus=0), "resources.cpus", "must be greater than 0, got 0", id="cpus-zero"),
    pytest.param(resources(cpus=True), "resources.cpus", "must be a number", id="cpus-bool"),
    pytest.param(resources(memory="16XB"), "resources.memory", "must look like '16', '32+', '8GB' or '1TB+'",
                 id="memory-unit"),
    pytest.param(resources(memory="+"), "resources.memory", "must look like", id="memory-plus-only"),
    pytest.param(resources(accelerators="A100:x"), "resources.accelerators",
                 "must look like NAME:COUNT (A100:8), got 'A100:x'", id="accelerator-count-word"),
    pytest.param(resources(accelerators="T4:0.5"), "resources.accelerators",
                 "fractional accelerators (T4:0.5) are not supported", id="accelerator-fraction"),
    pytest.param(resources(accelerators="A100:0"), "resources.accelerators", "at least 1", id="accelerator-zero"),
    pytest.param(resources(accelerators={"A100": "many"}), "resources.accelerators.A100", "whole number",
                 id="accelerator-mapping-count"),
    pytest.param(resources(accelerators=[]), "resources.accelerators", "names no accelerator",
                 id="accelerator-empty-list"),
    pytest.param(resources(accelerators="$(x):1"), "resources.accelerators", "is not an accelerator name",
                 id="accelerator-shell"),
    pytest.param(resources(accelerators=8), "resources.accelerators", "must be NAME:COUNT", id="accelerator-number"),
    pytest.param(resources(disk_tier="fast"), "resources.disk_tier",
                 "unknown value 'fast'; expected one of: low, medium, high, ultra, best", id="disk-tier"),
    pytest.param(resources(infra="oci"), "resources.infra", "cloud 'oci' is not offered by sky-lite",
                 id="infra-cloud-not-offered"),
    pytest.param(resources(infra="aws/us-east-1/us-west-2a"), "resources.infra",
                 "zone 'us-west-2a' is not in region 'us-east-1'", id="infra-zone-elsewhere"),
    pytest.param(resources(infra="aws/"), "resources.infra", "must look like CLOUD, CLOUD/REGION",
                 id="infra-empty-part"),
    pytest.param(resources(infra="a/b/c/d"), "resources.infra", "must look like", id="infra-too-many-parts"),
    pytest.param(resources(infra="local/x"), "resources.infra", "the local cloud has no regions",
                 id="infra-local-region"),
    pytest.param(resources(infra="aws", cloud="gcp"), "resources.infra",
                 "says cloud 'aws' but resources.cloud says 'gcp'", id="infra-disagrees-cloud"),
    pytest.param(resources(infra="aws/us-east-1", region="us-west-2"), "resources.infra",
                 "says region 'us-east-1' but resources.region says 'us-west-2'", id="infra-disagrees-region"),
    pytest.param(resources(any_of=[{"infra": "aws"}, {"infra": "gcp"}]), "resources.any_of",
                 "candidates on more than one cloud (aws, gcp)", id="any-of-two-clouds"),
    pytest.param(resources(cloud="aws", ordered=[{"region": "us-east-1"}, {"cloud": "gcp"}]), "resources.ordered",
                 "candidates on more than one cloud", id="ordered-other-cloud-than-section"),
    pytest.param(resources(any_of=[{"use_spot": True}]), "resources.any_of[0].use_spot",
                 "candidates may not differ in use_spot: for spot with on-demand fallback", id="candidate-spot"),
    pytest.param(resources(any_of=[{"ports": 80}]), "resources.any_of[0].ports",
                 "unknown field; expected one of: infra, cloud", id="candidate-may-not-set-ports"),
    pytest.param(resources(any_of=[]), "resources.any_of", "must be a non-empty list", id="any-of-empty"),
    pytest.param(resources(any_of={"cpus": 4}), "resources.any_of", "must be a non-empty list", id="any-of-mapping"),
    pytest.param(resources(any_of=[{"cpus": 4}], ordered=[{"cpus": 8}]), "resources.ordered",
                 "give either any_of or ordered, not both", id="any-of-and-ordered"),
    pytest.param(resources(image_id="docker:vllm/vllm-openai:latest"), "resources.image_id",
                 "container images are not supported", id="image-docker"),
    pytest.param(resources(image_id={"us-east-1": "ami-1"}), "resources.image_id",
                 "a mapping of region to image is not supported", id="image-per-region"),
    pytest.param(task(num_nodes=2), "num_nodes", "2 nodes per replica: multi-node replicas are not supported",
                 id="num-nodes-two"),
    pytest.param(task(num_nodes=0), "num_nodes", "must be at least 1", id="num-nodes-zero"),
    pytest.param(task(secrets={"A-B": None}), "secrets.A-B", "not a valid environment variable name",
                 id="secret-name"),
    pytest.param(task(envs={"HF_TOKEN": "x"}, secrets={"HF_TOKEN": None}), "secrets.HF_TOKEN",
                 "also given in envs", id="secret-also-env"),
    pytest.param(task(service={"replicas": 1, "tls": {"keyfile": "k.pem"}}), "service.tls.certfile",
                 "missing; service.tls needs both keyfile and certfile", id="tls-no-cert"),
    pytest.param(task(service={"replicas": 1, "tls": {"keyfile": "k", "certfile": "c", "ca": "x"}}),
                 "service.tls.ca", "unknown field; expected one of: keyfile, certfile", id="tls-unknown"),
    pytest.param(policy(min_replicas=1, max_replicas=2, target_qps_per_replica=1, num_overprovision=-1),
                 "service.replica_policy.num_overprovision", "must be at least 0", id="overprovision-negative"),
    pytest.param(task(resources={"accelerators": "A100:1"}, service={"replica_policy": {
                     "min_replicas": 1, "max_replicas": 2, "target_qps_per_replica": {"A100": 1, "H100": 2}}}),
                 "service.replica_policy.target_qps_per_replica.H100",
                 "not an accelerator of resources.accelerators (or any_of/ordered): a100",
                 id="qps-unknown-accelerator"),
    pytest.param(task(service={"replica_policy": {"min_replicas": 1, "max_replicas": 2,
                                                  "target_qps_per_replica": {"A100": 0}}}),
                 "service.replica_policy.target_qps_per_replica.A100", "must be greater than 0", id="qps-zero"),
]


@pytest.mark.parametrize(("text", "path", "problem"), ERRORS)
def test_skypilot_field_is_refused_naming_it(text: str, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_task(text, source="task.yaml")
    assert caught.value.path == path
    assert problem in caught.value.problem


@pytest.mark.parametrize(("text", "expected"), [
    ("deepseek-r1-A100", "deepseek-r1-a100"),
    ("llama_3.1_70B", "llama-3-1-70b"),
    ("My__Svc--", "my-svc"),
    ("x" * 70, "x" * 63),
    ("a" * 62 + "_b", "a" * 62),  # cut at 63 would end in '-': the '-' goes too
])
def test_service_name_is_derived_from_a_task_name(text: str, expected: str) -> None:
    assert to_service_name(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("aws", (Cloud.AWS, None, None)),
    ("gcp/us-central1", (Cloud.GCP, "us-central1", None)),
    ("aws/us-east-1/us-east-1b", (Cloud.AWS, "us-east-1", "us-east-1b")),
    ("local", (Cloud.LOCAL, None, None)),
])
def test_infra_reads_cloud_region_zone(text: str, expected: tuple[object, ...]) -> None:
    infra = parse_infra(text, "--infra", "the command line")
    assert (infra.cloud, infra.region, infra.zone) == expected
    assert infra.describe() == text


# --- secrets written in the file -------------------------------------------------------------------------

SECRET_TASK = """\
# a comment that stays
secrets:
  HF_TOKEN: hf_abc123   # the token
  AUTH: {inline: no}
  LATER: null
run: echo hi
service: {replicas: 1}
"""


def test_secret_values_written_in_the_file_are_cut_out_of_the_stored_text() -> None:
    text = SECRET_TASK.replace("AUTH: {inline: no}", "AUTH: 'p@ss word'")
    task = read_task(text, "svc.yaml")
    assert "hf_abc123" not in task.text and "p@ss word" not in task.text
    assert "# a comment that stays" in task.text and "# the token" in task.text
    assert yaml.safe_load(task.text)["secrets"] == {"HF_TOKEN": None, "AUTH": None, "LATER": None}
    assert {name: secret.value for name, secret in task.inputs.secrets} == {"HF_TOKEN": "hf_abc123",
                                                                          "AUTH": "p@ss word"}
    assert "hf_abc123" not in repr(task) and "hf_abc123" not in str(task.inputs)
    assert task.spec.secrets == (("AUTH", ""), ("HF_TOKEN", ""), ("LATER", ""))


def test_secret_block_scalar_value_is_cut_out_whole() -> None:
    text = "secrets:\n  KEY: |\n    line one\n    line two\nrun: echo hi\nservice: {replicas: 1}\n"
    task = read_task(text, "svc.yaml")
    assert "line one" not in task.text and "line two" not in task.text
    assert yaml.safe_load(task.text) == {"secrets": {"KEY": None}, "run": "echo hi", "service": {"replicas": 1}}
    assert dict(task.inputs.secrets)["KEY"].value == "line one\nline two\n"


def test_secret_value_of_a_mapping_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        read_task(SECRET_TASK, "svc.yaml")
    assert caught.value.path == "secrets.AUTH" and "must be a string, got a mapping" in caught.value.problem


@pytest.mark.parametrize("text", [
    pytest.param("envs: {X: &v tok}\nsecrets: {A: *v}\n", id="secret-is-an-alias"),
    pytest.param("secrets: {A: &v tok}\nenvs: {X: *v}\n", id="secret-is-anchored-and-used-elsewhere"),
    pytest.param("secrets: {A: &v tok, B: *v}\n", id="two-secrets-share-an-anchor"),
])
def test_a_secret_with_an_anchor_or_alias_is_refused(text: str) -> None:
    with pytest.raises(SpecError) as caught:
        read_task(text + "run: echo hi\nservice: {replicas: 1}\n", "svc.yaml")
    assert caught.value.path.startswith("secrets.") and "without a YAML anchor or alias" in caught.value.problem
    assert "tok" not in str(caught.value)


@pytest.mark.parametrize(("written", "value"), [("0123", "0123"), ("0x1F", "0x1F"), ("12:30", "12:30"),
                                                 ("1_000", "1_000"), ("'007'", "007"), ("1.50", "1.50")])
def test_a_secret_is_the_text_as_written_not_the_number_yaml_reads(written: str, value: str) -> None:
    task = read_task(f"secrets:\n  PIN: {written}\nrun: echo hi\nservice: {{replicas: 1}}\n", "svc.yaml")
    assert dict(task.inputs.secrets)["PIN"].value == value
    assert written not in task.text


def test_a_file_without_inline_secrets_is_stored_byte_for_byte() -> None:
    text = "secrets: {HF_TOKEN: null}\nrun: echo hi   # keep\nservice: {replicas: 1}\n"
    assert read_task(text, "svc.yaml").text == text


# --- what an update compares ---------------------------------------------------------------------------


def test_an_update_names_the_need_that_changed() -> None:
    old, new = parse_task(resources(accelerators="A100:1", cpus="4+")), parse_task(resources(accelerators="A100:8",
                                                                                            cpus="4+"))
    assert [c.describe() for c in find_config_changes(old, new)] == ["resources.accelerators: A100:1 -> A100:8"]


def test_candidate_set_is_the_config_whichever_candidate_a_replica_took() -> None:
    text = resources(accelerators={"L4": 1, "A10G": 1})
    assert find_config_changes(parse_task(text), parse_task(text)) == ()
    changes = find_config_changes(parse_task(text), parse_task(resources(accelerators={"L4": 1})))
    assert [c.path for c in changes] == ["resources.accelerators", "resources.candidates"]


def test_a_changed_secret_is_named_without_its_digests() -> None:
    old = parse_task(task(secrets={"HF_TOKEN": None}))
    old = old.__class__(**{**old.__dict__, "secrets": (("HF_TOKEN", "d1"),)})
    new = old.__class__(**{**old.__dict__, "secrets": (("HF_TOKEN", "d2"),)})
    [change] = find_config_changes(old, new)
    assert change.describe() == "secrets.HF_TOKEN: changed"
    added = old.__class__(**{**old.__dict__, "secrets": (("HF_TOKEN", "d1"), ("X", "d3"))})
    assert [c.describe() for c in find_config_changes(old, added)] == ["secrets.X: added"]


@pytest.mark.parametrize("prefix", [
    pytest.param("\ufeff", id="byte-order-mark"),  # written by Windows editors; libyaml's marks skip it
    pytest.param("# résumé ünïcode 🚀\n", id="non-ascii-before-the-secrets"),
    pytest.param("", id="plain"),
])
def test_secret_values_are_cut_exactly_whatever_comes_before_them(prefix: str) -> None:
    text = prefix + "secrets:\n  API_KEY:  hunter2-secret\n  PIN:  0123\nrun: echo hi\nservice: {replicas: 1}\n"
    task = read_task(text, "svc.yaml")
    assert "hunter2" not in task.text and "0123" not in task.text
    assert yaml.safe_load(task.text)["secrets"] == {"API_KEY": None, "PIN": None}
    assert {name: secret.value for name, secret in task.inputs.secrets} == {"API_KEY": "hunter2-secret",
                                                                          "PIN": "0123"}
