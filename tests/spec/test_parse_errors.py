"""Every way a task YAML is rejected: the exact field path blamed and what the message says."""

from __future__ import annotations

import pytest
import yaml

from skyserve_lite.errors import SpecError
from skyserve_lite.spec.parse import parse_task

SOURCE = "task.yaml"

_ABSENT = object()


def task(**fields: object) -> str:
    """YAML text of a valid minimal task with ``fields`` replacing top-level keys (``_ABSENT`` drops one)."""
    doc: dict[str, object] = {"run": "python -m http.server $PORT", "service": {"replicas": 1}}
    doc.update(fields)
    return yaml.safe_dump({key: value for key, value in doc.items() if value is not _ABSENT}, sort_keys=False)


def service(**fields: object) -> str:
    return task(service=fields)


def probe(value: object) -> str:
    """A task whose probe is ``value``; a mapping gets the path SkyServe requires unless it says otherwise."""
    if isinstance(value, dict):
        value = {"path": "/", **value}
    return service(readiness_probe={k: v for k, v in value.items() if v is not _ABSENT}
                   if isinstance(value, dict) else value)


def policy(**fields: object) -> str:
    """A task with this replica policy; ``min_replicas`` (which SkyServe requires) is 1 unless given."""
    return service(replica_policy={k: v for k, v in {"min_replicas": 1, **fields}.items() if v is not _ABSENT})


def resources(**fields: object) -> str:
    return task(resources=fields)


_BAD_ENV_NAME = "not a valid environment variable name: use letters, digits and _, not starting with a digit"

CASES = [
    # --- not YAML, or not a task document ---------------------------------------------------------
    pytest.param("run: x\nservice: {replicas: 1\n", "", "invalid YAML (line 3, column 1)",
                 id="yaml-unclosed-flow-mapping"),
    pytest.param("run: x\n  service: {}\n", "", "invalid YAML (line 2, column 10)", id="yaml-bad-indent"),
    pytest.param("run: x\nservice:\n\treplicas: 1\n", "", "invalid YAML (line 3, column 1)", id="yaml-tab"),
    pytest.param("run: a\nservice: {}\nrun: b\n", "", "(line 3, column 1): duplicate key 'run'",
                 id="yaml-duplicate-top-key"),
    pytest.param("run: a\nservice:\n  replicas: 1\n  replicas: 2\n", "",
                 "(line 4, column 3): duplicate key 'replicas'", id="yaml-duplicate-nested-key"),
    pytest.param("- run: x\n- service: {}\n", "", "the document must be a mapping, got a list",
                 id="document-list"),
    pytest.param("hello\n", "", "the document must be a mapping, got a string ('hello')",
                 id="document-string"),
    pytest.param("42\n", "", "the document must be a mapping, got a number (42)", id="document-number"),
    pytest.param("", "", "the file is empty", id="empty-file"),
    pytest.param("# nothing but a comment\n\n", "", "the file is empty", id="comment-only-file"),
    pytest.param("{1: x}\n", "", "keys must be strings, got 1", id="non-string-top-key"),
    # --- unknown keys at every level --------------------------------------------------------------
    pytest.param(task(servce={}), "servce", "unknown field; expected one of: name, resources,",
                 id="unknown-top-key"),
    pytest.param(resources(acelerators="A100"), "resources.acelerators", "unknown field; expected one of: "
                 "infra, cloud, region", id="unknown-resources-key"),
    pytest.param(service(replicas=1, replica=2), "service.replica", "unknown field; expected one of: "
                 "readiness_probe", id="unknown-service-key"),
    pytest.param(probe({"path": "/", "method": "GET"}), "service.readiness_probe.method",
                 "unknown field; expected one of: path, post_data", id="unknown-probe-key"),
    pytest.param(policy(min_replicas=1, max_replica=2), "service.replica_policy.max_replica",
                 "unknown field; expected one of: min_replicas, max_replicas", id="unknown-policy-key"),
    # --- wrong types ------------------------------------------------------------------------------
    pytest.param(service(replicas="2"), "service.replicas", "must be an integer, got a string ('2')",
                 id="replicas-string"),
    pytest.param(service(replicas=True), "service.replicas", "must be an integer, got a boolean (true)",
                 id="replicas-bool"),
    pytest.param(service(replicas=1.5), "service.replicas", "must be an integer, got a number (1.5)",
                 id="replicas-float"),
    pytest.param(policy(min_replicas=True), "service.replica_policy.min_replicas",
                 "must be an integer, got a boolean (true)", id="min-replicas-bool"),
    pytest.param(resources(disk_size="100GB"), "resources.disk_size",
                 "must be an integer, got a string ('100GB')", id="disk-size-string"),
    pytest.param(probe({"initial_delay_seconds": "20m"}), "service.readiness_probe.initial_delay_seconds",
                 "must be an integer, got a string ('20m')", id="initial-delay-string"),
    pytest.param(probe({"timeout_seconds": "5s"}), "service.readiness_probe.timeout_seconds",
                 "must be a number, got a string ('5s')", id="timeout-string"),
    pytest.param(probe({"timeout_seconds": True}), "service.readiness_probe.timeout_seconds",
                 "must be a number, got a boolean (true)", id="timeout-bool"),
    pytest.param(policy(min_replicas=1, max_replicas=2, target_qps_per_replica="high"),
                 "service.replica_policy.target_qps_per_replica", "must be a number, got a string ('high')",
                 id="target-qps-string"),
    pytest.param(task(run={"cmd": "serve"}), "run", "must be a string, got a mapping", id="run-mapping"),
    pytest.param(task(run=["serve", "--port"]), "run", "must be a string, got a list", id="run-list"),
    pytest.param(task(setup=["pip install x"]), "setup", "must be a string, got a list", id="setup-list"),
    pytest.param(task(workdir=7), "workdir", "must be a string, got a number (7)", id="workdir-number"),
    pytest.param(task(name=["svc"]), "name", "must be a string, got a list", id="name-list"),
    pytest.param(resources(region=["us-east-1"]), "resources.region", "must be a string, got a list",
                 id="region-list"),
    pytest.param(resources(image_id=123), "resources.image_id", "must be a string, got a number (123)",
                 id="image-id-number"),
    pytest.param(resources(use_spot="maybe"), "resources.use_spot",
                 "must be true or false, got a string ('maybe')", id="use-spot-string"),
    pytest.param(policy(dynamic_ondemand_fallback=1), "service.replica_policy.dynamic_ondemand_fallback",
                 "must be true or false, got a number (1)", id="dynamic-fallback-number"),
    pytest.param(task(resources=["aws"]), "resources", "this field must be a mapping, got a list",
                 id="resources-list"),
    pytest.param(task(service=["replicas"]), "service", "this field must be a mapping, got a list",
                 id="service-list"),
    pytest.param(service(replica_policy=3), "service.replica_policy",
                 "this field must be a mapping, got a number (3)", id="replica-policy-number"),
    pytest.param(probe(5), "service.readiness_probe", "must be a path string or a mapping, got a number (5)",
                 id="probe-number"),
    pytest.param(probe({"headers": ["X-Key: 1"]}), "service.readiness_probe.headers",
                 "this field must be a mapping, got a list", id="probe-headers-list"),
    pytest.param(task(envs=["MODEL=a"]), "envs", "this field must be a mapping, got a list", id="envs-list"),
    pytest.param(task(envs={1: "a"}), "envs", "keys must be strings, got 1", id="envs-number-key"),
    pytest.param(task(envs={"MODEL": {"name": "a"}}), "envs.MODEL", "must be a string, got a mapping",
                 id="env-value-mapping"),
    pytest.param(task(envs={"MODEL": ["a"]}), "envs.MODEL", "must be a string, got a list",
                 id="env-value-list"),
    pytest.param(task(envs={"K$(touch /x)": "v"}), "envs.K$(touch /x)", _BAD_ENV_NAME,
                 id="env-name-command-substitution"),
    pytest.param(task(envs={"A=B": "v"}), "envs.A=B", _BAD_ENV_NAME, id="env-name-equals-sign"),
    pytest.param(task(envs={"1ST": "v"}), "envs.1ST", _BAD_ENV_NAME, id="env-name-leading-digit"),
    pytest.param(task(envs={"MY-VAR": "v"}), "envs.MY-VAR", _BAD_ENV_NAME, id="env-name-dash"),
    pytest.param(task(envs={"A B": "v"}), "envs.A B", _BAD_ENV_NAME, id="env-name-space"),
    pytest.param(task(envs={"A;B": "v"}), "envs.A;B", _BAD_ENV_NAME, id="env-name-semicolon"),
    pytest.param(task(envs={"A\nB": "v"}), "envs.A\nB", _BAD_ENV_NAME, id="env-name-newline"),
    pytest.param(task(envs={"NAÏVE": "v"}), "envs.NAÏVE", _BAD_ENV_NAME, id="env-name-non-ascii-letter"),
    pytest.param(task(envs={"": "v"}), "envs.", _BAD_ENV_NAME, id="env-name-empty"),
    pytest.param(task(envs={"OK": "v", "BAD NAME": "v"}), "envs.BAD NAME", _BAD_ENV_NAME,
                 id="env-name-bad-among-good"),
    pytest.param(task(envs={"MODEL": "a\0b"}), "envs.MODEL", "the value holds a NUL character",
                 id="env-value-nul"),
    pytest.param(resources(labels={"team": {"a": 1}}), "resources.labels.team",
                 "must be a string, got a mapping", id="label-value-mapping"),
    pytest.param(task(file_mounts={"/data": 3}), "file_mounts./data",
                 "must be a source path or URL string, got a number (3)", id="file-mount-number"),
    pytest.param(task(file_mounts={"/data": {"source": "s3://b"}}), "file_mounts./data",
                 "storage mounts (a mapping of source, store, mode or name) are not supported",
                 id="file-mount-mapping"),
    pytest.param(task(file_mounts={"/data": ""}), "file_mounts./data",
                 "must be a source path or URL string, got a string ('')", id="file-mount-empty"),
    pytest.param(task(file_mounts={"../../../../tmp/x": "./x"}), "file_mounts.../../../../tmp/x",
                 "the destination may not contain '..'", id="mount-destination-climbs-out"),
    pytest.param(task(file_mounts={"/data/../etc/passwd": "./x"}), "file_mounts./data/../etc/passwd",
                 "the destination may not contain '..'", id="mount-destination-dotdot-inside"),
    pytest.param(task(file_mounts={"~/../x": "./x"}), "file_mounts.~/../x", "may not contain '..'",
                 id="mount-destination-dotdot-after-home"),
    pytest.param(task(file_mounts={" ": "./x"}), "file_mounts. ", "the destination path is empty",
                 id="mount-destination-empty"),
    pytest.param(task(file_mounts=["/data"]), "file_mounts", "this field must be a mapping, got a list",
                 id="file-mounts-list"),
    pytest.param(service(load_balancing_policy=1), "service.load_balancing_policy",
                 "must be a string, got a number (1)", id="lb-policy-number"),
    # --- counts and durations out of range --------------------------------------------------------
    pytest.param(service(replicas=0), "service.replicas", "must be at least 1, got 0", id="replicas-zero"),
    pytest.param(service(replicas=-1), "service.replicas", "must be at least 1, got -1",
                 id="replicas-negative"),
    pytest.param(policy(min_replicas=-1), "service.replica_policy.min_replicas", "must be at least 0, got -1",
                 id="min-replicas-negative"),
    pytest.param(policy(min_replicas=0, max_replicas=0, target_qps_per_replica=1),
                 "service.replica_policy.max_replicas", "must be at least 1, got 0", id="max-replicas-zero"),
    pytest.param(resources(disk_size=0), "resources.disk_size", "must be at least 1, got 0",
                 id="disk-size-zero"),
    pytest.param(probe({"initial_delay_seconds": -1}), "service.readiness_probe.initial_delay_seconds",
                 "must be at least 0, got -1", id="initial-delay-negative"),
    pytest.param(probe({"timeout_seconds": 0}), "service.readiness_probe.timeout_seconds",
                 "must be greater than 0, got 0", id="timeout-zero"),
    pytest.param(probe({"timeout_seconds": -5}), "service.readiness_probe.timeout_seconds",
                 "must be greater than 0, got -5", id="timeout-negative"),
    pytest.param("run: x\nservice:\n  readiness_probe: {path: /, timeout_seconds: .nan}\n",
                 "service.readiness_probe.timeout_seconds", "must be a finite number, got nan",
                 id="timeout-nan"),
    pytest.param(policy(min_replicas=1, max_replicas=3, target_qps_per_replica=0),
                 "service.replica_policy.target_qps_per_replica", "must be greater than 0, got 0",
                 id="target-qps-zero"),
    pytest.param(policy(min_replicas=1, max_replicas=3, target_qps_per_replica=-2.5),
                 "service.replica_policy.target_qps_per_replica", "must be greater than 0, got -2.5",
                 id="target-qps-negative"),
    pytest.param("run: x\nservice:\n  replica_policy:\n"
                 "    {min_replicas: 1, max_replicas: 3, target_qps_per_replica: .inf}\n",
                 "service.replica_policy.target_qps_per_replica", "must be a finite number, got inf",
                 id="target-qps-infinite"),
    pytest.param(policy(upscale_delay_seconds=-1), "service.replica_policy.upscale_delay_seconds",
                 "must be at least 0, got -1", id="upscale-delay-negative"),
    pytest.param(policy(downscale_delay_seconds=-30), "service.replica_policy.downscale_delay_seconds",
                 "must be at least 0, got -30", id="downscale-delay-negative"),
    pytest.param(policy(base_ondemand_fallback_replicas=-1),
                 "service.replica_policy.base_ondemand_fallback_replicas", "must be at least 0, got -1",
                 id="base-fallback-negative"),
    # --- replica policy rules ---------------------------------------------------------------------
    pytest.param(service(replicas=2, replica_policy={"min_replicas": 2}), "service.replicas",
                 "give either `replicas` or `replica_policy`, not both", id="replicas-and-policy"),
    pytest.param(policy(min_replicas=3, max_replicas=2, target_qps_per_replica=1),
                 "service.replica_policy.max_replicas", "must be at least min_replicas (3), got 2",
                 id="max-below-min"),
    pytest.param(policy(min_replicas=1, target_qps_per_replica=2), "service.replica_policy.max_replicas",
                 "required when target_qps_per_replica is set", id="target-without-max"),
    pytest.param(policy(min_replicas=1, max_replicas=3), "service.replica_policy.target_qps_per_replica",
                 "required when min_replicas (1) and max_replicas (3) differ",
                 id="min-max-differ-without-target"),
    pytest.param(policy(min_replicas=0), "service.replica_policy.min_replicas",
                 "0 needs target_qps_per_replica", id="min-zero-without-target"),
    pytest.param(policy(min_replicas=0, max_replicas=2), "service.replica_policy.min_replicas",
                 "0 needs target_qps_per_replica", id="min-zero-with-max-without-target"),
    pytest.param(policy(base_ondemand_fallback_replicas=1),
                 "service.replica_policy.base_ondemand_fallback_replicas",
                 "on-demand fallback needs resources.use_spot: true", id="base-fallback-without-spot"),
    pytest.param(task(resources={"use_spot": False}, service={"replica_policy": {
                     "min_replicas": 1, "max_replicas": 3, "target_qps_per_replica": 1,
                     "dynamic_ondemand_fallback": True}}),
                 "service.replica_policy.dynamic_ondemand_fallback",
                 "on-demand fallback needs resources.use_spot: true", id="dynamic-fallback-without-spot"),
    # --- readiness probe --------------------------------------------------------------------------
    pytest.param(probe("health"), "service.readiness_probe",
                 "the probe path must start with '/', got 'health'", id="probe-string-without-slash"),
    pytest.param(probe({"path": "health"}), "service.readiness_probe.path",
                 "the probe path must start with '/', got 'health'", id="probe-mapping-path-without-slash"),
    pytest.param(probe({"path": "/", "post_data": '{"prompt": "hi"'}), "service.readiness_probe.post_data",
                 "must be valid JSON", id="post-data-truncated-json"),
    pytest.param(probe({"path": "/", "post_data": "prompt=hi"}), "service.readiness_probe.post_data",
                 "must be valid JSON", id="post-data-form-encoded"),
    pytest.param(probe({"path": "/", "post_data": "NaN"}), "service.readiness_probe.post_data",
                 "cannot be sent as JSON", id="post-data-nan"),
    pytest.param("run: x\nservice:\n  readiness_probe:\n    path: /\n    post_data: {since: 2024-01-01}\n",
                 "service.readiness_probe.post_data", "cannot be sent as JSON", id="post-data-yaml-date"),
    # --- ports ------------------------------------------------------------------------------------
    pytest.param(resources(ports=0), "resources.ports", "port must be between 1 and 65535, got 0",
                 id="resources-port-zero"),
    pytest.param(resources(ports=65536), "resources.ports", "port must be between 1 and 65535, got 65536",
                 id="resources-port-too-high"),
    pytest.param(resources(ports=[8080, 70000]), "resources.ports[1]",
                 "port must be between 1 and 65535, got 70000", id="resources-port-list-item"),
    pytest.param(resources(ports="8000-70000"), "resources.ports",
                 "port must be between 1 and 65535, got 70000", id="resources-port-range-too-high"),
    pytest.param(resources(ports=["8080", "0-10"]), "resources.ports[1]",
                 "port must be between 1 and 65535, got 0", id="resources-port-range-from-zero"),
    pytest.param(resources(ports="8002-8000"), "resources.ports",
                 "port range '8002-8000' ends before it starts", id="resources-port-range-reversed"),
    pytest.param(resources(ports="8000-"), "resources.ports", "port range must look like '8000-8010', "
                 "got '8000-'", id="resources-port-range-open"),
    pytest.param(resources(ports="-1"), "resources.ports", "port range must look like '8000-8010', got '-1'",
                 id="resources-port-negative-string"),
    pytest.param(resources(ports="http"), "resources.ports", "must be a port number, got a string ('http')",
                 id="resources-port-name"),
    pytest.param(resources(ports=True), "resources.ports", "must be a port number, got a boolean (true)",
                 id="resources-port-bool"),
    pytest.param(service(ports=0), "service.ports", "port must be between 1 and 65535, got 0",
                 id="service-port-zero"),
    pytest.param(service(ports=65536), "service.ports", "port must be between 1 and 65535, got 65536",
                 id="service-port-too-high"),
    pytest.param(service(ports=[8080]), "service.ports", "must be a port number, got a list",
                 id="service-port-list"),
    # --- enums ------------------------------------------------------------------------------------
    pytest.param(service(load_balancing_policy="random"), "service.load_balancing_policy",
                 "unknown value 'random'; expected one of: round_robin, least_load", id="unknown-lb-policy"),
    pytest.param(resources(cloud="azure"), "resources.cloud",
                 "cloud 'azure' is not offered by sky-lite; it runs replicas on: local, aws, gcp",
                 id="cloud-not-offered"),
    pytest.param(resources(cloud="awz"), "resources.cloud", "unknown cloud 'awz'; expected one of: local, aws, gcp",
                 id="unknown-cloud"),
    # --- required sections -----------------------------------------------------------------------
    pytest.param(task(service=_ABSENT), "service", "missing; a service needs a `service` section",
                 id="service-missing"),
    pytest.param("run: x\nservice:\n", "service", "missing; a service needs a `service` section",
                 id="service-empty"),
    pytest.param(task(run=_ABSENT), "run", "missing; the command that starts the server", id="run-missing"),
    pytest.param(task(run=""), "run", "must not be empty", id="run-empty"),
    pytest.param(task(run="  \n"), "run", "must not be empty", id="run-blank"),
    pytest.param(task(workdir=""), "workdir", "must not be empty", id="workdir-empty"),
    # --- name -------------------------------------------------------------------------------------
    pytest.param(task(name="my service"), "name", "'my service' is not a valid task name", id="name-space"),
    pytest.param(task(name="1st"), "name", "starting with a letter", id="name-leading-digit"),
    pytest.param(task(name="svc-"), "name", "'svc-' is not a valid task name", id="name-trailing-dash"),
    pytest.param(task(name="a/b"), "name", "'a/b' is not a valid task name", id="name-slash"),
    pytest.param("name: |\n  svc\nrun: x\nservice: {}\n", "name", "'svc\\n' is not a valid task name",
                 id="name-block-scalar-with-newline"),
    pytest.param(task(name=7), "name", "must be a string, got a number (7)", id="name-number"),
]


@pytest.mark.parametrize(("text", "path", "problem"), CASES)
def test_bad_task_is_rejected_naming_the_field(text: str, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_task(text, source=SOURCE)
    err = caught.value
    assert err.path == path
    assert problem in err.problem
    assert str(err).startswith(f"{SOURCE}: ")
    assert err.exit_code == 2
