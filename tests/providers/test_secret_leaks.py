"""No secret value in what others can read of a replica: every boot script a provider sends, EC2's
``DescribeInstanceAttribute`` answer (moto) and the fake Compute Engine's instance metadata, in any of the
forms a value could take on the way (as is, shell-quoted, base64, URL-safe base64).

Each test first shows that the value did reach the secret store, so it cannot pass by launching nothing."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shlex
from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from skyserve_lite.providers.aws_userdata import AWS_BOOT
from skyserve_lite.providers.boot_script import BootBatch, render_boot_script
from skyserve_lite.providers.cloud_secrets import compute_secret_name
from tests.providers import test_aws_secrets as on_aws
from tests.providers.test_aws import CONTROLLER, PROFILE, REGION

# A value with a quote and a newline: its shell-quoted form differs from the value itself.
VALUE = "hf_never-in-metadata 'quoted'\nsecond line"


def leaks(text: str) -> list[str]:
    """The forms of ``VALUE`` found in ``text``, or in the base64 text it holds (the boot script writes its
    files from base64, where a value sits at any offset)."""
    raw = VALUE.encode()
    forms = (VALUE, shlex.quote(VALUE), base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode(),
             *VALUE.splitlines())
    texts = [text]
    for token in re.findall(r"[A-Za-z0-9+/_-]{16,}={0,2}", text):
        with contextlib.suppress(ValueError):
            texts.append(base64.b64decode(token.replace("-", "+").replace("_", "/") + "==").decode(errors="replace"))
    return sorted({form for form in forms for seen in texts if form in seen})


def test_the_check_finds_a_value_in_each_form() -> None:
    assert leaks(f"export HF_TOKEN={shlex.quote(VALUE)}") != []
    assert leaks(base64.b64encode(VALUE.encode()).decode()) != []
    # How the boot script held secrets before they moved to the secret store: inside env.sh, in base64.
    env_file = f"export MODEL=x\nexport HF_TOKEN={shlex.quote(VALUE)}\n"
    assert leaks(f"(umask 077 && echo {base64.b64encode(env_file.encode()).decode()} | base64 -d > env.sh)") != []
    assert leaks("secret_env HF_TOKEN sky-lite_ctl1_svc_0123456789abcdef0123456789abcdef") == []


@pytest.mark.parametrize("run_as_root", [False, True])
def test_no_boot_script_holds_a_value_whatever_the_cloud_or_the_user(run_as_root: bool) -> None:
    pytest.importorskip("google.cloud.compute_v1")
    from skyserve_lite.providers.gcp import GCP_BOOT

    batch = BootBatch(service="svc", version=1, replica_ids=(1,), envs=(("MODEL", "x"),), setup="s", run="r",
                      port=8080, secrets=(("HF_TOKEN", compute_secret_name(CONTROLLER, "svc", on_aws.DIGEST)),),
                      run_as_root=run_as_root)
    for cloud in (AWS_BOOT, GCP_BOOT):
        script = render_boot_script(cloud, batch)
        assert "secret_env HF_TOKEN" in script and leaks(script) == []


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[boto3.Session]:
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        boto3.client("iam", region_name=REGION).create_instance_profile(InstanceProfileName=PROFILE)
        yield boto3.Session(region_name=REGION)


def test_describe_instance_attribute_and_describe_instances_show_no_value(session: boto3.Session) -> None:
    [outcome] = on_aws.provider(session).launch([on_aws.secret_request(1, value=VALUE)])
    assert outcome.instance is not None, outcome.error
    stored = boto3.client("secretsmanager", region_name=REGION).get_secret_value(
        SecretId=compute_secret_name(CONTROLLER, "svc", on_aws.DIGEST))
    assert stored["SecretBinary"] == VALUE.encode()

    ec2 = boto3.client("ec2", region_name=REGION)
    attribute = ec2.describe_instance_attribute(InstanceId=outcome.instance.instance_id, Attribute="userData")
    user_data = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert "secret_env HF_TOKEN arn:aws:secretsmanager:" in user_data
    assert leaks(user_data) == [] and leaks(attribute["UserData"]["Value"]) == []
    assert leaks(json.dumps(ec2.describe_instances(), default=str)) == []


@pytest.fixture
def gcp_fake() -> Iterator[tuple[object, str]]:
    pytest.importorskip("google.cloud.compute_v1")
    from tests.providers.gce_fake import serve_fake_compute

    with serve_fake_compute() as served:
        yield served


def test_the_fakes_instance_metadata_and_compute_requests_show_no_value(gcp_fake: tuple[object, str]) -> None:
    from tests.providers import test_gcp_secrets as on_gcp
    from tests.providers.gce_fake import FakeCompute

    compute, endpoint = gcp_fake
    assert isinstance(compute, FakeCompute)
    [outcome] = on_gcp.provider(endpoint).launch([on_gcp.secret_request(1, value=VALUE)])
    assert outcome.instance is not None, outcome.error
    assert compute.secrets[on_gcp.NAME].payloads == [VALUE.encode()]

    (instance,) = compute.instances.values()
    script = next(i["value"] for i in instance["metadata"]["items"] if i["key"] == "startup-script")
    assert f"secret_env HF_TOKEN {on_gcp.NAME}" in script
    assert leaks(json.dumps(instance)) == [] and leaks(script) == []
    # Nothing sent to Compute Engine holds it either (only Secret Manager's own calls do).
    compute_requests = [body for method, body in compute.requests if not method.startswith("secrets.")]
    assert compute_requests and all(leaks(json.dumps(body)) == [] for body in compute_requests)
