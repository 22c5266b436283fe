"""The boot script run whole under bash, in a sandbox: who runs `setup` and `run`, and how secrets reach them.

Every command that reaches outside (the metadata service, the clouds' CLIs, user creation, ``runuser``,
``chown``, ``systemctl``, ``shutdown``) is a stub on ``PATH`` that records its arguments; the script's
absolute paths are moved into the sandbox. ``runuser`` runs its command after recording it (the sandbox
cannot become another user: the test checks that the script asks to), and ``setup`` itself records the
environment it got.
"""

from __future__ import annotations

import base64
import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from skyserve_lite.providers.aws_userdata import AWS_BOOT
from skyserve_lite.providers.boot_script import (
    BOOT_ROOT,
    UNIT_DIR,
    UNIT_NAME,
    WORKLOAD_HOME,
    BootBatch,
    BootCloud,
    render_boot_script,
)
from skyserve_lite.providers.gcp import GCP_BOOT

ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:sky-lite_ctl1_svc_0123abcd-AbCdEf"
GCP_SECRET = "sky-lite_ctl1_svc_0123abcd"
# Each would run a command or lose a byte if the value were handled as shell text or a plain command
# substitution: quotes, expansions, a newline inside and one at the end, a backslash, UTF-8.
HOSTILE = "it's \"$(touch ran)\" `touch ran` $HOME\nsecond line\\ é\n"
DUMP_ENV = f"{shlex.quote(sys.executable)} -c 'import json, os; print(json.dumps(dict(os.environ)))' > setup-env.json"


@dataclass(frozen=True)
class Booted:
    """What one run of the script left: its exit code and output, the stubs' records, the sandbox."""

    returncode: int
    stderr: str
    calls: list[str]
    root: Path

    @property
    def setup_env(self) -> dict[str, str]:
        return dict(json.loads((self.root / "boot" / "workdir" / "setup-env.json").read_text()))

    def file(self, path: str) -> Path:
        return self.root / relocate(path).lstrip("/")


MOVED = ((BOOT_ROOT, "/boot"), (UNIT_DIR, "/units"), (WORKLOAD_HOME, "/home-sky"), ("/snap/bin", "/snap-bin"))
# The only programs the sandbox's PATH has besides the stubs: what the script and the stubs run.
TOOLS = ("bash", "mkdir", "cat", "tr", "cut", "base64", "dirname", "chmod", "ln", "cp")


def relocate(path: str) -> str:
    """Where the sandbox puts an absolute path the script names."""
    for real, moved in MOVED:
        if path.startswith(real):
            return moved + path[len(real):]
    return path


STUBS = {
    # The metadata services: EC2's token and launch index, GCE's instance name.
    "curl": 'case "$*" in *api/token*) echo tok ;; *ami-launch-index*) echo 0 ;; '
            '*instance/name*) echo sky-ctl1-0123abcd-r4 ;; *) exit 22 ;; esac',
    # `aws secretsmanager get-secret-value --region R --secret-id ARN --query SecretBinary --output text`
    "aws": 'f="$STORE/$(printf %s "$6" | tr /: __)"; '
           '[ -f "$f" ] || { echo "ResourceNotFoundException" >&2; exit 254; }; cat "$f"',
    # `gcloud secrets versions access latest --secret=NAME --format=get(payload.data)`: URL-safe base64
    "gcloud": 'f="$STORE/${5#--secret=}"; [ -f "$f" ] || { echo "NOT_FOUND" >&2; exit 1; }; tr "/+" "_-" < "$f"',
    "id": "exit 1",  # no user `sky` yet
    "useradd": "exit 0",
    "runuser": 'shift 3; exec "$@"',  # -u sky -- COMMAND...
    "chown": "exit 0",
    "systemctl": "exit 0",
    "shutdown": "exit 0",
    # `snap install aws-cli --classic`: puts the CLI where snaps go.
    "snap": 'cp "$SPARE/aws" "$SNAP_BIN/aws"',
}


def boot(tmp_path: Path, cloud: BootCloud, batch: BootBatch, secrets: Mapping[str, str],
         missing: tuple[str, ...] = ()) -> Booted:
    """Run ``cloud``'s boot script of ``batch`` in a sandbox whose secret store holds ``secrets`` (by
    reference), without the stubs named in ``missing`` (kept aside for ``snap`` to install)."""
    stubs, store, spare = tmp_path / "bin", tmp_path / "store", tmp_path / "spare"
    for directory in (stubs, store, spare, tmp_path / "units", tmp_path / "home-sky", tmp_path / "snap-bin"):
        directory.mkdir(parents=True)
    log = tmp_path / "calls.log"
    for name, body in STUBS.items():
        stub = (spare if name in missing else stubs) / name
        stub.write_text(f'#!/bin/bash\necho "{name} $*" >> {shlex.quote(str(log))}\n{body}\n')
        stub.chmod(0o755)
    for tool in TOOLS:
        found = shutil.which(tool, path="/usr/bin:/bin")
        assert found is not None, tool
        (stubs / tool).symlink_to(found)
    for reference, value in secrets.items():
        key = reference.replace("/", "_").replace(":", "_")
        (store / key).write_text(base64.b64encode(value.encode()).decode() + "\n")
    script = render_boot_script(cloud, batch)
    for real, _ in MOVED:
        script = script.replace(real, f"{tmp_path}{relocate(real)}")
    env = {"PATH": str(stubs), "STORE": str(store), "SPARE": str(spare), "SNAP_BIN": str(tmp_path / "snap-bin"),
           "HOME": str(tmp_path)}
    done = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    calls = log.read_text().splitlines() if log.exists() else []
    return Booted(done.returncode, done.stderr, calls, tmp_path)


def batch(**fields: object) -> BootBatch:
    values: dict[str, object] = {"service": "svc", "version": 1, "replica_ids": (4,), "envs": (("MODEL", "small"),),
                                 "setup": DUMP_ENV, "run": "serve", "port": 8080}
    values.update(fields)
    return BootBatch(**values)  # type: ignore[arg-type]


CLOUDS = [pytest.param(AWS_BOOT, ARN, id="aws"), pytest.param(GCP_BOOT, GCP_SECRET, id="gcp")]


@pytest.mark.parametrize(("cloud", "reference"), CLOUDS)
def test_setup_and_run_run_as_the_sky_user_with_the_secret_in_their_environment(
        tmp_path: Path, cloud: BootCloud, reference: str) -> None:
    booted = boot(tmp_path, cloud, batch(secrets=(("TOKEN", reference),)), {reference: HOSTILE})

    assert booted.returncode == 0, booted.stderr
    assert f"useradd --create-home --home-dir {tmp_path}/home-sky --user-group --shell /bin/bash sky" in booted.calls
    setup = next(c for c in booted.calls if c.startswith("runuser"))
    assert setup == f"runuser -u sky -- /bin/bash {tmp_path}/boot/setup.sh"
    env = booted.setup_env
    assert env["TOKEN"] == HOSTILE  # every byte, the trailing newline too
    assert (env["MODEL"], env["PORT"], env["SKY_LITE_REPLICA_ID"]) == ("small", "8080", "4")
    assert not (tmp_path / "boot" / "workdir" / "ran").exists() and not (tmp_path / "ran").exists()
    unit = booted.file(f"{UNIT_DIR}/{UNIT_NAME}.service").read_text()
    assert (f"ExecStart=/bin/bash -c '. {tmp_path}/boot/env.sh && . {tmp_path}/boot/secrets.sh && "
            f"exec runuser -u sky -- /bin/bash {tmp_path}/boot/run.sh'") in unit.splitlines()
    # The workdir and the home are the workload's; nothing else is given away.
    assert [c for c in booted.calls if c.startswith("chown")] == [
        f"chown -R sky: {tmp_path}/boot/workdir {tmp_path}/home-sky"]


@pytest.mark.parametrize(("cloud", "reference"), CLOUDS)
def test_the_secrets_file_is_roots_alone_and_the_environment_file_holds_no_secret(
        tmp_path: Path, cloud: BootCloud, reference: str) -> None:
    booted = boot(tmp_path, cloud, batch(secrets=(("TOKEN", reference),)), {reference: "s3cr3t-value"})

    assert booted.returncode == 0, booted.stderr
    secrets, env = booted.file(f"{BOOT_ROOT}/secrets.sh"), booted.file(f"{BOOT_ROOT}/env.sh")
    assert secrets.stat().st_mode & 0o777 == 0o600 and env.stat().st_mode & 0o777 == 0o600
    assert secrets.read_text() == "export TOKEN=s3cr3t-value\n"
    assert "s3cr3t-value" not in env.read_text() and "TOKEN" not in env.read_text()


def test_aws_asks_the_region_the_secrets_arn_names(tmp_path: Path) -> None:
    booted = boot(tmp_path, AWS_BOOT, batch(secrets=(("TOKEN", ARN),)), {ARN: "v"})
    assert booted.returncode == 0, booted.stderr
    assert (f"aws secretsmanager get-secret-value --region eu-west-1 --secret-id {ARN} --query SecretBinary "
            "--output text") in booted.calls


@pytest.mark.parametrize(("cloud", "reference"), CLOUDS)
def test_a_secret_the_instance_cannot_read_fails_the_boot_before_setup(tmp_path: Path, cloud: BootCloud,
                                                                       reference: str) -> None:
    booted = boot(tmp_path, cloud, batch(secrets=(("TOKEN", reference),)), {})

    assert booted.returncode != 0
    failed = booted.file(f"{BOOT_ROOT}/failed").read_text()
    assert failed == f"cannot read the secret TOKEN ({reference}) with this instance's identity\n"
    assert "shutdown -h now" in booted.calls
    assert not (tmp_path / "boot" / "workdir" / "setup-env.json").exists()


def test_run_as_root_runs_setup_and_run_as_root_and_makes_no_user(tmp_path: Path) -> None:
    booted = boot(tmp_path, AWS_BOOT, batch(run_as_root=True, secrets=(("TOKEN", ARN),)), {ARN: "v"})

    assert booted.returncode == 0, booted.stderr
    assert not [c for c in booted.calls if c.split()[0] in ("useradd", "runuser", "chown")]
    assert booted.setup_env["TOKEN"] == "v"
    unit = booted.file(f"{UNIT_DIR}/{UNIT_NAME}.service").read_text()
    assert f"exec /bin/bash {tmp_path}/boot/run.sh'" in unit


def test_a_script_without_secrets_or_files_needs_no_cloud_cli(tmp_path: Path) -> None:
    booted = boot(tmp_path, AWS_BOOT, batch(), {})
    assert booted.returncode == 0, booted.stderr
    assert not [c for c in booted.calls if c.split()[0] in ("aws", "snap")]
    assert booted.file(f"{BOOT_ROOT}/secrets.sh").read_text() == ""


def test_aws_installs_its_cli_from_snap_when_the_image_has_none(tmp_path: Path) -> None:
    # Ubuntu's AMIs, the default image, come without the AWS CLI.
    booted = boot(tmp_path, AWS_BOOT, batch(secrets=(("TOKEN", ARN),)), {ARN: "v"}, missing=("aws",))
    assert booted.returncode == 0, booted.stderr
    assert booted.calls.index("snap install aws-cli --classic") < next(
        i for i, c in enumerate(booted.calls) if c.startswith("aws secretsmanager"))
    assert booted.setup_env["TOKEN"] == "v"


def test_aws_fails_the_boot_saying_so_when_no_cli_can_be_had(tmp_path: Path) -> None:
    booted = boot(tmp_path, AWS_BOOT, batch(secrets=(("TOKEN", ARN),)), {ARN: "v"}, missing=("aws", "snap"))
    assert booted.returncode != 0
    assert booted.file(f"{BOOT_ROOT}/failed").read_text() == "this image has no AWS CLI, and snap cannot install it\n"
