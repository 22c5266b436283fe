"""SkyServe's `service` rules as sky-lite reads them: what SkyServe accepts and sky-lite now does too
(``spot_placer``, fractional scale delays), what SkyServe's schema refuses and sky-lite refuses alike, the one
documented difference (``load_balancing_policy: round_robin`` stays), and what sky-lite refuses on purpose, each
with one message naming the field."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import pytest
import yaml

from skyserve_lite.errors import SpecError
from skyserve_lite.spec.model import LoadBalancingPolicy, SpotPlacer, TaskSpec
from skyserve_lite.spec.parse import parse_task


def task(service: dict[str, Any] | None = None, **fields: Any) -> str:
    """A task as YAML text: ``service`` (one replica unless given) and any other top-level fields."""
    doc: dict[str, Any] = {"run": "python -m http.server $PORT", "service": service or {"replicas": 1}}
    doc.update(fields)
    return yaml.safe_dump(doc, sort_keys=False)


def autoscaling(**policy: Any) -> dict[str, Any]:
    return {"replica_policy": {"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": 2, **policy}}


_SPOT = {"use_spot": True}

# YAML -> the attribute of the parsed spec -> its value
ACCEPTED = [
    pytest.param(task({"replica_policy": {"min_replicas": 1, "spot_placer": "dynamic_fallback"}}, resources=_SPOT),
                 "service.replica_policy.spot_placer", SpotPlacer.DYNAMIC_FALLBACK, id="spot-placer"),
    pytest.param(task({"replica_policy": {"min_replicas": 1, "spot_placer": "DYNAMIC_FALLBACK"}}, resources=_SPOT),
                 "service.replica_policy.spot_placer", SpotPlacer.DYNAMIC_FALLBACK, id="spot-placer-any-case"),
    pytest.param(task(autoscaling(upscale_delay_seconds=0.5)), "service.replica_policy.upscale_delay_seconds", 0.5,
                 id="fractional-upscale-delay"),
    pytest.param(task(autoscaling(downscale_delay_seconds=2.5)), "service.replica_policy.downscale_delay_seconds",
                 2.5, id="fractional-downscale-delay"),
    pytest.param(task(autoscaling(upscale_delay_seconds=0)), "service.replica_policy.upscale_delay_seconds", 0.0,
                 id="zero-upscale-delay"),
    # SkyServe drops round_robin; sky-lite keeps it (docs: a documented difference)
    pytest.param(task({"replicas": 1, "load_balancing_policy": "ROUND_ROBIN"}), "service.load_balancing_policy",
                 LoadBalancingPolicy.ROUND_ROBIN, id="round-robin-kept"),
    pytest.param(task({"replicas": 1, "ports": 8080}), "service.port", 8080, id="service-port-number"),
    pytest.param(task({"replicas": 1, "readiness_probe": {"path": "/health", "headers": {"X-Check": "5"}}}),
                 "service.readiness_probe.headers", (("X-Check", "5"),), id="header-quoted-number"),
    pytest.param(task({"replicas": 1, "readiness_probe": "/health"}), "service.readiness_probe.path", "/health",
                 id="probe-as-path-string"),
    pytest.param(task(num_nodes=1), "service.replica_policy.min_replicas", 1, id="num-nodes-one"),
]


@pytest.mark.parametrize(("text", "attribute", "value"), ACCEPTED)
def test_skyserve_fields_are_accepted(text: str, attribute: str, value: object) -> None:
    parsed = attrgetter(attribute)(parse_task(text))
    assert parsed == value
    assert type(parsed) is type(value)


def test_fractional_delays_are_kept_as_written() -> None:
    spec = parse_task(task(autoscaling(upscale_delay_seconds=0.5, downscale_delay_seconds=2.5)))
    policy = spec.service.replica_policy
    assert (policy.upscale_delay_seconds, policy.downscale_delay_seconds) == (0.5, 2.5)


_POLICY = "service.replica_policy"
_PROBE = "service.readiness_probe"
_RATES = {"A100": 5, "L4": 2}
_GPUS = {"accelerators": {"A100": 1, "L4": 1}}

REFUSED = [
    # --- SkyServe's own rules ----------------------------------------------------------------------------
    pytest.param(task({"replica_policy": {"min_replicas": 1, "spot_placer": "dynamic_fallback"}}),
                 f"{_POLICY}.spot_placer", "a spot placer needs resources.use_spot: true", id="spot-placer-no-spot"),
    pytest.param(task({"replica_policy": {"min_replicas": 1, "spot_placer": "spread"}}, resources=_SPOT),
                 f"{_POLICY}.spot_placer", "unknown value 'spread'; expected one of: dynamic_fallback",
                 id="spot-placer-unknown"),
    pytest.param(task({"replicas": 1, "readiness_probe": {"post_data": {"a": 1}}}), f"{_PROBE}.path",
                 "a readiness_probe mapping names the path to probe", id="probe-mapping-without-path"),
    pytest.param(task({"replicas": 1, "readiness_probe": {"path": None, "initial_delay_seconds": 5}}),
                 f"{_PROBE}.path", "missing", id="probe-path-null"),
    pytest.param(task({"replicas": 1, "readiness_probe": {"path": "/", "headers": {"X": 5}}}), f"{_PROBE}.headers.X",
                 "must be a string, got a number (5): quote it", id="header-number"),
    pytest.param(task({"replicas": 1, "readiness_probe": {"path": "/", "headers": {"X": True}}}),
                 f"{_PROBE}.headers.X", "must be a string, got a boolean", id="header-boolean"),
    pytest.param(task({"replicas": 1, "readiness_probe": {"path": "/", "headers": {"X": None}}}),
                 f"{_PROBE}.headers.X", "must be a string, got nothing", id="header-null"),
    pytest.param(task({"replica_policy": {"max_replicas": 2, "target_qps_per_replica": 1}}),
                 f"{_POLICY}.min_replicas", "a replica_policy names its min_replicas", id="policy-without-min"),
    pytest.param(task({"replica_policy": {"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": _RATES}},
                      resources=_GPUS),
                 "service.load_balancing_policy", "needs load_balancing_policy: instance_aware_least_load",
                 id="rates-without-instance-aware"),
    pytest.param(task({"load_balancing_policy": "least_load",
                       "replica_policy": {"min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": _RATES}},
                      resources=_GPUS),
                 "service.load_balancing_policy", "instance_aware_least_load", id="rates-with-least-load"),
    pytest.param(task({"load_balancing_policy": "instance_aware_least_load", **autoscaling()}, resources=_GPUS),
                 f"{_POLICY}.target_qps_per_replica", "needs a rate per accelerator", id="instance-aware-one-rate"),
    pytest.param(task({"load_balancing_policy": "instance_aware_least_load", "replicas": 2}),
                 f"{_POLICY}.target_qps_per_replica", "needs a rate per accelerator", id="instance-aware-no-rates"),
    pytest.param(task({"replicas": 1, "ports": "8080"}), "service.ports", "write it without quotes",
                 id="service-ports-string"),
    pytest.param(task({"replicas": 1, "ports": "8080-8081"}), "service.ports", "must be a port number",
                 id="service-ports-range"),
    pytest.param(task({"replicas": 1, "ports": [8080]}), "service.ports", "must be a port number, got a list",
                 id="service-ports-list"),
    pytest.param(task(autoscaling(upscale_delay_seconds=-0.5)), f"{_POLICY}.upscale_delay_seconds",
                 "must be at least 0", id="negative-delay"),
    pytest.param(task(autoscaling(downscale_delay_seconds="2.5")), f"{_POLICY}.downscale_delay_seconds",
                 "must be a number", id="delay-as-string"),
    # --- refused on purpose --------------------------------------------------------------------------------
    pytest.param(task(resources={"cloud": "oci"}), "resources.cloud", "cloud 'oci' is not offered by sky-lite",
                 id="cloud-oci"),
    pytest.param(task(resources={"cloud": "azure"}), "resources.cloud", "cloud 'azure' is not offered by sky-lite",
                 id="cloud-azure"),
    pytest.param(task(resources={"infra": "lambda"}), "resources.infra", "cloud 'lambda' is not offered by sky-lite",
                 id="infra-lambda"),
    pytest.param(task(resources={"infra": "kubernetes"}), "resources.infra",
                 "cloud 'kubernetes' is not offered by sky-lite", id="infra-kubernetes"),
    pytest.param(task(resources={"any_of": [{"cloud": "azure"}]}), "resources.any_of[0].cloud",
                 "cloud 'azure' is not offered by sky-lite", id="candidate-azure"),
    pytest.param(task(num_nodes=2), "num_nodes", "multi-node replicas are not supported", id="num-nodes-2"),
    pytest.param(task(resources={"image_id": "docker:vllm/vllm-openai:latest"}), "resources.image_id",
                 "container images are not supported", id="docker-image"),
    pytest.param(task(file_mounts={"/data": {"source": "s3://bucket/data", "mode": "MOUNT"}}), "file_mounts./data",
                 "storage mounts (a mapping of source, store, mode or name) are not supported",
                 id="storage-mount-source"),
    pytest.param(task(file_mounts={"/ckpt": {"name": "ckpt", "store": "gcs", "mode": "COPY"}}), "file_mounts./ckpt",
                 "storage mounts (a mapping of source, store, mode or name) are not supported",
                 id="storage-mount-store"),
    pytest.param(task({"replicas": 1, "controller_resources": {"cpus": 2}}), "service.controller_resources",
                 "unknown field; expected one of: readiness_probe", id="unknown-service-field"),
    pytest.param(task({"replicas": 1, "https": True}), "service.https", "unknown field", id="unknown-service-https"),
    pytest.param(task({"replica_policy": {"min_replicas": 1, "autoscaling_decision_interval": 5}}),
                 f"{_POLICY}.autoscaling_decision_interval", "unknown field", id="unknown-policy-field"),
    pytest.param(task({"replicas": 1, "readiness_probe": {"path": "/", "method": "GET"}}), f"{_PROBE}.method",
                 "unknown field", id="unknown-probe-field"),
]


@pytest.mark.parametrize(("text", "path", "problem"), REFUSED)
def test_service_fields_are_refused_naming_the_field(text: str, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_task(text, "svc.yaml")
    assert caught.value.path == path
    assert problem in caught.value.problem
    assert "\n" not in str(caught.value)  # one message, one line


@pytest.mark.parametrize(("old", "new", "changed"), [
    pytest.param("", "    spot_placer: dynamic_fallback\n",
                 ("service.replica_policy.spot_placer", None, "dynamic_fallback"), id="spot-placer-added"),
    pytest.param("    upscale_delay_seconds: 30\n", "    upscale_delay_seconds: 30.5\n",
                 ("service.replica_policy.upscale_delay_seconds", 30.0, 30.5), id="fractional-delay"),
])
def test_a_service_field_change_is_a_service_change_not_a_replica_one(old: str, new: str,
                                                                       changed: tuple[str, object, object]) -> None:
    from skyserve_lite.spec.config import find_config_changes, find_service_changes

    def spec(extra: str) -> TaskSpec:
        return parse_task("resources:\n  use_spot: true\nservice:\n  replica_policy:\n    min_replicas: 1\n"
                          f"{extra}run: x\n")

    before, after = spec(old), spec(new)
    assert [(c.path, c.old, c.new) for c in find_service_changes(before, after)] == [changed]
    assert find_config_changes(before, after) == ()  # replicas are reused
