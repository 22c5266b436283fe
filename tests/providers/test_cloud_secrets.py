"""The clouds' shared handling of a task's secrets (``cloud_secrets``): names, and the keeper that writes a
launch's secrets once and deletes a service's, against a backend that records what it is asked."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from skyserve_lite.providers.base import LaunchRequest
from skyserve_lite.providers.cloud_secrets import (
    CloudSecret,
    SecretKeeper,
    compute_secret_name,
    compute_secret_prefix,
    find_cloud_secrets,
)
from skyserve_lite.spec.model import Secret, ServiceSpec, TaskSpec

DIGEST = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"
# What each store accepts as a name: AWS Secrets Manager (512 characters of these) and GCP Secret Manager
# (a secret id: 255 of these).
AWS_NAME = re.compile(r"[A-Za-z0-9/_+=.@-]{1,512}")
GCP_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")


@pytest.mark.parametrize(("controller", "service", "expected"), [
    pytest.param("c0ffee123456", "web", f"sky-lite_c0ffee123456_web_{DIGEST}", id="store-id"),
    pytest.param("ctl1", "a-b-c", f"sky-lite_ctl1_a-b-c_{DIGEST}", id="dashed-service"),
    pytest.param("c" * 64, "s" * 63, f"sky-lite_{'c' * 64}_{'s' * 63}_{DIGEST}", id="longest"),
])
def test_a_secret_is_named_by_controller_service_and_digest(controller: str, service: str, expected: str) -> None:
    name = compute_secret_name(controller, service, DIGEST)
    assert name == expected
    assert AWS_NAME.fullmatch(name) and GCP_NAME.fullmatch(name)


def test_one_services_prefix_starts_no_other_services_names() -> None:
    # "web" and "web-2" of one controller: deleting web's secrets must leave web-2's alone.
    assert not compute_secret_name("ctl1", "web-2", DIGEST).startswith(compute_secret_prefix("ctl1", "web"))
    assert compute_secret_name("ctl1", "web", DIGEST).startswith(compute_secret_prefix("ctl1"))
    assert not compute_secret_name("ctl12", "web", DIGEST).startswith(compute_secret_prefix("ctl1"))


def request(secrets: tuple[tuple[str, str], ...], digests: tuple[tuple[str, str], ...]) -> LaunchRequest:
    spec = TaskSpec(run="serve", service=ServiceSpec(), secrets=digests)
    return LaunchRequest(service="web", replica_id=1, version=3, spec=spec, launch_token="t", is_spot=False,
                         secrets=tuple((name, Secret(value)) for name, value in secrets))


def test_find_cloud_secrets_names_each_value_by_the_digest_its_version_stores() -> None:
    found = find_cloud_secrets("ctl1", request((("A", "one"), ("B", "two")), (("A", DIGEST), ("B", OTHER))))
    assert [(s.variable, s.name, s.value.value) for s in found] == [
        ("A", f"sky-lite_ctl1_web_{DIGEST}", "one"), ("B", f"sky-lite_ctl1_web_{OTHER}", "two")]


def test_a_value_whose_version_names_no_digest_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^secrets\.B: version 3 names no digest"):
        find_cloud_secrets("ctl1", request((("A", "one"), ("B", "two")), (("A", DIGEST), ("B", ""))))


@dataclass
class RecordingBackend:
    """A secret store in memory that records each call: (method, name or service, region)."""

    stored: dict[tuple[str, str], str] = field(default_factory=dict)  # (region, name) -> value
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    def put(self, name: str, value: Secret, service: str, region: str) -> str:
        self.calls.append(("put", name, region))
        self.stored[(region, name)] = value.value
        return f"ref:{region}:{name}"

    def list_names(self, service: str, region: str) -> Iterator[str]:
        self.calls.append(("list", service, region))
        # Like AWS's name filter, a prefix that matches other services' names too.
        yield from sorted(n for r, n in self.stored if r == region and n.startswith(f"sky-lite_ctl1_{service}"))

    def delete(self, name: str, region: str) -> None:
        self.calls.append(("delete", name, region))
        self.stored.pop((region, name), None)


def secret(service: str, digest: str, variable: str = "TOKEN") -> CloudSecret:
    return CloudSecret(variable, compute_secret_name("ctl1", service, digest), Secret(f"value-{digest[:4]}"))


def test_the_keeper_writes_each_secret_once_per_region_and_answers_its_references() -> None:
    backend = RecordingBackend()
    keeper = SecretKeeper(backend, "ctl1")
    first = keeper.ensure("web", "us-east-1", [secret("web", DIGEST)])
    again = keeper.ensure("web", "us-east-1", [secret("web", DIGEST)])
    elsewhere = keeper.ensure("web", "eu-west-1", [secret("web", DIGEST)])
    name = compute_secret_name("ctl1", "web", DIGEST)
    assert first == again == (("TOKEN", f"ref:us-east-1:{name}"),)
    assert elsewhere == (("TOKEN", f"ref:eu-west-1:{name}"),)
    assert backend.calls == [("put", name, "us-east-1"), ("put", name, "eu-west-1")]


def test_release_deletes_the_services_secrets_where_they_were_written_and_in_the_regions_given() -> None:
    backend = RecordingBackend()
    keeper = SecretKeeper(backend, "ctl1")
    keeper.ensure("web", "us-east-1", [secret("web", DIGEST)])
    keeper.ensure("web-2", "us-east-1", [secret("web-2", DIGEST)])
    # Written by an earlier controller process: this keeper only knows the region from an inventory.
    backend.stored[("ap-south-1", compute_secret_name("ctl1", "web", OTHER))] = "old"

    keeper.release("web", ["ap-south-1"])

    assert sorted(backend.stored) == [("us-east-1", compute_secret_name("ctl1", "web-2", DIGEST))]
    assert [c for c in backend.calls if c[0] == "list"] == [("list", "web", "ap-south-1"),
                                                            ("list", "web", "us-east-1")]
    # Forgotten too: the same service submitted again writes its secret again.
    keeper.ensure("web", "us-east-1", [secret("web", DIGEST)])
    assert backend.calls[-1] == ("put", compute_secret_name("ctl1", "web", DIGEST), "us-east-1")


def test_release_of_a_service_with_nothing_stored_deletes_nothing() -> None:
    backend = RecordingBackend()
    SecretKeeper(backend, "ctl1").release("web", ["us-east-1"])
    assert [c[0] for c in backend.calls] == ["list"]
