"""`controller up --cloud gcp` against the fake Compute Engine on 127.0.0.1, with instance emulation: the
VM the fake reports running is booted here as an sshd on a 127.0.0.1 port that accepts the VM's key, so the
bootstrap, a service's life and `controller down` run for real over SSH. The emulated VM's controller reaches
the same fake (``emulated_host.CLOUD_SETTINGS``), so a GCP task with a secret launched through it runs as the
replicas' service account made with the VM, its secret in the fake's Secret Manager readable by that account
alone."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("google.cloud.compute_v1")

from skyserve_lite.remote.config import load_record
from tests.controller.fake_crontab import write_fake_crontab
from tests.e2e.conftest import SkyLite, answering_run, http_get
from tests.providers.gce_fake import FakeCompute, serve_fake_compute, write_service_account_key
from tests.remote.sshd import SSHD
from tests.remote.test_ssh_e2e import serve_one_through_the_host

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.skipif(SSHD is None, reason="needs OpenSSH's sshd (.ci/run installs it)")]


SECRET = "s3cr3t-gcp-vm-5d1e"
GCP_TASK = """\
name: vault
resources:
  cloud: gcp
  region: us-central1
  zone: us-central1-a
secrets:
  API_TOKEN: null
service:
  readiness_probe: /
  replicas: 1
""" + answering_run('"vault " + hashlib.sha256(os.environ["API_TOKEN"].encode()).hexdigest()')


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[tuple[SkyLite, FakeCompute]]:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    crontab = tmp_path / "crontab.txt"
    write_fake_crontab(fake_bin, crontab)
    with serve_fake_compute() as (fake, endpoint):
        sky = SkyLite(tmp_path / "home")
        sky.env |= {"SKY_LITE_EMULATE_INSTANCES": "1", "PATH": f"{fake_bin}:{os.environ['PATH']}",
                    "GOOGLE_APPLICATION_CREDENTIALS": str(write_service_account_key(tmp_path / "key.json", endpoint)),
                    "SKY_LITE_GCP_PROJECT": "p", "SKY_LITE_GCP_ENDPOINT": endpoint}
        try:
            yield sky, fake
        finally:
            with contextlib.suppress(AssertionError, OSError):
                sky.run("controller", "down", "--force", "-y", check=False, timeout=180)
            sky.cleanup()
            for host_home in (sky.home / "emulated-hosts").glob("*/login-home/.sky-lite"):
                SkyLite(host_home).cleanup()


def test_controller_vm_on_gcp_from_up_to_down(cloud: tuple[SkyLite, FakeCompute], tmp_path: Path) -> None:
    sky, fake = cloud
    result = sky.run("controller", "up", "--cloud", "gcp", "--region", "us-central1",
                     "--allow-cidr", "198.51.100.0/24", "--ssh-cidr", "203.0.113.7/32",
                     "--remote-python", str(getattr(sys, "_base_executable", sys.executable)), timeout=600)
    record = load_record(sky.home)
    assert record is not None and record.machine is not None and record.machine.cloud == "gcp"
    assert record.machine.instance_id in result.stdout and "pinned" in result.stdout

    ((zone, name), instance), = fake.instances.items()
    assert f"{zone}/{name}" == record.machine.instance_id and record.machine.zone == zone
    assert instance["labels"]["sky-lite-controller-host"] == record.machine.machine_id
    keys = {i["key"]: i["value"] for i in instance["metadata"]["items"]}["ssh-keys"]
    public = (sky.home / "ssh" / f"controller-{record.machine.machine_id}.pub").read_text().strip()
    assert keys.endswith(public)
    assert instance["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    # The VM runs as an account of its own, bound to the roles its controller needs once it said its id.
    account = f"sky-lite-ctl-{record.machine.machine_id}@p.iam.gserviceaccount.com"
    assert instance["serviceAccounts"][0]["email"] == account
    (host_home,) = (sky.home / "emulated-hosts").glob("*/login-home/.sky-lite")
    controller_id = (host_home / "controller-id").read_text().strip()
    bound = fake.iam.members_of("projects/p")
    assert {role for role, members in bound.items() if f"serviceAccount:{account}" in members} == {
        "roles/compute.instanceAdmin.v1", "roles/compute.securityAdmin",
        f"roles/storage.admin if sky-lite controller {controller_id} buckets",
        f"roles/secretmanager.admin if sky-lite controller {controller_id} secrets"}
    rules = {r["name"]: (r["sourceRanges"], r["allowed"][0]["ports"], r["targetTags"]) for r in fake.firewalls.values()}
    tag = [f"sky-lite-controller-{record.machine.machine_id}"]
    assert rules == {f"{tag[0]}-lb": (["198.51.100.0/24"], ["30001-30999"], tag),
                     f"{tag[0]}-ssh": (["203.0.113.7/32"], ["22"], tag)}
    assert json.loads(sky.run("controller", "status", "-o", "json").stdout)["running"] is True

    # Its replicas run as an account made with it, which the host settings name, reading its buckets alone.
    replicas = f"sky-lite-rep-{record.machine.machine_id}@p.iam.gserviceaccount.com"
    assert set(fake.iam.accounts) == {account, replicas}
    assert json.loads((host_home / "host.json").read_text())["gcp_service_account"] == replicas
    assert {role for role, members in bound.items() if f"serviceAccount:{replicas}" in members} == {
        f"roles/storage.objectViewer if sky-lite controller {controller_id} buckets"}
    assert fake.iam.members_of(f"projects/p/serviceAccounts/{replicas}") == {
        "roles/iam.serviceAccountUser": [f"serviceAccount:{account}"]}

    serve_one_through_the_host(sky, tmp_path)
    serve_a_secret_through_the_host(sky, fake, tmp_path, controller_id, replicas)

    down = sky.run("controller", "down", "-y", timeout=300)
    assert record.machine.instance_id in down.stdout and load_record(sky.home) is None
    assert fake.instances == {} and fake.iam.accounts == {}
    # The replicas' firewall rule (per controller and port, kept for the next service) is the only one left.
    assert set(fake.firewalls) <= {f"sky-lite-{controller_id}-8080"}
    assert all("sky-lite-ctl-" not in str(p) and "sky-lite-rep-" not in str(p) for p in fake.iam.policies.values())
    assert not list((sky.home / "emulated-hosts").glob("*"))


def serve_a_secret_through_the_host(sky: SkyLite, fake: FakeCompute, folder: Path, controller_id: str,
                                    replicas: str) -> None:
    """Up a one-replica GCP service with a secret through the recorded host: its instance runs as the
    replicas' account, its secret is in Secret Manager readable by that account alone; down deletes both."""
    task = folder / "vault.yaml"
    task.write_text(GCP_TASK)
    up = sky.run("serve", "up", str(task), "--secret", f"API_TOKEN={SECRET}", "--timeout", "180", timeout=240)
    assert SECRET not in up.stdout + up.stderr
    (service,) = sky.status("vault")["services"]
    assert http_get(service["endpoint"]) == (200, "vault " + hashlib.sha256(SECRET.encode()).hexdigest())

    (instance,) = [i for i in fake.instances.values() if i["labels"].get("sky-lite-service") == "vault"]
    assert instance["serviceAccounts"] == [{"email": replicas,
                                            "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    assert SECRET not in json.dumps(instance["metadata"])
    (name,) = fake.secrets
    assert name.startswith(f"sky-lite_{controller_id}_vault_")
    assert fake.secrets[name].payloads == [SECRET.encode()]
    assert fake.secrets[name].bindings == [{"role": "roles/secretmanager.secretAccessor",
                                            "members": [f"serviceAccount:{replicas}"]}]

    sky.run("serve", "down", "vault", "-y", timeout=180)
    assert fake.secrets == {}
    assert not [i for i in fake.instances.values() if i["labels"].get("sky-lite-service") == "vault"]
