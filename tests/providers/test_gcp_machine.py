"""The controller VM on Compute Engine against the local fake (with its IAM part, ``gcp_iam_fake``): a service
account of its own that the VM runs as, given the roles of ``plan_controller_grants`` and no other, one for
its replicas given those of ``plan_replica_grants``, both made once however often ``ensure`` runs, the
firewall rules following the blocks given, and nothing left after ``delete``.

The grants are values, read one by one here (the fake evaluates no condition), and ``merge_member`` is a table."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1")

from google.auth.credentials import AnonymousCredentials

from skyserve_lite.clock import FakeClock
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.providers.cloud_secrets import compute_secret_name
from skyserve_lite.providers.gcp import GcpPermanentError, GcpProvider
from skyserve_lite.providers.gcp_iam import Condition, Grant, is_same_policy, merge_member
from skyserve_lite.providers.gcp_machine import (
    GcpMachines,
    GcpScope,
    controller_account_email,
    controller_account_id,
    plan_controller_grants,
    plan_replica_grants,
    replica_account_email,
    replica_account_id,
)
from skyserve_lite.providers.machines import MachineRequest
from skyserve_lite.providers.staging import compute_bucket_name
from tests.providers.gce_fake import FakeCompute, serve_fake_compute
from tests.providers.gcp_iam_fake import PROJECT_NUMBER

PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKqkl7S0+1G4GD/J3s7Fk5kbWeZ8gm1N4x1ys4W3gTST sky-lite"
CONTROLLER_ID = "0123456789ab"
ACCOUNT = "sky-lite-ctl-abc123@p.iam.gserviceaccount.com"
MEMBER = f"serviceAccount:{ACCOUNT}"
REPLICAS = "sky-lite-rep-abc123@p.iam.gserviceaccount.com"
REPLICA = f"serviceAccount:{REPLICAS}"
DEFAULT_COMPUTE = f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"  # what replicas ran as before
BUCKETS = f'resource.name.startsWith("projects/_/buckets/sky-lite-{CONTROLLER_ID}-")'
SECRETS = ('resource.type == "cloudresourcemanager.googleapis.com/Project" || '
           f'resource.name.startsWith("projects/{PROJECT_NUMBER}/secrets/sky-lite_{CONTROLLER_ID}_")')
ZONE = "us-central1-a"


@pytest.fixture
def fake() -> Iterator[tuple[FakeCompute, str]]:
    with serve_fake_compute() as served:
        yield served


@pytest.fixture
def machines(fake: tuple[FakeCompute, str]) -> GcpMachines:
    provider = GcpProvider("abc123", FakeClock(), blobs=BlobStore(Path("/nonexistent/sky-lite-blobs")), project="p",
                           credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                           api_endpoint=fake[1], sleep=lambda _s: None)
    return GcpMachines(provider, sleep=lambda _s: None)


def request(**changes: Any) -> MachineRequest:
    values: dict[str, Any] = {"machine_id": "abc123", "region": "us-central1", "image_id": "", "public_key": PUBLIC_KEY,
                              "allow_cidr": "198.51.100.0/24", "ssh_cidr": "203.0.113.7/32",
                              "lb_ports": (30001, 30999)} | changes
    return MachineRequest(**values)


# --- the grants --------------------------------------------------------------------------------------------
SCOPE = GcpScope(project="p", project_number=PROJECT_NUMBER, controller_id=CONTROLLER_ID, replica_account=REPLICAS)
GRANTS = [
    # Compute Engine has nothing narrower than the project for instances and firewall rules to be created.
    ("projects/p", "roles/compute.instanceAdmin.v1", None),
    ("projects/p", "roles/compute.securityAdmin", None),
    # Buckets: the project's role, held to this controller's bucket names.
    ("projects/p", "roles/storage.admin", Condition(f"sky-lite controller {CONTROLLER_ID} buckets", BUCKETS)),
    # Acting as a service account: the replicas' one only (not the project's default one, often an Editor).
    (f"projects/p/serviceAccounts/{REPLICAS}", "roles/iam.serviceAccountUser", None),
    # Secrets: creating and listing on the project itself, everything else on this controller's secrets only.
    ("projects/p", "roles/secretmanager.admin", Condition(f"sky-lite controller {CONTROLLER_ID} secrets", SECRETS)),
]
REPLICA_GRANTS = [
    # Reading the snapshots, in this controller's buckets only; its secrets' own policies name it.
    ("projects/p", "roles/storage.objectViewer", Condition(f"sky-lite controller {CONTROLLER_ID} buckets", BUCKETS)),
]


def test_the_grants_are_these_and_no_other() -> None:
    assert [(g.resource, g.role, g.condition) for g in plan_controller_grants(SCOPE)] == GRANTS


def test_the_replicas_grants_are_these_and_no_other() -> None:
    assert [(g.resource, g.role, g.condition) for g in plan_replica_grants(SCOPE)] == REPLICA_GRANTS


@pytest.mark.parametrize(("controller", "holds"), [(CONTROLLER_ID, True), ("ba9876543210", False)])
def test_the_secret_condition_holds_this_controller_secrets_and_not_another_one(controller: str, holds: bool) -> None:
    prefix = SECRETS.rsplit('"', 2)[1]
    name = f"projects/{PROJECT_NUMBER}/secrets/{compute_secret_name(controller, 'web', 'd' * 32)}"
    assert name.startswith(prefix) is holds
    assert not f"projects/{PROJECT_NUMBER}/locations/us-east1/secrets/sky-lite_{controller}_web_x".startswith(prefix)


@pytest.mark.parametrize(("machine_id", "controller", "replicas"), [
    ("abc123", "sky-lite-ctl-abc123", "sky-lite-rep-abc123"),
    ("5f2c0a9e81d4", "sky-lite-ctl-5f2c0a9e81d4", "sky-lite-rep-5f2c0a9e81d4"),  # what hosting makes: 25 characters
    ("0123456789abcdef0", "sky-lite-ctl-0123456789abcdef0", "sky-lite-rep-0123456789abcdef0"),  # 30: the most
])
def test_account_ids(machine_id: str, controller: str, replicas: str) -> None:
    assert (controller_account_id(machine_id), replica_account_id(machine_id)) == (controller, replicas)
    assert replica_account_email("p", machine_id) == f"{replicas}@p.iam.gserviceaccount.com"


@pytest.mark.parametrize("machine_id", ["0123456789abcdef01", "ABC123", "abc_12", "abc12-", ""])
def test_a_machine_id_that_makes_no_account_id_is_refused(machine_id: str) -> None:
    for make in (controller_account_id, replica_account_id):
        with pytest.raises(GcpPermanentError, match="is not a service account id"):
            make(machine_id)


@pytest.mark.parametrize("service", ["web", "a-very-long-service-name-that-gets-its-bucket-name-shortened"])
def test_the_bucket_condition_holds_this_controller_buckets_and_not_another_one(service: str) -> None:
    prefix = BUCKETS.split('"')[1].removeprefix("projects/_/buckets/")
    assert compute_bucket_name(CONTROLLER_ID, service).startswith(prefix)
    assert not compute_bucket_name("ba9876543210", service).startswith(prefix)


OTHER = "user:owner@example.com"
STORAGE = Grant("projects/p", "roles/storage.admin", Condition("t", "e"))
VIEWER = Grant("projects/p", "roles/viewer")


@pytest.mark.parametrize(("policy", "grants", "bindings", "version"), [
    # Added to nothing: a binding each, version 3 for the condition.
    ({"etag": "x"}, [VIEWER, STORAGE], [{"role": "roles/viewer", "members": [MEMBER]},
                                        {"role": "roles/storage.admin", "members": [MEMBER],
                                         "condition": {"title": "t", "expression": "e"}}], 3),
    # Joins an existing binding of the same role; others' members stay.
    ({"bindings": [{"role": "roles/viewer", "members": [OTHER]}]}, [VIEWER],
     [{"role": "roles/viewer", "members": [OTHER, MEMBER]}], None),
    # What it had and is no longer granted goes; a binding left empty is dropped.
    ({"bindings": [{"role": "roles/editor", "members": [MEMBER]},
                   {"role": "roles/viewer", "members": [OTHER, MEMBER]}]},
     [], [{"role": "roles/viewer", "members": [OTHER]}], None),
    # The same role under another condition is another binding.
    ({"bindings": [{"role": "roles/storage.admin", "members": [OTHER], "condition": {"title": "o", "expression": "f"}}],
      "version": 3}, [STORAGE],
     [{"role": "roles/storage.admin", "members": [OTHER], "condition": {"title": "o", "expression": "f"}},
      {"role": "roles/storage.admin", "members": [MEMBER], "condition": {"title": "t", "expression": "e"}}], 3),
])
def test_merge_member(policy: dict[str, Any], grants: list[Grant], bindings: list[dict[str, Any]],
                      version: int | None) -> None:
    merged = merge_member(policy, MEMBER, grants)
    assert merged["bindings"] == bindings and merged.get("version") == version
    assert merged.get("etag") == policy.get("etag")  # written back with what it was read with
    assert is_same_policy(merge_member(merged, MEMBER, grants), merged)  # a second merge changes nothing


def test_is_same_policy_ignores_order() -> None:
    a = {"bindings": [{"role": "r1", "members": ["a", "b"]}, {"role": "r2", "members": ["c"]}]}
    b = {"bindings": [{"role": "r2", "members": ["c"]}, {"role": "r1", "members": ["b", "a"]}]}
    assert is_same_policy(a, b) and not is_same_policy(a, {"bindings": [{"role": "r1", "members": ["a"]}]})


# --- against the fake --------------------------------------------------------------------------------------
def test_the_vm_runs_as_its_own_account_with_nothing_granted_yet(machines: GcpMachines,
                                                                   fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    launched = machines.ensure(request())
    ((_, instance),) = compute.instances.items()
    assert instance["serviceAccounts"] == [{"email": ACCOUNT,
                                            "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    assert ("service-account", ACCOUNT) in launched.resources
    assert ("replica-service-account", REPLICAS) in launched.resources  # what the host settings name
    assert sorted(compute.iam.accounts) == [ACCOUNT, REPLICAS]
    assert all(MEMBER not in str(policy) and REPLICA not in str(policy) for policy in compute.iam.policies.values())
    assert controller_account_email("p", "abc123") == ACCOUNT


def test_a_rerun_makes_nothing_twice(machines: GcpMachines, fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    first = machines.ensure(request())
    del compute.iam.accounts[REPLICAS]  # lost since (deleted by hand, or a run interrupted before it was made)
    again = machines.ensure(dataclasses.replace(request(), zone=ZONE))
    assert again.resources == first.resources and sorted(compute.iam.accounts) == [ACCOUNT, REPLICAS]
    assert compute.iam.calls["serviceAccounts.create"] == 3  # two, then the missing one
    assert compute.calls["instances.insert"] == 1 and compute.calls["firewalls.insert"] == 2
    machines.ensure(dataclasses.replace(request(), zone=ZONE))
    assert compute.iam.calls["serviceAccounts.create"] == 3


def test_grant_binds_exactly_the_planned_roles(machines: GcpMachines, fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    machines.ensure(request())
    compute.iam.policies["projects/p"] = {"etag": "BwA=", "bindings": [{"role": "roles/owner", "members": [
        "user:owner@example.com"]}, {"role": "roles/editor", "members": [MEMBER]}]}  # an old, broad grant
    default = f"projects/p/serviceAccounts/{DEFAULT_COMPUTE}"
    compute.iam.policies[default] = {"etag": "BwA=", "bindings": [  # an older sky-lite's: replicas ran as it
        {"role": "roles/iam.serviceAccountUser", "members": [MEMBER, "user:owner@example.com"]}]}
    lines = machines.grant("abc123", ZONE, CONTROLLER_ID.upper())
    assert compute.iam.members_of("projects/p") == {
        "roles/owner": ["user:owner@example.com"], "roles/compute.instanceAdmin.v1": [MEMBER],
        "roles/compute.securityAdmin": [MEMBER],
        f"roles/storage.admin if sky-lite controller {CONTROLLER_ID} buckets": [MEMBER],
        f"roles/secretmanager.admin if sky-lite controller {CONTROLLER_ID} secrets": [MEMBER],
        f"roles/storage.objectViewer if sky-lite controller {CONTROLLER_ID} buckets": [REPLICA]}
    assert compute.iam.policies["projects/p"]["version"] == 3
    assert compute.iam.members_of(f"projects/p/serviceAccounts/{REPLICAS}") == {
        "roles/iam.serviceAccountUser": [MEMBER]}
    assert compute.iam.members_of(default) == {"roles/iam.serviceAccountUser": ["user:owner@example.com"]}
    assert [line.split()[0] for line in lines] == ["granted", "granted", "granted", "removed"]
    writes = compute.iam.calls["projects.setIamPolicy"], compute.iam.calls["serviceAccounts.setIamPolicy"]
    assert [line.split()[0] for line in machines.grant("abc123", ZONE, CONTROLLER_ID)] == ["kept", "kept", "kept"]
    # nothing written again
    assert (compute.iam.calls["projects.setIamPolicy"], compute.iam.calls["serviceAccounts.setIamPolicy"]) == writes


def test_grant_says_when_the_replicas_account_is_gone(machines: GcpMachines, fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    machines.ensure(request())
    del compute.iam.accounts[REPLICAS]
    with pytest.raises(GcpPermanentError, match=f"{REPLICAS} of the controller VM is gone; run `sky-lite controller"):
        machines.grant("abc123", ZONE, CONTROLLER_ID)
    assert compute.iam.calls["projects.setIamPolicy"] == 0


def test_a_policy_written_meanwhile_is_read_again(machines: GcpMachines, fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    machines.ensure(request())
    compute.iam.conflicts = 1
    machines.grant("abc123", ZONE, CONTROLLER_ID)
    assert "roles/compute.instanceAdmin.v1" in compute.iam.members_of("projects/p")
    # Read for the VM's account and for the replicas', and once more after the write someone else made.
    assert compute.iam.calls["projects.getIamPolicy"] == 3


def test_grant_says_when_an_older_vm_runs_as_another_account(machines: GcpMachines,
                                                             fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    machines.ensure(request())
    ((_, instance),) = compute.instances.items()
    instance["serviceAccounts"] = [{"email": REPLICAS, "scopes": []}]
    assert any(f"the VM runs as {REPLICAS}" in line for line in machines.grant("abc123", ZONE, CONTROLLER_ID))


def test_a_rerun_with_another_ssh_block_replaces_the_rule(machines: GcpMachines, fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    machines.ensure(request(ssh_cidr="0.0.0.0/0"))
    machines.ensure(dataclasses.replace(request(), zone=ZONE))
    assert {name: rule["sourceRanges"] for name, rule in compute.firewalls.items()} == {
        "sky-lite-controller-abc123-lb": ["198.51.100.0/24"], "sky-lite-controller-abc123-ssh": ["203.0.113.7/32"]}
    assert len(compute.instances) == 1


def test_delete_leaves_no_instance_rule_account_or_binding(machines: GcpMachines,
                                                           fake: tuple[FakeCompute, str]) -> None:
    compute, _ = fake
    machines.ensure(request())
    machines.grant("abc123", ZONE, CONTROLLER_ID)
    done = machines.delete("abc123", ZONE)
    assert compute.instances == {} and compute.firewalls == {} and compute.iam.accounts == {}
    assert all(MEMBER not in str(policy) and REPLICA not in str(policy) for policy in compute.iam.policies.values())
    assert f"deleted service account {ACCOUNT}" in done and f"deleted service account {REPLICAS}" in done
    assert machines.delete("abc123", ZONE) == []  # idempotent
