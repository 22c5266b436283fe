"""The service account made for a GCP controller VM's replicas reaches its GCP provider: recorded with what
`controller up --cloud gcp` made (``replica-service-account``), put in the host settings by
``host_settings_of``, written on the host by the bootstrap's `controller host-settings --gcp-service-account`,
and read back by ``make_providers`` when ``SKY_LITE_GCP_SERVICE_ACCOUNT`` names none (which still wins)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from skyserve_lite.cli.main import main
from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.host import HOST_FILE, HostSettings, load_host_settings, write_host_settings
from skyserve_lite.errors import ControllerError, UsageError
from skyserve_lite.remote.bootstrap import HostPlan, install
from skyserve_lite.remote.config import CloudMachine, ControllerRecord
from skyserve_lite.remote.hosting import host_settings_of
from skyserve_lite.remote.ssh import SshTarget

REPLICAS = "sky-lite-rep-5f2c0a9e81d4@p.iam.gserviceaccount.com"


def test_the_account_is_written_and_read_back(tmp_path: Path) -> None:
    settings = HostSettings("0.0.0.0", "203.0.113.5", gcp_service_account=REPLICAS)
    write_host_settings(tmp_path, settings)
    assert load_host_settings(tmp_path) == settings
    assert json.loads((tmp_path / HOST_FILE).read_text())["gcp_service_account"] == REPLICAS


def test_a_file_without_one_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / HOST_FILE).write_text(json.dumps({"lb_host": "0.0.0.0", "endpoint_host": "203.0.113.5"}))
    assert load_host_settings(tmp_path).gcp_service_account is None
    write_host_settings(tmp_path, HostSettings("0.0.0.0", "203.0.113.5"))
    assert "gcp_service_account" not in json.loads((tmp_path / HOST_FILE).read_text())


@pytest.mark.parametrize("account", [REPLICAS, "123456789012-compute@developer.gserviceaccount.com"])
def test_service_account_emails_are_taken(account: str) -> None:
    assert HostSettings(gcp_service_account=account).gcp_service_account == account


@pytest.mark.parametrize("account", ["", "sky-lite-rep", "a b@p.iam.gserviceaccount.com", "x@p;rm -rf",
                                     "Sky@p.iam.gserviceaccount.com", "a@" + "p" * 200])
def test_what_is_no_service_account_email_is_refused(account: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^gcp-service-account: "):
        HostSettings(gcp_service_account=account)
    (tmp_path / HOST_FILE).write_text(json.dumps({"lb_host": "0.0.0.0", "endpoint_host": "h",
                                                  "gcp_service_account": account}))
    with pytest.raises(ControllerError, match="is damaged"):
        load_host_settings(tmp_path)


def test_the_host_settings_command_refuses_a_bad_account_and_writes_nothing(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKY_LITE_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(main, ["controller", "host-settings", "--lb-host", "0.0.0.0", "--endpoint-host",
                                       "203.0.113.5", "--gcp-service-account", "not an email"])
    assert result.exit_code != 0 and "gcp-service-account: 'not an email'" in result.output
    assert not (tmp_path / "home" / HOST_FILE).exists()


def record(cloud: str, resources: tuple[tuple[str, str], ...]) -> ControllerRecord:
    machine = CloudMachine(cloud=cloud, region="us-central1", instance_id="us-central1-a/sky-lite-controller-m1",
                           resources=resources, machine_id="m1", address="34.1.2.3")
    return ControllerRecord(target=SshTarget("34.1.2.3", 22, "ubuntu", None), remote_home="/home/ubuntu/.sky-lite",
                            host_keys=(), fingerprint="SHA256:x", machine=machine)


@pytest.mark.parametrize(("cloud", "resources", "account"), [
    ("gcp", (("service-account", "sky-lite-ctl-m1@p.iam.gserviceaccount.com"), ("replica-service-account", REPLICAS)),
     REPLICAS),
    # Launched by an older sky-lite: none was made (a rerun of `controller up` makes it and records it).
    ("gcp", (("service-account", "sky-lite-ctl-m1@p.iam.gserviceaccount.com"),), None),
    ("aws", (("replica-instance-profile", "sky-lite-replica-m1"), ("replica-service-account", REPLICAS)), None),
])
def test_host_settings_of_a_recorded_vm(cloud: str, resources: tuple[tuple[str, str], ...],
                                        account: str | None) -> None:
    settings = host_settings_of(record(cloud, resources))
    assert (settings.lb_host, settings.endpoint_host, settings.gcp_service_account) == ("0.0.0.0", "34.1.2.3", account)


class RecordingShell:
    """The bootstrap's ``RemoteShell``, recording each command line instead of running it over ssh."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, command: str, *, what: str, stdin: bytes | None = None, timeout_seconds: float = 900) -> str:
        self.commands.append(command)
        return ""


def test_the_bootstrap_writes_it_on_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shell = RecordingShell()
    wheel = tmp_path / "sky_lite.whl"
    wheel.write_bytes(b"wheel")
    plan = HostPlan(remote_home=None, extras=("gcp",), settings=host_settings_of(record("gcp", (
        ("replica-service-account", REPLICAS),))))
    install(shell, plan, "/home/ubuntu/.sky-lite", wheel, restart=False)  # type: ignore[arg-type]
    (line,) = [c for c in shell.commands if " host-settings " in c]
    # Run the line the host would run, against a home here: the account lands in its host.json.
    words = shlex.split(line)
    args = words[words.index("controller"):]
    assert args[args.index("--gcp-service-account") + 1] == REPLICAS
    monkeypatch.setenv("SKY_LITE_HOME", str(tmp_path / "host-home"))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert load_host_settings(tmp_path / "host-home").gcp_service_account == REPLICAS


def test_without_an_account_the_bootstrap_names_none(tmp_path: Path) -> None:
    shell = RecordingShell()
    wheel = tmp_path / "sky_lite.whl"
    wheel.write_bytes(b"wheel")
    install(shell, HostPlan(remote_home=None), "/home/u/.sky-lite", wheel, restart=False)  # type: ignore[arg-type]
    assert [c for c in shell.commands if " host-settings " in c and "--gcp-service-account" not in c] != []


@pytest.mark.parametrize(("env", "expected"), [
    ({}, REPLICAS),  # a controller VM's: the account made for its replicas
    ({"SKY_LITE_GCP_SERVICE_ACCOUNT": "mine@p.iam.gserviceaccount.com"}, "mine@p.iam.gserviceaccount.com"),
    ({"SKY_LITE_GCP_SERVICE_ACCOUNT": ""}, REPLICAS),  # set but empty: as unset
])
def test_the_gcp_provider_takes_the_account_of_the_host_settings(env: dict[str, str], expected: str,
                                                                  tmp_path: Path) -> None:
    pytest.importorskip("google.cloud.compute_v1")
    from skyserve_lite.providers import LazyProvider, make_providers

    write_host_settings(tmp_path, HostSettings(gcp_service_account=REPLICAS))
    gcp = make_providers(tmp_path, FakeClock(), "0123456789ab", env)["gcp"]
    assert isinstance(gcp, LazyProvider)
    assert gcp.provider._service_account == expected  # type: ignore[attr-defined]


def test_without_host_settings_the_gcp_provider_has_no_account(tmp_path: Path) -> None:
    pytest.importorskip("google.cloud.compute_v1")
    from skyserve_lite.providers import LazyProvider, make_providers

    gcp = make_providers(tmp_path, FakeClock(), "0123456789ab", {})["gcp"]
    assert isinstance(gcp, LazyProvider)
    assert gcp.provider._service_account is None  # type: ignore[attr-defined]
