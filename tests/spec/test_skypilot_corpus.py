"""Service YAMLs in the shapes SkyServe users bring (tests/spec/skypilot/): each is accepted and resolves to
what its resources ask on the cloud it runs on, or is refused with one message naming the field and why.

Every file in the folder must have a row here, so a new scenario cannot be added without its expectation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skyserve_lite.api import bind_submission
from skyserve_lite.errors import SpecError
from skyserve_lite.plan.placement import plan_launch
from skyserve_lite.spec.inputs import with_inputs
from skyserve_lite.spec.model import Secret
from skyserve_lite.spec.parse import load_task_file
from skyserve_lite.state.secrets import SecretStore

FOLDER = Path(__file__).parent / "skypilot"

# file -> (--infra, first placement's instance type per replica) for files that are accepted
ACCEPTED = {
    "vllm_openai_secrets.yaml": ("aws", ["g6.xlarge", "g6.xlarge"]),
    "deepseek_named.yaml": ("gcp/us-central1", ["a2-ultragpu-8g"]),
    "tgi_ordered.yaml": (None, ["g2-standard-4", "g2-standard-4"]),
    "tls_https.yaml": (None, ["c6i.large"]),  # cpus 2+, memory 4+: SkyPilot's CPU families, never burstable
    "per_accelerator_qps.yaml": ("aws", ["g6.xlarge"]),
    "inline_secret.yaml": (None, ["g5.xlarge"]),
}
# file -> (field, what the message says)
REFUSED = {
    "multinode.yaml": ("num_nodes", "multi-node replicas are not supported"),
    "oci_cloud.yaml": ("resources.cloud", "cloud 'oci' is not offered by sky-lite"),
    "docker_image.yaml": ("resources.image_id", "container images are not supported"),
    "fractional_gpu.yaml": ("resources.accelerators", "fractional accelerators (T4:0.5) are not supported"),
    "spot_any_of.yaml": ("resources.any_of[0].use_spot", "dynamic_ondemand_fallback: true"),
}
VALUES = {"MAX_MODEL_LEN": "8192"}
SECRETS = {"HF_TOKEN": "hf_corpus_token", "AUTH_TOKEN": "auth-corpus-token"}
WRITTEN = "hf_written_in_the_file_1234"  # inline_secret.yaml's own value


def test_every_scenario_file_has_an_expectation() -> None:
    assert sorted(p.name for p in FOLDER.glob("*.yaml")) == sorted({**ACCEPTED, **REFUSED})


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_and_resolved(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("AWS_DEFAULT_REGION", "AWS_REGION", "SKY_LITE_GCP_REGION"):
        monkeypatch.delenv(variable, raising=False)
    infra, types = ACCEPTED[name]
    task = load_task_file(FOLDER / name)
    assert WRITTEN not in task.text  # a value written in the file is cut out when it is read
    if task.spec.service.tls is not None:  # its files are checked when captured, not here
        assert task.spec.service.tls.certfile == "~/certs/cert.pem"
    envs = tuple((k, v) for k, v in VALUES.items() if k in task.spec.unset_envs)
    secrets = [(k, Secret(v)) for k, v in SECRETS.items() if any(k == n for n, _ in task.spec.secrets)
               and k not in dict(task.inputs.secrets)]
    bound, inputs = bind_submission(with_inputs(task, envs, secrets, infra), None, SecretStore(tmp_path),
                                    keep_secrets=False)
    plan = plan_launch("svc", bound.spec)
    assert [r.placements[0].instance_type for r in plan.replicas] == types
    assert not (tmp_path / "secrets").exists()
    for value in (*SECRETS.values(), WRITTEN):
        assert value not in bound.text and value not in inputs.to_json() and value not in repr(bound)
    assert [digest != "" for _, digest in bound.spec.secrets] == [True] * len(bound.spec.secrets)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_naming_the_field(name: str) -> None:
    field, message = REFUSED[name]
    with pytest.raises(SpecError) as caught:
        load_task_file(FOLDER / name)
    assert caught.value.path == field
    assert message in caught.value.problem
