"""The boot script run whole under bash, in a sandbox: who runs `setup` and `run`, how secrets reach them, how
the workload user is kept from the metadata service, and what a later boot does (nothing in the workload's
tree).

Every command that reaches outside (the metadata service, the clouds' CLIs, user creation, ``runuser``,
``chown``, ``iptables``, ``systemctl``, ``shutdown``) is a stub on ``PATH`` that records its arguments; the
script's absolute paths are moved into the sandbox. ``runuser`` runs its command after recording it (the
sandbox cannot become another user: the test checks that the script asks to), and ``setup`` itself records
the environment it got. ``iptables`` keeps its rules in a file, which a reboot empties; the clouds' copy
commands copy from a folder that stands for the bucket.
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

from skyserve_lite.files.manifest import EntryKind, ManifestEntry
from skyserve_lite.providers.aws_userdata import AWS_BOOT
from skyserve_lite.providers.boot_script import (
    BOOT_ROOT,
    BOOTED_MARKER,
    GUARD_NAME,
    GUARD_SCRIPT,
    STATE_DIR,
    UNIT_DIR,
    UNIT_NAME,
    WORKDIR,
    WORKLOAD_HOME,
    BootBatch,
    BootCloud,
    Placement,
    StagedFiles,
    render_boot_script,
    render_file_list,
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


MOVED = ((BOOT_ROOT, "/boot"), (UNIT_DIR, "/units"), (WORKLOAD_HOME, "/home-sky"), ("/snap/bin", "/snap-bin"),
         (STATE_DIR, "/var-lib"))
# The only programs the sandbox's PATH has besides the stubs: what the script and the stubs run.
TOOLS = ("bash", "mkdir", "cat", "tr", "cut", "base64", "dirname", "chmod", "ln", "cp")
# Every rule a root `iptables` would insert: the workload user (any uid but root's) gets no TCP to the address
# but DNS.
RULE = "OUTPUT -d {} -p tcp ! --dport 53 -m owner ! --uid-owner 0 -j REJECT"
# `iptables -w -C RULE` / `-w -I RULE`, over a file of rules per tool.
IPTABLES = ('f="$RULES/${0##*/}"; rule="${*:3}"; case "$2" in '
            '-C) [ -f "$f" ] && while IFS= read -r line; do [ "$line" = "$rule" ] && exit 0; done < "$f"; exit 1 ;; '
            '-I) echo "$rule" >> "$f" ;; *) exit 2 ;; esac')


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
    # `aws secretsmanager get-secret-value --region R --secret-id ARN --query SecretBinary --output text`;
    # `aws s3 cp --only-show-errors s3://B/KEY DST`
    "aws": 'if [ "$1" = s3 ]; then cp "$BUCKET/${4#s3://}" "$5"; exit; fi; f="$STORE/$(printf %s "$6" | tr /: __)"; '
           '[ -f "$f" ] || { echo "ResourceNotFoundException" >&2; exit 254; }; cat "$f"',
    # `gcloud secrets versions access latest --secret=NAME --format=get(payload.data)`: URL-safe base64;
    # `gcloud storage cp --quiet gs://B/KEY DST`
    "gcloud": 'if [ "$1" = storage ]; then cp "$BUCKET/${4#gs://}" "$5"; exit; fi; '
              'f="$STORE/${5#--secret=}"; [ -f "$f" ] || { echo "NOT_FOUND" >&2; exit 1; }; tr "/+" "_-" < "$f"',
    "id": "exit 1",  # no user `sky` yet
    "useradd": "exit 0",
    "runuser": 'shift 3; exec "$@"',  # -u sky -- COMMAND...
    # The workload gets its tree only once the marker says a later boot must leave that tree alone.
    "chown": '[ -e "$MARKER" ] || { echo "chown before the first-boot marker" >&2; exit 1; }',
    "iptables": IPTABLES,
    "ip6tables": IPTABLES,
    "systemctl": "exit 0",
    "shutdown": "exit 0",
    # `snap install aws-cli --classic`: puts the CLI where snaps go.
    "snap": 'cp "$SPARE/aws" "$SNAP_BIN/aws"',
}


def make_sandbox(tmp_path: Path, secrets: Mapping[str, str], missing: tuple[str, ...] = (),
                 stubs: Mapping[str, str] | None = None) -> Path:
    """A sandbox whose secret store holds ``secrets`` (by reference), without the stubs named in ``missing``
    (kept aside for ``snap`` to install), with ``stubs`` in place of the usual ones of those names."""
    bin_dir, store, spare = tmp_path / "bin", tmp_path / "store", tmp_path / "spare"
    for directory in (bin_dir, store, spare, tmp_path / "units", tmp_path / "home-sky", tmp_path / "snap-bin",
                      tmp_path / "bucket", tmp_path / "rules"):
        directory.mkdir(parents=True)
    log = tmp_path / "calls.log"
    for name, body in {**STUBS, **(stubs or {})}.items():
        stub = (spare if name in missing else bin_dir) / name
        stub.write_text(f'#!/bin/bash\necho "{name} $*" >> {shlex.quote(str(log))}\n{body}\n')
        stub.chmod(0o755)
    for tool in TOOLS:
        found = shutil.which(tool, path="/usr/bin:/bin")
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    for reference, value in secrets.items():
        key = reference.replace("/", "_").replace(":", "_")
        (store / key).write_text(base64.b64encode(value.encode()).decode() + "\n")
    return tmp_path


def in_sandbox(root: Path, text: str) -> str:
    """``text`` (a script, a file list) with the absolute paths it names moved into the sandbox."""
    for real, _ in MOVED:
        text = text.replace(real, f"{root}{relocate(real)}")
    return text


def run_boot(root: Path, cloud: BootCloud, batch: BootBatch, files: StagedFiles | None = None) -> Booted:
    """Run ``cloud``'s boot script of ``batch`` in the sandbox ``root``; the calls are this run's only."""
    log = root / "calls.log"
    log.unlink(missing_ok=True)
    env = {"PATH": str(root / "bin"), "STORE": str(root / "store"), "SPARE": str(root / "spare"),
           "SNAP_BIN": str(root / "snap-bin"), "HOME": str(root), "BUCKET": str(root / "bucket"),
           "RULES": str(root / "rules"), "MARKER": in_sandbox(root, BOOTED_MARKER)}
    script = in_sandbox(root, render_boot_script(cloud, batch, files=files))
    done = subprocess.run(["bash", "-c", script], env=env, cwd=root, capture_output=True, text=True,
                          timeout=60, check=False)
    calls = log.read_text().splitlines() if log.exists() else []
    return Booted(done.returncode, done.stderr, calls, root)


def reboot(root: Path) -> None:
    """What a reboot loses: the firewall's rules."""
    for rules in (root / "rules").iterdir():
        rules.unlink()


def boot(tmp_path: Path, cloud: BootCloud, batch: BootBatch, secrets: Mapping[str, str],
         missing: tuple[str, ...] = (), stubs: Mapping[str, str] | None = None) -> Booted:
    """One first boot of ``cloud``'s script of ``batch`` in a new sandbox (``make_sandbox``)."""
    return run_boot(make_sandbox(tmp_path, secrets, missing, stubs), cloud, batch)


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


# --- the instance metadata service -----------------------------------------------------------------------------
METADATA_V4 = "169.254.169.254"
METADATA_V6 = ("fd00:ec2::254", "fd20:ce::254")  # EC2's and Compute Engine's IPv6 endpoints


def rules(root: Path, tool: str) -> list[str]:
    path = root / "rules" / tool
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize(("cloud", "reference"), CLOUDS)
def test_only_root_reaches_the_metadata_service_once_roots_own_reads_are_done(
        tmp_path: Path, cloud: BootCloud, reference: str) -> None:
    booted = boot(tmp_path, cloud, batch(secrets=(("TOKEN", reference),)), {reference: "v"})

    assert booted.returncode == 0, booted.stderr
    assert rules(tmp_path, "iptables") == [RULE.format(METADATA_V4)]
    assert rules(tmp_path, "ip6tables") == [RULE.format(address) for address in METADATA_V6]
    insert = f"iptables -w -I {RULE.format(METADATA_V4)}"
    last_read = max(i for i, c in enumerate(booted.calls) if c.split()[0] in ("curl", "aws", "gcloud"))
    setup = next(i for i, c in enumerate(booted.calls) if c.startswith("runuser"))
    assert last_read < booted.calls.index(insert) < setup
    assert booted.file(GUARD_SCRIPT).stat().st_mode & 0o777 == 0o600  # root's alone; run as `bash guard.sh`
    # At every later boot, before the network is up and before the workload's unit, which needs it.
    guard_unit = booted.file(f"{UNIT_DIR}/{GUARD_NAME}.service").read_text().splitlines()
    assert f"ExecStart=/bin/bash {tmp_path}/boot/guard.sh" in guard_unit
    assert f"Before=network-pre.target {UNIT_NAME}.service" in guard_unit and "DefaultDependencies=no" in guard_unit
    unit = booted.file(f"{UNIT_DIR}/{UNIT_NAME}.service").read_text().splitlines()
    assert {f"Requires={GUARD_NAME}.service", f"After={GUARD_NAME}.service"} <= set(unit)
    assert f"systemctl enable {GUARD_NAME}.service" in booted.calls


def test_the_guard_adds_each_rule_once_however_often_it_runs(tmp_path: Path) -> None:
    booted = boot(tmp_path, AWS_BOOT, batch(), {})
    assert booted.returncode == 0, booted.stderr
    env = {"PATH": str(tmp_path / "bin"), "RULES": str(tmp_path / "rules")}
    for _ in range(2):  # a restart of the unit, the guard run again by hand
        subprocess.run(["bash", str(booted.file(GUARD_SCRIPT))], env=env, check=True, timeout=30)
    assert rules(tmp_path, "iptables") == [RULE.format(METADATA_V4)]
    assert len(rules(tmp_path, "ip6tables")) == len(METADATA_V6)


def test_without_iptables_the_boot_says_so_and_goes_on(tmp_path: Path) -> None:
    booted = boot(tmp_path, AWS_BOOT, batch(), {}, missing=("iptables", "ip6tables"))
    assert booted.returncode == 0, booted.stderr
    assert ("sky-lite: warning: no iptables: the workload user can reach the instance metadata service and this "
            "instance's credentials") in booted.stderr.splitlines()
    assert booted.setup_env["PORT"] == "8080"  # setup ran


def test_an_iptables_that_refuses_the_rule_fails_the_boot_before_the_workload_runs(tmp_path: Path) -> None:
    booted = boot(tmp_path, GCP_BOOT, batch(), {}, stubs={"iptables": "exit 4"})
    assert booted.returncode != 0
    assert booted.file(f"{BOOT_ROOT}/failed").read_text() == "cannot keep the workload user from the metadata service\n"
    assert not [c for c in booted.calls if c.split()[0] in ("runuser", "chown")]
    assert not booted.file(BOOTED_MARKER).exists()


def test_a_workload_run_as_root_keeps_the_metadata_service(tmp_path: Path) -> None:
    booted = boot(tmp_path, AWS_BOOT, batch(run_as_root=True), {})
    assert booted.returncode == 0, booted.stderr
    assert not [c for c in booted.calls if c.split()[0] in ("iptables", "ip6tables")]
    assert not booted.file(f"{UNIT_DIR}/{GUARD_NAME}.service").exists()
    assert GUARD_NAME not in booted.file(f"{UNIT_DIR}/{UNIT_NAME}.service").read_text()


# --- later boots ---------------------------------------------------------------------------------------------
DIGEST = "d" * 64


def stage_files(root: Path, scheme: str) -> StagedFiles:
    """A snapshot in the sandbox's bucket: the workdir's ``data/`` (0755) with a file in it, and ``app.py``."""
    entries = [(ManifestEntry("data", EntryKind.DIR, 0o755), f"{WORKDIR}/data"),
               (ManifestEntry("data/model.bin", EntryKind.FILE, 0o644, 5, DIGEST), f"{WORKDIR}/data/model.bin"),
               (ManifestEntry("app.py", EntryKind.FILE, 0o644, 5, DIGEST), f"{WORKDIR}/app.py")]
    file_list = render_file_list([Placement("workdir", entry, path) for entry, path in entries])
    (root / "bucket" / "b" / "files").mkdir(parents=True)
    (root / "bucket" / "b" / "blobs").mkdir()
    (root / "bucket" / "b" / "files" / "list.tsv").write_text(in_sandbox(root, file_list))
    (root / "bucket" / "b" / "blobs" / DIGEST).write_text("blob\n")
    return StagedFiles(file_list=f"{scheme}://b/files/list.tsv", blobs=f"{scheme}://b/blobs/")


@pytest.mark.parametrize(("cloud", "scheme"), [pytest.param(AWS_BOOT, "s3", id="aws"),
                                               pytest.param(GCP_BOOT, "gs", id="gcp")])
def test_a_later_boot_touches_nothing_through_links_the_workload_planted(
        tmp_path: Path, cloud: BootCloud, scheme: str) -> None:
    root = make_sandbox(tmp_path, {})
    files = stage_files(root, scheme)
    first = run_boot(root, cloud, batch(), files)
    assert first.returncode == 0, first.stderr
    workdir = root / "boot" / "workdir"
    assert (workdir / "data" / "model.bin").read_text() == "blob\n"
    assert first.file(BOOTED_MARKER).exists() and first.file(STATE_DIR).stat().st_mode & 0o777 == 0o700
    # What the workload, owning its workdir, could leave for root: links to root's own files.
    victim = root / "root-home"
    victim.mkdir(mode=0o700)
    (victim / "passwd").write_text("root's\n")
    shutil.rmtree(workdir / "data")
    (workdir / "data").symlink_to(victim)
    (workdir / "app.py").unlink()
    (workdir / "app.py").symlink_to(victim / "passwd")
    reboot(root)

    again = run_boot(root, cloud, batch(), files)

    assert again.returncode == 0, again.stderr
    assert victim.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in victim.iterdir()) == ["passwd"]
    assert (victim / "passwd").read_text() == "root's\n"
    # Nothing is written, owned or set up again; the block a reboot lost is back, and the service started.
    assert not [c for c in again.calls if c.split()[0] in ("runuser", "chown", "useradd", "aws", "gcloud")]
    assert rules(root, "iptables") == [RULE.format(METADATA_V4)]
    assert again.calls[-1] == f"systemctl start {UNIT_NAME}.service"


def test_a_later_boot_after_a_first_that_stopped_in_setup_fails_again_without_running_it(tmp_path: Path) -> None:
    root = make_sandbox(tmp_path, {})
    first = run_boot(root, GCP_BOOT, batch(setup="exit 3"), None)
    assert first.returncode != 0 and first.file(f"{BOOT_ROOT}/failed").read_text() == "setup failed\n"

    again = run_boot(root, GCP_BOOT, batch(setup="exit 3"), None)

    assert again.returncode != 0
    assert again.file(f"{BOOT_ROOT}/failed").read_text() == "the first boot did not finish; setup is not run again\n"
    assert not [c for c in again.calls if c.split()[0] in ("runuser", "chown", "systemctl")]
    assert "shutdown -h now" in again.calls
