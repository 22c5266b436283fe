"""A task's secrets on AWS, against moto's in-process EC2, IAM and Secrets Manager: each value in Secrets
Manager, named by controller, service and digest, the user data naming it; deleted with the service."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from skyserve_lite.providers.aws import TAG_CONTROLLER, TAG_SERVICE, AwsProvider
from skyserve_lite.providers.base import LaunchRequest
from skyserve_lite.providers.cloud_secrets import compute_secret_name
from skyserve_lite.spec.model import Secret
from tests.providers.test_aws import CONTROLLER, NO_BLOBS, PROFILE, REGION, Api, ami, spec
from tests.providers.test_aws_userdata_envs import env_file_of

VALUE = "hf_secret-value-that-never-leaves-secrets-manager"
DIGEST = "0123456789abcdef0123456789abcdef"
OTHER_REGION = "eu-west-1"


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[boto3.Session]:
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        boto3.client("iam", region_name=REGION).create_instance_profile(InstanceProfileName=PROFILE)
        yield boto3.Session(region_name=REGION)


@pytest.fixture
def api(session: boto3.Session) -> Api:
    return Api(session)


def provider(session: boto3.Session, profile: str | None = PROFILE) -> AwsProvider:
    from skyserve_lite.clock import FakeClock

    return AwsProvider(CONTROLLER, FakeClock(), blobs=NO_BLOBS, session=session, instance_profile=profile,
                       sleep=lambda _s: None)


def secret_request(replica_id: int = 1, *, service: str = "svc", value: str = VALUE, digest: str = DIGEST,
                   region: str = REGION, token: str = "tok-1", **fields: Any) -> LaunchRequest:
    task = dataclasses.replace(spec(image_id=ami(region), region=region, zone=f"{region}a", **fields),
                               secrets=(("HF_TOKEN", digest),))
    return LaunchRequest(service=service, replica_id=replica_id, version=1, spec=task, launch_token=token,
                         is_spot=False, secrets=(("HF_TOKEN", Secret(value)),))


def user_data_of(instance_id: str, region: str = REGION) -> str:
    """The user data as anyone allowed ``ec2:DescribeInstanceAttribute`` reads it."""
    answer = boto3.client("ec2", region_name=region).describe_instance_attribute(
        InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(answer["UserData"]["Value"]).decode()


def stored_secrets(region: str = REGION) -> dict[str, dict[str, Any]]:
    client = boto3.client("secretsmanager", region_name=region)
    return {s["Name"]: s for s in client.list_secrets()["SecretList"]}


def test_the_value_goes_to_secrets_manager_and_the_user_data_names_it(session: boto3.Session, api: Api) -> None:
    [outcome] = provider(session).launch([secret_request(1)])
    assert outcome.instance is not None, outcome.error

    name = compute_secret_name(CONTROLLER, "svc", DIGEST)
    secret = stored_secrets()[name]
    value = boto3.client("secretsmanager", region_name=REGION).get_secret_value(SecretId=name)
    assert value["SecretBinary"] == VALUE.encode()
    assert {t["Key"]: t["Value"] for t in secret["Tags"]} == {TAG_CONTROLLER: CONTROLLER, TAG_SERVICE: "svc"}
    user_data = user_data_of(outcome.instance.instance_id)
    assert f"secret_env HF_TOKEN {secret['ARN']}" in user_data
    assert VALUE not in user_data and base64.b64encode(VALUE.encode()).decode() not in user_data
    # Secrets Manager is written before the instance is asked for: it may boot at once.
    operations = [c.operation for c in api.calls]
    assert operations.index("CreateSecret") < operations.index("RunInstances")


def test_a_value_is_written_once_and_a_changed_value_is_a_new_secret(session: boto3.Session, api: Api) -> None:
    aws = provider(session)
    aws.launch([secret_request(1)])
    aws.launch([secret_request(2, token="tok-2")])
    assert api.count("CreateSecret") == 1

    aws.launch([secret_request(3, token="tok-3", value="rotated", digest="f" * 32)])
    assert sorted(stored_secrets()) == sorted([compute_secret_name(CONTROLLER, "svc", DIGEST),
                                               compute_secret_name(CONTROLLER, "svc", "f" * 32)])


def test_a_restarted_controller_finds_the_secret_it_wrote(session: boto3.Session, api: Api) -> None:
    [first] = provider(session).launch([secret_request(1)])
    [again] = provider(session).launch([secret_request(2, token="tok-2")])

    assert first.instance is not None and again.instance is not None
    assert [c.operation for c in api.calls if c.service == "secretsmanager"] == [
        "CreateSecret", "CreateSecret", "DescribeSecret"]  # the second answered "exists": its ARN is looked up
    arn = stored_secrets()[compute_secret_name(CONTROLLER, "svc", DIGEST)]["ARN"]
    assert f"secret_env HF_TOKEN {arn}" in user_data_of(again.instance.instance_id)


def test_secrets_without_an_instance_profile_are_a_permanent_error_naming_the_field(session: boto3.Session,
                                                                                   api: Api) -> None:
    [outcome] = provider(session, profile=None).launch([secret_request(1)])
    assert outcome.permanent and outcome.error is not None
    assert outcome.error.startswith("secrets: instances read their secrets from Secrets Manager with their own role")
    assert "SKY_LITE_AWS_INSTANCE_PROFILE" in outcome.error
    assert api.count("CreateSecret") == 0 and api.count("RunInstances") == 0


def test_release_deletes_the_services_secrets_in_every_region_and_no_other_services(session: boto3.Session,
                                                                                   api: Api) -> None:
    aws = provider(session)
    aws.launch([secret_request(1), secret_request(2, region=OTHER_REGION, token="tok-eu")])
    aws.launch([secret_request(1, service="svc-2", token="tok-other")])
    assert len(stored_secrets()) == 2 and len(stored_secrets(OTHER_REGION)) == 1

    aws.release_service("svc")

    assert list(stored_secrets()) == [compute_secret_name(CONTROLLER, "svc-2", DIGEST)]
    assert stored_secrets(OTHER_REGION) == {}
    deletes = api.named("DeleteSecret")
    assert all(c.params["ForceDeleteWithoutRecovery"] is True for c in deletes) and len(deletes) == 2
    aws.release_service("svc")  # idempotent: nothing left, nothing deleted
    assert api.count("DeleteSecret") == 2


def test_a_restarted_controller_deletes_secrets_in_the_regions_its_inventory_names(session: boto3.Session) -> None:
    provider(session).launch([secret_request(1, region=OTHER_REGION)])
    restarted = provider(session)
    restarted.list_instances([OTHER_REGION])  # every pass lists the regions the services name

    restarted.release_service("svc")

    assert stored_secrets(OTHER_REGION) == {}


def test_the_envs_stay_in_the_user_data_and_the_workload_runs_as_sky_unless_asked(session: boto3.Session) -> None:
    aws = provider(session)
    [plain] = aws.launch([secret_request(1, envs=(("MODEL", "small"),))])
    request = secret_request(2, token="tok-2")
    rooted = dataclasses.replace(request, spec=dataclasses.replace(request.spec, resources=dataclasses.replace(
        request.spec.resources, run_as_root=True)))
    [root] = aws.launch([rooted])
    assert plain.instance is not None and root.instance is not None

    plain_data, root_data = user_data_of(plain.instance.instance_id), user_data_of(root.instance.instance_id)
    assert "runuser -u sky -- /bin/bash /opt/sky-lite/setup.sh" in plain_data
    assert "runuser" not in root_data and "useradd" not in root_data
    env = env_file_of(plain_data)
    assert "export MODEL=small" in env.splitlines() and "HF_TOKEN" not in env
