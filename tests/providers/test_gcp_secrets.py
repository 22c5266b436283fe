"""A task's secrets on GCP, against the fake Compute Engine and Secret Manager on 127.0.0.1: each value in
Secret Manager, readable by the replicas' service account alone, the startup script naming it; deleted with
the service."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("google.cloud.compute_v1")

from skyserve_lite.clock import FakeClock
from skyserve_lite.providers.base import LaunchRequest
from skyserve_lite.providers.cloud_secrets import compute_secret_name
from skyserve_lite.providers.gcp import (
    CLOUD_PLATFORM_SCOPE,
    LABEL_CONTROLLER,
    LABEL_SERVICE,
    SERVICE_ACCOUNT_SETTING,
    STORAGE_READ_SCOPE,
    GcpProvider,
)
from skyserve_lite.spec.model import Secret
from tests.providers.gce_fake import FakeCompute, serve_fake_compute, write_service_account_key
from tests.providers.test_gcp import NO_BLOBS, anonymous, spec

CONTROLLER = "c0ffee123456"
ACCOUNT = "replicas@p.iam.gserviceaccount.com"
VALUE = "hf_secret-value-that-never-leaves-secret-manager"
DIGEST = "0123456789abcdef0123456789abcdef"
NAME = compute_secret_name(CONTROLLER, "web", DIGEST)


@pytest.fixture
def fake() -> Iterator[tuple[FakeCompute, str]]:
    with serve_fake_compute() as served:
        yield served


def provider(endpoint: str, account: str | None = ACCOUNT) -> GcpProvider:
    return GcpProvider(CONTROLLER, FakeClock(), blobs=NO_BLOBS, project="p", credentials=anonymous(),
                       api_endpoint=endpoint, sleep=lambda _s: None, service_account=account)


def secret_request(replica_id: int = 1, *, service: str = "web", value: str = VALUE, digest: str = DIGEST,
                   token: str = "a" * 32) -> LaunchRequest:
    task = dataclasses.replace(spec().spec, secrets=(("HF_TOKEN", digest),))
    return LaunchRequest(service=service, replica_id=replica_id, version=1, spec=task, launch_token=token,
                         is_spot=False, secrets=(("HF_TOKEN", Secret(value)),))


def instance_of(compute: FakeCompute, replica_id: int) -> dict[str, object]:
    return next(i for (_, name), i in compute.instances.items() if name.endswith(f"-r{replica_id}"))


def test_the_value_goes_to_secret_manager_readable_by_the_replicas_account_alone(
        fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    [outcome] = provider(endpoint).launch([secret_request(1)])
    assert outcome.instance is not None, outcome.error

    secret = compute.secrets[NAME]
    assert secret.payloads == [VALUE.encode()]
    assert secret.labels == {LABEL_CONTROLLER: CONTROLLER, LABEL_SERVICE: "web"}
    assert secret.readers() == [f"serviceAccount:{ACCOUNT}"]
    instance = instance_of(compute, 1)
    metadata = {i["key"]: i["value"] for i in instance["metadata"]["items"]}  # type: ignore[index]
    assert f"secret_env HF_TOKEN {NAME}" in metadata["startup-script"]
    # Secret Manager takes cloud-platform only; the account, not the scope, limits what the VM may do.
    assert instance["serviceAccounts"] == [{"email": ACCOUNT, "scopes": [CLOUD_PLATFORM_SCOPE]}]
    methods = [method for method, _ in compute.requests]
    assert methods.index("secrets.setIamPolicy") < methods.index("instances.bulkInsert")


def test_a_value_is_written_once_per_controller_process(fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    gcp = provider(endpoint)
    gcp.launch([secret_request(1)])
    gcp.launch([secret_request(2, token="b" * 32)])
    assert compute.calls["secrets.create"] == 1 and compute.calls["secrets.addVersion"] == 1


def test_a_secret_an_interrupted_launch_created_without_its_value_gets_it(fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    compute.fail("secrets.addVersion", 403, "forbidden")  # the first attempt stops after creating the secret
    [failed] = provider(endpoint).launch([secret_request(1)])
    assert failed.permanent and compute.secrets[NAME].payloads == []

    [outcome] = provider(endpoint).launch([secret_request(1)])

    assert outcome.instance is not None, outcome.error
    assert compute.secrets[NAME].payloads == [VALUE.encode()]
    assert compute.calls["secrets.versions.list"] == 1  # the create said "exists": its versions were read


def test_a_restarted_controller_adds_no_second_version(fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    provider(endpoint).launch([secret_request(1)])
    provider(endpoint).launch([secret_request(2, token="b" * 32)])
    assert compute.secrets[NAME].payloads == [VALUE.encode()]


def test_secrets_without_a_service_account_are_a_permanent_error_naming_the_field(
        fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    [outcome] = provider(endpoint, account=None).launch([secret_request(1)])
    assert outcome.permanent and outcome.error is not None
    assert outcome.error.startswith("secrets: instances read their secrets from Secret Manager")
    assert SERVICE_ACCOUNT_SETTING in outcome.error
    assert compute.secrets == {} and compute.calls["instances.bulkInsert"] == 0


def test_a_task_without_secrets_keeps_the_storage_scope(fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    for account, email in ((None, "default"), (ACCOUNT, ACCOUNT)):
        compute.instances.clear()
        [outcome] = provider(endpoint, account).launch([LaunchRequest(
            service="web", replica_id=1, version=1, spec=spec().spec, launch_token="c" * 32, is_spot=False)])
        assert outcome.instance is not None
        assert instance_of(compute, 1)["serviceAccounts"] == [{"email": email, "scopes": [STORAGE_READ_SCOPE]}]
    assert compute.calls["secrets.create"] == 0


def test_release_deletes_the_services_secrets_and_no_other_services(fake: tuple[FakeCompute, str]) -> None:
    compute, endpoint = fake
    gcp = provider(endpoint)
    gcp.launch([secret_request(1), secret_request(2, digest="f" * 32, value="other", token="b" * 32)])
    gcp.launch([secret_request(3, service="web-2", token="d" * 32)])
    assert len(compute.secrets) == 3

    provider(endpoint).release_service("web")  # a restarted controller: it finds them by their labels

    assert list(compute.secrets) == [compute_secret_name(CONTROLLER, "web-2", DIGEST)]
    gcp.release_service("web")  # idempotent
    assert compute.calls["secrets.delete"] == 2


def test_the_provider_takes_the_replicas_account_from_the_environment(
        fake: tuple[FakeCompute, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A service account key whose token exchange goes to the fake: Secret Manager is called with real,
    # scoped credentials, as a controller calls it.
    compute, endpoint = fake
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(write_service_account_key(tmp_path / "key.json",
                                                                                        endpoint)))
    gcp = GcpProvider.from_env(CONTROLLER, FakeClock(), NO_BLOBS, {
        SERVICE_ACCOUNT_SETTING: ACCOUNT, "SKY_LITE_GCP_PROJECT": "p", "SKY_LITE_GCP_ENDPOINT": endpoint})

    [outcome] = gcp.launch([secret_request(1)])

    assert outcome.instance is not None, outcome.error
    assert compute.secrets[NAME].readers() == [f"serviceAccount:{ACCOUNT}"]
    assert instance_of(compute, 1)["serviceAccounts"] == [{"email": ACCOUNT, "scopes": [CLOUD_PLATFORM_SCOPE]}]
