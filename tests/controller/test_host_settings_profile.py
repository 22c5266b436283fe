"""A controller VM's host settings name the instance profile made for its replicas: written by `controller up`
(``host_settings_of`` the record, through `controller host-settings`), read back by the AWS provider when
``SKY_LITE_AWS_INSTANCE_PROFILE`` names none; a VM an older sky-lite launched has none and gets none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from skyserve_lite.cli.main import main
from skyserve_lite.clock import FakeClock
from skyserve_lite.controller.host import HOST_FILE, HostSettings, load_host_settings, write_host_settings
from skyserve_lite.errors import ControllerError, UsageError
from skyserve_lite.remote.config import CloudMachine, ControllerRecord
from skyserve_lite.remote.hosting import host_settings_of
from skyserve_lite.remote.ssh import SshTarget


def test_the_profile_is_written_and_read_back(tmp_path: Path) -> None:
    settings = HostSettings("0.0.0.0", "203.0.113.5", aws_instance_profile="sky-lite-replica-m1")
    write_host_settings(tmp_path, settings)
    assert load_host_settings(tmp_path) == settings


def test_a_file_without_one_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / HOST_FILE).write_text(json.dumps({"lb_host": "0.0.0.0", "endpoint_host": "203.0.113.5"}))
    assert load_host_settings(tmp_path).aws_instance_profile is None
    write_host_settings(tmp_path, HostSettings("0.0.0.0", "203.0.113.5"))
    assert "aws_instance_profile" not in json.loads((tmp_path / HOST_FILE).read_text())


@pytest.mark.parametrize("name", ["", "a b", "x;rm", "p" * 129])
def test_a_name_that_is_no_profile_name_is_refused(name: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^aws-instance-profile: "):
        HostSettings(aws_instance_profile=name)
    (tmp_path / HOST_FILE).write_text(json.dumps({"lb_host": "0.0.0.0", "endpoint_host": "h",
                                                  "aws_instance_profile": name}))
    with pytest.raises(ControllerError, match="is damaged"):
        load_host_settings(tmp_path)


def test_the_host_settings_command_writes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKY_LITE_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(main, ["controller", "host-settings", "--lb-host", "0.0.0.0", "--endpoint-host",
                                       "203.0.113.5", "--aws-instance-profile", "sky-lite-replica-m1"])
    assert result.exit_code == 0, result.output
    assert load_host_settings(tmp_path / "home").aws_instance_profile == "sky-lite-replica-m1"


def record(cloud: str, resources: tuple[tuple[str, str], ...]) -> ControllerRecord:
    machine = CloudMachine(cloud=cloud, region="us-east-1", instance_id="i-1", resources=resources,
                           machine_id="m1", address="54.1.2.3")
    return ControllerRecord(target=SshTarget("54.1.2.3", 22, "ubuntu", None), remote_home="/home/ubuntu/.sky-lite",
                            host_keys=(), fingerprint="SHA256:x", machine=machine)


@pytest.mark.parametrize(("cloud", "resources", "profile"), [
    ("aws", (("role", "sky-lite-controller-m1"), ("replica-instance-profile", "sky-lite-replica-m1")),
     "sky-lite-replica-m1"),
    ("aws", (("role", "sky-lite-controller-m1"),), None),  # launched by an older sky-lite: none was made
    ("gcp", (("service-account", "sky-lite-ctl-m1@p.iam.gserviceaccount.com"),), None),
])
def test_host_settings_of_a_recorded_vm(cloud: str, resources: tuple[tuple[str, str], ...],
                                        profile: str | None) -> None:
    settings = host_settings_of(record(cloud, resources))
    assert (settings.lb_host, settings.endpoint_host, settings.aws_instance_profile) == ("0.0.0.0", "54.1.2.3", profile)


def test_the_aws_provider_takes_the_profile_of_the_host_settings(tmp_path: Path) -> None:
    pytest.importorskip("boto3")
    from skyserve_lite.providers import LazyProvider, make_providers

    write_host_settings(tmp_path, HostSettings(aws_instance_profile="sky-lite-replica-m1"))
    for env, expected in (({}, "sky-lite-replica-m1"), ({"SKY_LITE_AWS_INSTANCE_PROFILE": "mine"}, "mine")):
        aws = make_providers(tmp_path, FakeClock(), "0123456789ab", env)["aws"]
        assert isinstance(aws, LazyProvider)
        assert aws.provider._instance_profile == expected  # type: ignore[attr-defined]
