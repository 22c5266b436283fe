"""Accepted task YAML and the typed values it parses to."""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path

import pytest
import yaml

from skyserve_lite.errors import SpecError
from skyserve_lite.spec.model import Cloud, LoadBalancingPolicy, ReplicaPolicy
from skyserve_lite.spec.parse import is_valid_service_name, load_task_file, parse_task

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "serve").glob("*.yaml"))

MINIMAL = "run: python -m http.server $PORT\nservice: {}\n"


def task(**fields: object) -> str:
    """YAML text of a minimal task (``run`` and an empty ``service``) with ``fields`` replacing keys."""
    doc: dict[str, object] = {"run": "python -m http.server $PORT", "service": {}}
    doc.update(fields)
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.mark.parametrize(("field", "expected"), [
    pytest.param("name", None, id="name"),
    pytest.param("service.readiness_probe.path", "/", id="probe-path"),
    pytest.param("service.readiness_probe.post_data", None, id="probe-is-get"),
    pytest.param("service.readiness_probe.initial_delay_seconds", 1200, id="probe-initial-delay"),
    pytest.param("service.readiness_probe.timeout_seconds", 15.0, id="probe-timeout"),
    pytest.param("service.readiness_probe.headers", (), id="probe-headers"),
    pytest.param("service.replica_policy.min_replicas", 1, id="min-replicas"),
    pytest.param("service.replica_policy.max_replicas", 1, id="max-replicas"),
    pytest.param("service.replica_policy.target_qps_per_replica", None, id="no-autoscaling"),
    pytest.param("service.replica_policy.upscale_delay_seconds", 300, id="upscale-delay"),
    pytest.param("service.replica_policy.downscale_delay_seconds", 1200, id="downscale-delay"),
    pytest.param("service.replica_policy.base_ondemand_fallback_replicas", 0, id="base-fallback"),
    pytest.param("service.replica_policy.dynamic_ondemand_fallback", False, id="dynamic-fallback"),
    pytest.param("service.load_balancing_policy", LoadBalancingPolicy.LEAST_LOAD, id="lb-policy"),
    pytest.param("service.port", None, id="service-port"),
    pytest.param("resources.cloud", None, id="cloud-not-named"),
    pytest.param("cloud", Cloud.LOCAL, id="cloud"),
    pytest.param("resources.use_spot", False, id="use-spot"),
    pytest.param("resources.ports", (), id="resource-ports"),
    pytest.param("resources.disk_size", None, id="disk-size"),
    pytest.param("envs", (), id="envs"),
    pytest.param("file_mounts", (), id="file-mounts"),
    pytest.param("workdir", None, id="workdir"),
    pytest.param("setup", None, id="setup"),
])
def test_minimal_task_gets_skyserve_defaults(field: str, expected: object) -> None:
    assert attrgetter(field)(parse_task(MINIMAL)) == expected


@pytest.mark.parametrize(("text", "field", "expected"), [
    # readiness probe: a bare path, or a mapping
    pytest.param(task(service={"readiness_probe": "/health"}), "service.readiness_probe.path", "/health",
                 id="probe-string-path"),
    pytest.param(task(service={"readiness_probe": "/health"}),
                 "service.readiness_probe.initial_delay_seconds", 1200,
                 id="probe-string-keeps-default-delay"),
    pytest.param(task(service={"readiness_probe": {"path": "/v1/models"}}), "service.readiness_probe.path",
                 "/v1/models", id="probe-mapping-path"),
    pytest.param(task(service={"readiness_probe": {"path": "/", "initial_delay_seconds": 30}}),
                 "service.readiness_probe.initial_delay_seconds", 30, id="probe-initial-delay"),
    pytest.param(task(service={"readiness_probe": {"path": "/", "initial_delay_seconds": 0}}),
                 "service.readiness_probe.initial_delay_seconds", 0, id="probe-initial-delay-zero"),
    pytest.param(task(service={"readiness_probe": {"path": "/", "timeout_seconds": 2.5}}),
                 "service.readiness_probe.timeout_seconds", 2.5, id="probe-timeout-float"),
    pytest.param(task(service={"readiness_probe": {"path": "/", "headers": {"X-Key": "1", "Accept": "text/plain"}}}),
                 "service.readiness_probe.headers", (("Accept", "text/plain"), ("X-Key", "1")),
                 id="probe-headers-sorted"),
    # replica counts
    pytest.param(task(service={"replicas": 3}), "service.replica_policy",
                 ReplicaPolicy(min_replicas=3, max_replicas=3), id="replicas-n-is-fixed-n"),
    pytest.param(task(service={"replica_policy": {"min_replicas": 2}}), "service.replica_policy",
                 ReplicaPolicy(min_replicas=2, max_replicas=2), id="max-defaults-to-min"),
    pytest.param(task(service={"replica_policy": {
                     "min_replicas": 1, "max_replicas": 5, "target_qps_per_replica": 2.5,
                     "upscale_delay_seconds": 10, "downscale_delay_seconds": 60}}),
                 "service.replica_policy",
                 ReplicaPolicy(min_replicas=1, max_replicas=5, target_qps_per_replica=2.5,
                               upscale_delay_seconds=10, downscale_delay_seconds=60),
                 id="autoscaling-policy"),
    pytest.param(task(service={"replica_policy": {"min_replicas": 0, "max_replicas": 2,
                                                  "target_qps_per_replica": 1}}),
                 "service.replica_policy",
                 ReplicaPolicy(min_replicas=0, max_replicas=2, target_qps_per_replica=1.0),
                 id="scale-to-zero-with-target"),
    pytest.param(task(service={"replica_policy": {"min_replicas": 2, "max_replicas": 2,
                                                  "target_qps_per_replica": 3}}),
                 "service.replica_policy.is_autoscaling", True, id="equal-min-max-with-target-autoscales"),
    pytest.param(task(resources={"use_spot": True}, service={"replica_policy": {
                     "min_replicas": 1, "max_replicas": 4, "target_qps_per_replica": 1,
                     "base_ondemand_fallback_replicas": 1, "dynamic_ondemand_fallback": True}}),
                 "service.replica_policy",
                 ReplicaPolicy(min_replicas=1, max_replicas=4, target_qps_per_replica=1.0,
                               base_ondemand_fallback_replicas=1, dynamic_ondemand_fallback=True),
                 id="ondemand-fallback-with-spot"),
    # service section
    pytest.param(task(service={"ports": 8080}), "service.port", 8080, id="service-port"),
    pytest.param(task(service={"load_balancing_policy": "round_robin"}), "service.load_balancing_policy",
                 LoadBalancingPolicy.ROUND_ROBIN, id="lb-round-robin"),
    pytest.param(task(service={"load_balancing_policy": "LEAST_LOAD"}), "service.load_balancing_policy",
                 LoadBalancingPolicy.LEAST_LOAD, id="lb-policy-case-insensitive"),
    # resources
    pytest.param(task(resources={"cloud": "aws"}), "resources.cloud", Cloud.AWS, id="cloud-aws"),
    pytest.param(task(resources={"cloud": "GCP"}), "resources.cloud", Cloud.GCP, id="cloud-case-insensitive"),
    pytest.param(task(resources={"ports": 8080}), "resources.ports", (8080,), id="port-int"),
    pytest.param(task(resources={"ports": "8080"}), "resources.ports", (8080,), id="port-string"),
    pytest.param(task(resources={"ports": "8000-8002"}), "resources.ports", (8000, 8001, 8002),
                 id="port-range"),
    pytest.param(task(resources={"ports": [9000, "8000-8001"]}), "resources.ports", (8000, 8001, 9000),
                 id="port-list-with-range-sorted"),
    pytest.param(task(resources={"ports": [8081, 8080, "8080-8081"]}), "resources.ports", (8080, 8081),
                 id="port-duplicates-collapsed"),
    pytest.param(task(resources={"ports": [1, 65535]}), "resources.ports", (1, 65535), id="port-bounds"),
    pytest.param(task(resources={"disk_size": 256}), "resources.disk_size", 256, id="disk-size"),
    pytest.param(task(resources={"region": None, "zone": None}), "resources.region", None,
                 id="explicit-null-is-unset"),
    pytest.param(task(resources={"labels": {"team": "ml", "tier": 1}}), "resources.labels",
                 (("team", "ml"), ("tier", "1")), id="labels-as-strings"),
    # envs, files, name
    pytest.param(task(envs={"WORKERS": 4, "DEBUG": True, "RATIO": 0.5, "MODEL": "llama"}), "envs",
                 (("DEBUG", "true"), ("MODEL", "llama"), ("RATIO", "0.5"), ("WORKERS", "4")),
                 id="envs-scalars-become-strings"),
    pytest.param(task(envs={"QUIET": False}), "envs", (("QUIET", "false"),), id="env-false"),
    pytest.param(task(envs={"_PRIVATE": "a", "lower_case": "b", "X1": "c"}), "envs",
                 (("X1", "c"), ("_PRIVATE", "a"), ("lower_case", "b")), id="env-names-letters-digits-underscore"),
    pytest.param(task(envs={"CMD": "$(touch x) `id` 'q' \"dq\"\nline2 \\ ; | & *"}), "envs",
                 (("CMD", "$(touch x) `id` 'q' \"dq\"\nline2 \\ ; | & *"),), id="env-value-kept-verbatim"),
    pytest.param(task(file_mounts={"/data": "s3://bucket/data", "/app": "./app"}), "file_mounts",
                 (("/app", "./app"), ("/data", "s3://bucket/data")), id="file-mounts-sorted"),
    pytest.param(task(workdir="."), "workdir", ".", id="workdir"),
    pytest.param(task(setup="pip install -r requirements.txt"), "setup", "pip install -r requirements.txt",
                 id="setup"),
    pytest.param(task(name="llama-2-chat"), "name", "llama-2-chat", id="name"),
])
def test_accepted_task_parses_to(text: str, field: str, expected: object) -> None:
    assert attrgetter(field)(parse_task(text)) == expected


@pytest.mark.parametrize(("as_mapping", "as_json_text", "canonical"), [
    pytest.param({"prompt": "hi", "max_tokens": 1}, '{"max_tokens": 1, "prompt": "hi"}',
                 '{"max_tokens":1,"prompt":"hi"}', id="flat-mapping"),
    pytest.param({"b": {"y": 2, "x": 1}, "a": [1, 2]}, '{ "a" : [1, 2], "b": {"x": 1, "y": 2} }',
                 '{"a":[1,2],"b":{"x":1,"y":2}}', id="nested-with-spacing"),
    pytest.param({"messages": [{"role": "user", "content": "é"}]},
                 '{"messages": [{"content": "\\u00e9", "role": "user"}]}',
                 '{"messages":[{"content":"\\u00e9","role":"user"}]}', id="unicode-escaped"),
])
def test_post_data_mapping_and_json_string_give_one_canonical_value(
        as_mapping: dict[str, object], as_json_text: str, canonical: str) -> None:
    from_mapping = parse_task(task(service={"readiness_probe": {"path": "/", "post_data": as_mapping}}))
    from_text = parse_task(task(service={"readiness_probe": {"path": "/", "post_data": as_json_text}}))
    assert from_mapping.service.readiness_probe.post_data == canonical
    assert from_text.service.readiness_probe.post_data == canonical


KEY_ORDER_A = """\
name: svc
resources:
  cloud: aws
  region: us-east-1
  ports: [8081, 8080]
  labels: {team: ml, tier: gold}
envs:
  MODEL: llama
  WORKERS: 4
file_mounts:
  /data: s3://bucket
  /app: ./app
run: python serve.py
service:
  readiness_probe:
    path: /health
    headers: {X-A: a, X-B: b}
    post_data: {prompt: hi, n: 1}
  replicas: 2
"""

KEY_ORDER_B = """\
service:
  replicas: 2
  readiness_probe:
    post_data: '{"n": 1, "prompt": "hi"}'
    headers: {X-B: b, X-A: a}
    path: /health
run: python serve.py
file_mounts:
  /app: ./app
  /data: s3://bucket
envs:
  WORKERS: "4"
  MODEL: llama
resources:
  labels: {tier: gold, team: ml}
  ports: "8080-8081"
  region: us-east-1
  cloud: AWS
name: svc
"""


def test_key_order_and_spelling_do_not_change_the_parsed_task() -> None:
    first, second = parse_task(KEY_ORDER_A), parse_task(KEY_ORDER_B)
    assert first == second
    assert hash(first) == hash(second)


@pytest.mark.parametrize(("policy", "text"), [
    pytest.param(ReplicaPolicy(min_replicas=1, max_replicas=1), "Fixed 1 replica", id="fixed-one"),
    pytest.param(ReplicaPolicy(min_replicas=3, max_replicas=3), "Fixed 3 replicas", id="fixed-many"),
    pytest.param(ReplicaPolicy(min_replicas=1, max_replicas=3, target_qps_per_replica=2.0),
                 "Autoscaling 1-3 replicas (2 qps/replica)", id="autoscaling-whole-qps"),
    pytest.param(ReplicaPolicy(min_replicas=0, max_replicas=10, target_qps_per_replica=0.5),
                 "Autoscaling 0-10 replicas (0.5 qps/replica)", id="autoscaling-fractional-qps"),
])
def test_replica_policy_describe(policy: ReplicaPolicy, text: str) -> None:
    assert policy.describe() == text


@pytest.mark.parametrize(("name", "valid"), [
    pytest.param("svc", True, id="short"),
    pytest.param("a", True, id="one-letter"),
    pytest.param("llama-2-chat", True, id="dashes-and-digits"),
    pytest.param("a" * 63, True, id="63-chars"),
    pytest.param("a" * 64, False, id="64-chars"),
    pytest.param("", False, id="empty"),
    pytest.param("MyService", False, id="uppercase"),
    pytest.param("my_service", False, id="underscore"),
    pytest.param("my.service", False, id="dot"),
    pytest.param("1svc", False, id="leading-digit"),
    pytest.param("-svc", False, id="leading-dash"),
    pytest.param("svc-", False, id="trailing-dash"),
    pytest.param("svc\n", False, id="trailing-newline"),
])
def test_is_valid_service_name(name: str, valid: bool) -> None:
    assert is_valid_service_name(name) is valid


def test_load_task_file_on_missing_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as caught:
        load_task_file(missing)
    assert caught.value.source == str(missing)
    assert str(caught.value).startswith(f"{missing}: cannot read the file")


def test_load_task_file_keeps_text_and_source(tmp_path: Path) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text(MINIMAL, encoding="utf-8")
    submitted = load_task_file(path)
    assert (submitted.text, submitted.source, submitted.spec) == (MINIMAL, str(path), parse_task(MINIMAL))


def test_load_task_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("run: x\nservice: {replicas: 0}\n", encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_task_file(path)
    assert str(caught.value) == f"{path}: service.replicas: must be at least 1, got 0"


def test_examples_directory_has_the_minimal_example() -> None:
    assert "minimal.yaml" in [path.name for path in EXAMPLES]


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_parses(path: Path) -> None:
    assert load_task_file(path).spec.run.strip()
