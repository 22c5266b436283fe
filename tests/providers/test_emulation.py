"""Instance emulation over the fake provider: what the cloud reports running runs here, on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from skyserve_lite.clock import SystemClock
from skyserve_lite.providers.base import Instance, InstanceState, LaunchRequest
from skyserve_lite.providers.emulation import BootSpec, EmulatedProvider
from skyserve_lite.providers.fake import FakeProvider
from skyserve_lite.spec.parse import parse_task
from tests.providers.http import get_text as get

SERVER = BootSpec(envs=(("GREETING", "hi"),), setup="echo ready > ready.txt",
                  run="exec python3 -m http.server $PORT --bind 127.0.0.1")


def request(replica_id: int) -> LaunchRequest:
    spec = parse_task("service:\n  replicas: 1\nrun: irrelevant\n")
    return LaunchRequest(service="svc", replica_id=replica_id, version=1, spec=spec, launch_token="t",
                         is_spot=False)


def test_running_instances_are_booted_locally_and_stopped_when_gone(tmp_path: Path) -> None:
    cloud = FakeProvider(name="aws")
    asked: list[str] = []

    def boot_spec_of(instance: Instance) -> BootSpec | None:
        asked.append(instance.instance_id)
        return SERVER

    provider = EmulatedProvider(cloud, tmp_path, SystemClock(), boot_spec_of)
    (outcome,) = provider.launch([request(1)])
    assert outcome.instance is not None
    (instance,) = provider.list_instances()
    assert instance.url is not None and instance.url.startswith("http://127.0.0.1:")
    assert instance.instance_id == outcome.instance.instance_id
    assert get(instance.url + "/ready.txt") == "ready\n"
    provider.list_instances()
    assert asked.count(instance.instance_id) == 1  # user data is read once per instance

    cloud.set_state(instance.instance_id, InstanceState.TERMINATED)
    assert provider.list_instances() == []
    assert provider._local.list_instances() == []


def test_unreadable_user_data_reports_pending(tmp_path: Path) -> None:
    cloud = FakeProvider(name="aws")
    provider = EmulatedProvider(cloud, tmp_path, SystemClock(), lambda _instance: None)
    provider.launch([request(1)])
    (instance,) = provider.list_instances()
    assert (instance.state, instance.url) == (InstanceState.PENDING, None)


def test_cloud_states_other_than_running_pass_through(tmp_path: Path) -> None:
    cloud = FakeProvider(name="aws", initial_state=InstanceState.PENDING)
    provider = EmulatedProvider(cloud, tmp_path, SystemClock(), lambda _instance: SERVER)
    provider.launch([request(1)])
    (instance,) = provider.list_instances()
    assert instance.state is InstanceState.PENDING
    assert provider._local.list_instances() == []


def test_cloud_providers_are_built_on_first_use(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from skyserve_lite.clock import SystemClock; "
            "from skyserve_lite.providers import make_providers; "
            f"p = make_providers(Path({str(tmp_path)!r}), SystemClock(), 'c1'); "
            "print(sorted(p), 'boto3' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["['aws',", "'local']", "False"]
