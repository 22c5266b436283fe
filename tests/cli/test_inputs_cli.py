"""`--env`, `--env-file`, `--secret`, `--infra` and `config set default_infra` through the CLI: what is stored,
what is refused, and that a secret's value is nowhere but in the secret store."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController, ServiceView
from skyserve_lite.clock import FakeClock
from skyserve_lite.state.models import ReplicaRecord, ReplicaStatus, VersionRecord
from skyserve_lite.state.store import Store

from .runner import Cli

TOKEN = "hf_TOKEN-1234-never-shown"
TASK = """\
envs:
  MODEL: null
  SIZE: small
secrets:
  HF_TOKEN: null
service:
  replicas: 1
run: python serve.py
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("SKY_LITE_HOME", str(home))
    return home


@pytest.fixture
def cli(home: Path) -> Cli:
    return Cli(LocalController(home, FakeClock(), start_daemon=False))


def write(tmp_path: Path, text: str, name: str = "svc.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def versions(home: Path) -> list[VersionRecord]:
    store = Store.open(home)
    try:
        return store.list_versions("svc")
    finally:
        store.close()


def services(home: Path) -> list[str]:
    if not (home / "state.db").exists():
        return []
    store = Store.open(home)
    try:
        return [s.name for s in store.list_services()]
    finally:
        store.close()


def grep_home(home: Path, needle: str) -> list[Path]:
    """Every file under ``home`` whose bytes hold ``needle``, the secret store aside."""
    return [path for path in home.rglob("*") if path.is_file() and "secrets" not in path.parts
            and needle.encode() in path.read_bytes()]


def up(cli: Cli, task: str, *args: str) -> tuple[int, str, str]:
    return cli("serve", "up", task, "-n", "svc", "--no-wait", *args)


@pytest.mark.parametrize(("args", "field"), [
    pytest.param([f"--secret=HF_TOKEN={TOKEN}"], "envs.MODEL", id="env-missing"),
    pytest.param(["--env", "MODEL=m"], "secrets.HF_TOKEN", id="secret-missing"),
])
def test_a_value_left_open_is_refused_naming_it_and_nothing_is_stored(cli: Cli, home: Path, tmp_path: Path,
                                                                      args: list[str], field: str) -> None:
    code, _, stderr = up(cli, write(tmp_path, TASK), *args)
    assert code == 2
    assert f"{field}: has no value" in stderr and "--" in stderr
    assert services(home) == []


def test_envs_and_secrets_are_bound_and_the_secret_is_stored_apart(cli: Cli, home: Path, tmp_path: Path) -> None:
    code, stdout, stderr = up(cli, write(tmp_path, TASK), "--env", "MODEL=llama", "--env", "SIZE=big",
                              "--secret", f"HF_TOKEN={TOKEN}")
    assert code == 0, stderr
    [version] = versions(home)
    assert dict(version.spec.envs) == {"MODEL": "llama", "SIZE": "big"}  # --env wins over the file's value
    [(name, digest)] = version.spec.secrets
    assert name == "HF_TOKEN" and len(digest) == 32 and TOKEN not in digest
    assert version.text == (tmp_path / "svc.yaml").read_text()  # the text as written: it held no value
    assert grep_home(home, TOKEN) == []
    stored = home / "secrets" / digest
    assert stored.read_text() == TOKEN
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stat.S_IMODE((home / "secrets").stat().st_mode) == 0o700
    assert TOKEN not in stdout + stderr


def test_a_secret_written_in_the_file_never_reaches_the_stored_text(cli: Cli, home: Path, tmp_path: Path) -> None:
    text = TASK.replace("HF_TOKEN: null", f"HF_TOKEN: {TOKEN}").replace("MODEL: null", "MODEL: m")
    code, _, stderr = up(cli, write(tmp_path, text))
    assert code == 0, stderr
    [version] = versions(home)
    assert TOKEN not in version.text and "HF_TOKEN: null" in version.text
    assert grep_home(home, TOKEN) == []
    code, stdout, stderr = cli("serve", "history", "svc")
    assert code == 0 and TOKEN not in stdout + stderr


def test_env_from_the_callers_environment_and_from_an_env_file(cli: Cli, home: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    env_file = write(tmp_path, "# models\nexport MODEL='llama 3'\nSIZE=\"x y\"  # trailing comment\nTAG=v1#rc2\n"
                               "HASH='#not-a-comment'\n", "vars.env")
    code, _, stderr = up(cli, write(tmp_path, TASK), "--env-file", env_file, "--secret", "HF_TOKEN")
    assert code == 0, stderr
    [version] = versions(home)
    assert dict(version.spec.envs) == {"MODEL": "llama 3", "SIZE": "x y", "TAG": "v1#rc2",
                                       "HASH": "#not-a-comment"}


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("TOKEN hunter2\n", "line 1: expected NAME=VALUE", id="no-equals"),
    pytest.param("BAD-NAME=hunter2\n", "line 1: 'BAD-NAME': not a valid environment variable name", id="bad-name"),
    pytest.param("A='hunter2\n", "line 1: No closing quotation", id="unclosed-quote"),
])
def test_a_bad_env_file_line_is_named_without_showing_it(cli: Cli, home: Path, tmp_path: Path, text: str,
                                                          message: str) -> None:
    code, _, stderr = up(cli, write(tmp_path, TASK), "--env-file", write(tmp_path, text, "bad.env"))
    assert code == 2 and message in stderr
    assert "hunter2" not in stderr


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--env", "NOT_SET_ANYWHERE_X"], "--env NOT_SET_ANYWHERE_X: NOT_SET_ANYWHERE_X is not set in this "
                 "environment", id="env-not-in-environment"),
    pytest.param(["--env", "1X=2"], "--env '1X': not a valid environment variable name", id="env-bad-name"),
    pytest.param(["--secret", "MY-TOK=hunter2"], "--secret 'MY-TOK': not a valid environment variable name",
                 id="secret-bad-name"),
    pytest.param(["--env-file", "/nonexistent/vars.env"], "--env-file /nonexistent/vars.env: cannot read the file",
                 id="env-file-missing"),
    pytest.param(["--infra", "oci"], "--infra: cloud 'oci' is not offered by sky-lite", id="infra-not-offered"),
    pytest.param(["--infra", "aws/us-east-1/eu-west-1a"], "zone 'eu-west-1a' is not in region 'us-east-1'",
                 id="infra-bad-zone"),
    pytest.param(["--env", "MODEL=m", "--secret", "SIZE=x", "--secret", f"HF_TOKEN={TOKEN}"],
                 "--secret SIZE: the task's envs name SIZE too", id="secret-also-env"),
])
def test_bad_inputs_exit_2_naming_the_option(cli: Cli, home: Path, tmp_path: Path, args: list[str],
                                             message: str) -> None:
    os.environ.pop("NOT_SET_ANYWHERE_X", None)
    code, _, stderr = up(cli, write(tmp_path, TASK), *args)
    assert code == 2
    assert message in stderr
    assert "hunter2" not in stderr  # a refused --secret never shows its value
    assert services(home) == []


def test_an_update_keeps_open_values_and_a_changed_secret_replaces_replicas(cli: Cli, home: Path,
                                                                          tmp_path: Path) -> None:
    task = write(tmp_path, TASK)
    assert up(cli, task, "--env", "MODEL=m", "--secret", f"HF_TOKEN={TOKEN}")[0] == 0
    store = Store.open(home)
    store.add_replicas("svc", 1, ReplicaRecord(service="svc", replica_id=0, version=1, status=ReplicaStatus.READY,
                                               cloud="local", launched_at=0.0, status_since=0.0, launch_token="t"))
    store.close()
    # Nothing given again: MODEL and HF_TOKEN are kept, so there is nothing to replace.
    code, stdout, stderr = cli("serve", "update", "--no-wait", "svc", task, "--dry-run")
    assert code == 0, stderr
    assert "secrets.HF_TOKEN" not in stdout and "reuse 1" in stdout
    code, stdout, stderr = cli("serve", "update", "svc", task, "--secret", "HF_TOKEN=another-value", "--dry-run")
    assert code == 0, stderr
    assert "secrets.HF_TOKEN: changed" in stdout
    assert "another-value" not in stdout and TOKEN not in stdout
    code, _, stderr = cli("serve", "update", "--no-wait", "svc", task, "--secret", "HF_TOKEN=another-value", "-y")
    assert code == 0, stderr
    first, second = versions(home)
    assert dict(second.spec.envs)["MODEL"] == "m"
    assert first.spec.secrets != second.spec.secrets
    # Rolling back brings version 1's own secret back, by its digest.
    code, _, stderr = cli("serve", "rollback", "--no-wait", "svc", "-y")
    assert code == 0, stderr
    third = versions(home)[-1]
    assert third.spec.secrets == first.spec.secrets
    assert grep_home(home, "another-value") == [] and grep_home(home, TOKEN) == []


def test_default_infra_is_a_validated_setting(cli: Cli, home: Path) -> None:
    code, stdout, _ = cli("config", "set", "default_infra", "gcp/us-central1")
    assert code == 0 and "default_infra = gcp/us-central1" in stdout
    code, stdout, _ = cli("config", "list")
    assert "default_infra = gcp/us-central1" in stdout
    code, _, stderr = cli("config", "set", "default_infra", "azure")
    assert code == 2 and "default_infra: cloud 'azure' is not offered" in stderr
    code, _, stderr = cli("config", "set", "colour", "blue")
    assert code == 2 and "unknown setting 'colour'" in stderr
    assert cli("config", "unset", "default_infra")[0] == 0
    assert "default_infra = (unset)" in cli("config", "list")[1]


def test_infra_local_runs_a_task_that_names_no_cloud_locally(cli: Cli, home: Path, tmp_path: Path) -> None:
    code, _, stderr = up(cli, write(tmp_path, TASK), "--infra", "local", "--env", "MODEL=m",
                         "--secret", f"HF_TOKEN={TOKEN}")
    assert code == 0, stderr
    [version] = versions(home)
    assert version.spec.cloud.value == "local" and version.inputs.infra == "local"


def test_task_name_with_capitals_gives_a_dns_service_name(cli: Cli, home: Path, tmp_path: Path) -> None:
    text = "name: deepseek-r1-A100\nservice: {replicas: 1}\nrun: python serve.py\n"
    code, _, stderr = cli("serve", "up", write(tmp_path, text), "--no-wait")
    assert code == 0, stderr
    assert services(home) == ["deepseek-r1-a100"]


GPU_TASK = """\
name: llama-A100
secrets:
  HF_TOKEN: null
resources:
  accelerators: {L4: 1, A10G: 1}
  cpus: 4+
  disk_tier: best
service:
  replicas: 2
run: vllm serve --port 8000
"""


def test_up_dry_run_prints_the_per_replica_plan_and_stores_nothing(cli: Cli, home: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)  # no credentials, no region: the plan needs neither
    code, stdout, stderr = cli("serve", "up", write(tmp_path, GPU_TASK), "--dry-run", "--infra", "aws",
                               "--secret", f"HF_TOKEN={TOKEN}")
    assert code == 0, stderr
    assert "Launch llama-a100 on aws: 2 replicas" in stdout
    assert "1. L4:1, cpus 4+ -> g6.xlarge (us-east-1, $0.80/h, on-demand)" in stdout
    assert "2. A10G:1, cpus 4+ -> g5.xlarge (us-east-1, $1.01/h, on-demand)" in stdout
    assert "base-oss-nvidia-driver-gpu-ubuntu-22.04" in stdout and "io2, 20000 IOPS" in stdout
    assert "HF_TOKEN (secret)" in stdout and TOKEN not in stdout + stderr
    assert not home.exists()
    code, stdout, _ = cli("serve", "up", write(tmp_path, GPU_TASK), "--dry-run", "-o", "json", "--infra", "aws",
                          "--secret", f"HF_TOKEN={TOKEN}")
    plan = json.loads(stdout)
    assert [r["market"] for r in plan["replicas"]] == ["on-demand", "on-demand"]
    assert [p["instance_type"] for p in plan["replicas"][0]["placements"]] == ["g6.xlarge", "g5.xlarge"]
    assert plan["hourly_price"] == pytest.approx(2 * 0.8048)
    assert plan["secrets"] == ["HF_TOKEN"] and TOKEN not in stdout
    assert not home.exists()


def test_up_dry_run_refuses_what_cannot_run_naming_the_field(cli: Cli, home: Path, tmp_path: Path) -> None:
    code, _, stderr = cli("serve", "up", write(tmp_path, GPU_TASK), "--dry-run", "--infra", "local",
                          "--secret", f"HF_TOKEN={TOKEN}")
    assert code == 2
    assert "resources.accelerators: L4:1: the local cloud runs replicas as processes" in stderr
    assert "candidates considered: L4:1, cpus 4+, A10G:1, cpus 4+" in stderr
    assert not home.exists()


def test_default_infra_decides_where_a_task_naming_no_cloud_runs(cli: Cli, home: Path, tmp_path: Path) -> None:
    assert cli("config", "set", "default_infra", "aws/us-west-2")[0] == 0
    code, stdout, stderr = cli("serve", "up", write(tmp_path, GPU_TASK), "--dry-run", "-o", "json",
                               "--secret", f"HF_TOKEN={TOKEN}")
    assert code == 0, stderr
    assert json.loads(stdout)["replicas"][0]["placements"][0]["region"] == "us-west-2"
    code, stdout, stderr = cli("serve", "up", write(tmp_path, GPU_TASK), "--dry-run", "-o", "json", "--infra",
                               "gcp", "--secret", f"HF_TOKEN={TOKEN}")
    assert code == 0, stderr
    assert json.loads(stdout)["cloud"] == "gcp"  # --infra wins over the setting


def test_envs_are_filled_into_file_mounts_as_skypilot_does(cli: Cli, home: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "set1").mkdir()
    (tmp_path / "set1" / "rows.csv").write_text("a,b\n")
    text = ("envs:\n  DATASET: null\nfile_mounts:\n  /data/${DATASET}: ./$DATASET\n  /keep/$UNKNOWN: ./set1\n"
            "service:\n  replicas: 1\nrun: python serve.py\n")
    code, _, stderr = up(cli, write(tmp_path, text), "--env", "DATASET=set1")
    assert code == 0, stderr
    [version] = versions(home)
    assert dict(version.spec.file_mounts) == {"/data/set1": "./set1", "/keep/$UNKNOWN": "./set1"}
    files = version.spec.files
    assert files is not None and set(files.mount) == {"/data/set1", "/keep/$UNKNOWN"}
    assert [e.path for e in files.mount["/data/set1"].entries if e.digest] == ["rows.csv"]


@pytest.mark.parametrize(("mounts", "field", "message"), [
    pytest.param({"/d/${X}": "./a"}, "file_mounts./d/${X}", "may not contain '..'", id="filled-climbs-out"),
    pytest.param({"${E}": "./a"}, "file_mounts.${E}", "the destination path is empty", id="filled-empty"),
    pytest.param({"/d/${Y}": "./a", "/d/b": "./b"}, "file_mounts./d/b", "the destination of another mount",
                 id="two-become-one"),
])
def test_filled_file_mounts_are_checked_again(mounts: dict[str, str], field: str, message: str) -> None:
    import dataclasses

    from skyserve_lite.errors import SpecError
    from skyserve_lite.spec.inputs import fill_references
    from skyserve_lite.spec.parse import parse_task

    spec = parse_task(PLAIN)
    spec = dataclasses.replace(spec, file_mounts=tuple(sorted(mounts.items())),
                               envs=(("E", ""), ("X", ".."), ("Y", "b")))
    with pytest.raises(SpecError) as caught:
        fill_references(spec, "t.yaml")
    assert caught.value.path == field and message in caught.value.problem


PLAIN = "service:\n  replicas: 1\nrun: python serve.py\n"


def clouds(home: Path) -> list[str]:
    return [v.spec.cloud.value for v in versions(home)]


def test_an_update_stays_where_the_current_version_runs_whoever_decided_it(cli: Cli, home: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    assert up(cli, write(tmp_path, PLAIN))[0] == 0  # local by default
    assert cli("config", "set", "default_infra", "aws")[0] == 0
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, PLAIN.replace("1\n", "2\n", 1)), "-y")[0] == 0
    named = "resources:\n  cloud: aws\n  region: us-west-2\n" + PLAIN
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, named), "--infra", "aws", "-y")[0] == 0
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, PLAIN), "-y")[0] == 0  # the file drops `cloud`
    assert clouds(home) == ["local", "local", "aws", "aws"]


def test_an_update_needing_more_than_local_leaves_a_local_it_never_chose(cli: Cli, home: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    gpu = "resources:\n  accelerators: L4:1\n" + PLAIN
    assert up(cli, write(tmp_path, PLAIN))[0] == 0  # local by default, nobody chose it
    code, _, stderr = cli("serve", "update", "--no-wait", "svc", write(tmp_path, gpu), "-y")
    assert code == 0, stderr
    assert clouds(home) == ["local", "gcp"]  # g2-standard-4 is cheaper than aws's g6.xlarge
    assert versions(home)[-1].inputs.infra == "gcp"  # stored: the next update stays there
    # Local named by the user is kept, and refuses what it cannot run.
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, PLAIN), "--infra", "local", "-y")[0] == 0
    code, _, stderr = cli("serve", "update", "--no-wait", "svc", write(tmp_path, gpu), "-y")
    assert code == 2 and "the local cloud runs replicas as processes" in stderr


def test_a_rollback_runs_where_and_on_what_that_version_ran(cli: Cli, home: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    gpu = "resources:\n  accelerators: {L4: 1, A10G: 1}\n" + PLAIN
    assert up(cli, write(tmp_path, gpu), "--infra", "aws")[0] == 0
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, PLAIN), "--infra", "local", "-y")[0] == 0
    monkeypatch.delenv("AWS_DEFAULT_REGION")  # today's default would be another region
    code, _, stderr = cli("serve", "rollback", "--no-wait", "svc", "--to", "1", "-y")
    assert code == 0, stderr
    first, _, third = versions(home)
    assert clouds(home) == ["aws", "local", "aws"]
    assert third.spec.resolution == first.spec.resolution
    assert third.spec.resolution is not None and {p.region for p in third.spec.resolution.ondemand} == {"us-west-2"}
    code, _, stderr = cli("serve", "rollback", "--no-wait", "svc", "--to", "2", "-y")
    assert code == 0, stderr
    assert clouds(home)[-1] == "local"


def test_a_refused_submission_keeps_no_secret_value(cli: Cli, home: Path, tmp_path: Path) -> None:
    gpu = TASK.replace("service:", "resources:\n  infra: local\n  accelerators: A100:1\nservice:")  # no GPUs
    code, _, stderr = up(cli, write(tmp_path, gpu), "--env", "MODEL=m", "--secret", f"HF_TOKEN={TOKEN}")
    assert code == 2 and "resources.accelerators" in stderr
    assert not (home / "secrets").exists() or [p.name for p in (home / "secrets").iterdir()] in ([], [".key"])


def test_values_no_version_names_are_collected_once_old_enough(home: Path) -> None:
    import time

    from skyserve_lite.spec.inputs import BoundInputs
    from skyserve_lite.spec.model import Secret
    from skyserve_lite.spec.parse import read_task
    from skyserve_lite.state.secrets import SecretStore

    secrets = SecretStore(home)
    named, orphan, young = (secrets.put(Secret(v)) for v in ("named-value", "orphan-value", "young-value"))
    store = Store.open(home)
    task = read_task("secrets: {A: null}\nservice: {replicas: 1}\nrun: x\n", "t.yaml")
    store.create_service("svc", task, 30001, 0.0, inputs=BoundInputs(secrets=(("A", named),)))
    assert store.find_needed_secrets() == {named}
    old = time.time() - 7200
    for digest in (named, orphan):
        os.utime(home / "secrets" / digest, (old, old))
    assert secrets.collect(store.find_needed_secrets(), older_than=time.time() - 3600) == 1
    store.close()
    assert sorted(p.name for p in (home / "secrets").iterdir()) == sorted([".key", named, young])


# --- everyday verbs -----------------------------------------------------------------------------------------
def test_status_endpoint_prints_only_the_url(cli: Cli, home: Path, tmp_path: Path) -> None:
    assert up(cli, write(tmp_path, PLAIN))[0] == 0
    code, stdout, _ = cli("serve", "status", "svc", "--endpoint")
    assert code == 0 and stdout.strip().startswith("http://127.0.0.1:") and len(stdout.splitlines()) == 1
    code, _, stderr = cli("serve", "status", "--endpoint")
    assert code == 2 and "name exactly one service" in stderr
    code, _, stderr = cli("serve", "status", "nope", "--endpoint")
    assert code == 1 and "no service named 'nope'" in stderr


def test_down_takes_patterns_and_says_its_for_one(cli: Cli, home: Path, tmp_path: Path) -> None:
    for name in ("dev-a", "dev-b", "prod"):
        assert cli("serve", "up", write(tmp_path, PLAIN), "-n", name, "--no-wait")[0] == 0
    code, stdout, stderr = cli("serve", "down", "dev-*", input="n\n")
    assert code == 1 and "Take down dev-a, dev-b? Their replicas will be terminated." in stdout + stderr
    code, stdout, stderr = cli("serve", "down", "prod", input="n\n")
    assert "Take down prod? Its replicas will be terminated." in stdout + stderr
    code, _, stderr = cli("serve", "down", "staging-*", "-y")
    assert code == 1 and "no service matches 'staging-*'" in stderr
    code, _, stderr = cli("serve", "down", "-a", "dev-a")
    assert code == 2 and "not both" in stderr
    assert services(home) == ["dev-a", "dev-b", "prod"]  # nothing was taken down


def test_match_service_names_keeps_the_services_order_and_names_what_is_missing() -> None:
    from skyserve_lite.api import match_service_names
    from skyserve_lite.errors import NotFoundError

    names = ["api", "dev-a", "dev-b", "web-1"]
    assert match_service_names(["web-?", "dev-*"], names) == ["dev-a", "dev-b", "web-1"]
    assert match_service_names(["api", "api", "d*-a"], names) == ["api", "dev-a"]
    with pytest.raises(NotFoundError, match="no service named 'nope'"):
        match_service_names(["nope"], names)


def test_up_help_says_yes_is_accepted_for_symmetry(cli: Cli) -> None:
    code, stdout, _ = cli("serve", "up", "--help")
    assert code == 0 and "Accepted for symmetry" in stdout and "Do not ask for confirmation" not in stdout


def test_ctrl_c_while_up_waits_says_what_goes_on_and_exits_130(home: Path, tmp_path: Path) -> None:
    class Interrupted(LocalController):
        def get_status(self, names: Sequence[str] = (), *, events: int = 10) -> list[ServiceView]:
            raise KeyboardInterrupt  # what Ctrl-C raises in the wait loop

    cli = Cli(Interrupted(home, FakeClock(), start_daemon=False))
    code, _, stderr = cli("serve", "up", write(tmp_path, PLAIN), "-n", "svc")
    assert code == 130
    assert "Stopped waiting; the controller keeps starting svc" in stderr and "serve down svc` cancels" in stderr
    assert services(home) == ["svc"]  # the service was submitted and stays


def test_up_dry_run_plans_a_cloud_whose_library_is_not_installed_and_says_so(
        cli: Cli, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("skyserve_lite.providers.available_clouds", lambda: ("local",))
    code, stdout, stderr = cli("serve", "up", write(tmp_path, PLAIN), "--dry-run", "--infra", "aws/us-east-1")
    assert code == 0, stderr
    assert "m6i.2xlarge (us-east-1, $0.38/h, on-demand)" in stdout  # SkyPilot's default: 8 vCPUs, 32 GiB
    assert "Note: cloud 'aws' is not available here" in stdout and "without --dry-run needs it" in stdout
    code, _, stderr = up(cli, write(tmp_path, PLAIN), "--infra", "aws/us-east-1")  # for real: refused
    assert code == 2 and "resources.cloud: cloud 'aws' is not available here" in stderr


def test_endpoint_port_pins_the_port_or_is_refused_at_once(cli: Cli, home: Path, tmp_path: Path) -> None:
    import socket

    from skyserve_lite.procs import find_free_port

    port = find_free_port()
    code, stdout, stderr = cli("serve", "up", write(tmp_path, PLAIN), "-n", "svc", "--no-wait",
                               "--endpoint-port", str(port))
    assert code == 0, stderr
    assert f"http://127.0.0.1:{port}" in stdout
    store = Store.open(home)
    service = store.get_service("svc")
    store.close()
    assert service.lb_port == port and service.lb_port_pinned
    code, _, stderr = cli("serve", "up", write(tmp_path, PLAIN), "-n", "other", "--no-wait", "--endpoint-port",
                          str(port))
    assert code == 1 and f"--endpoint-port {port}: the port is the endpoint of another service" in stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        code, _, stderr = cli("serve", "up", write(tmp_path, PLAIN), "-n", "other", "--no-wait",
                              "--endpoint-port", str(busy))
    assert code == 1 and f"--endpoint-port {busy}: the port is taken on this host; choose another" in stderr
    code, _, stderr = cli("serve", "up", write(tmp_path, PLAIN), "-n", "other", "--endpoint-port", "70000")
    assert code == 2 and "--endpoint-port" in stderr
    assert services(home) == ["svc"]


def test_status_events_shows_as_many_events_as_asked(cli: Cli, home: Path, tmp_path: Path) -> None:
    assert up(cli, write(tmp_path, PLAIN))[0] == 0
    store = Store.open(home)
    store.add_events([(float(i), "svc", None, "service", f"event number {i}") for i in range(1, 31)])
    store.close()
    code, stdout, _ = cli("serve", "status", "svc", "-o", "json", "--events", "25")
    assert code == 0
    messages = [e["message"] for e in json.loads(stdout)["services"][0]["events"]]
    assert len(messages) == 25 and messages[-1] == "event number 30"
    assert len(json.loads(cli("serve", "status", "svc", "-o", "json")[1])["services"][0]["events"]) == 10
    assert json.loads(cli("serve", "status", "svc", "-o", "json", "--events", "0")[1])["services"][0]["events"] == []
    code, stdout, _ = cli("serve", "status", "svc", "--events", "3")
    assert "event number 30" in stdout and "event number 27" not in stdout
