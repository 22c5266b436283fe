"""EC2 user data for one launch batch: a cloud-init bash script.

The script, run once as root on first boot by cloud-init:

1. finds its replica id: the batch's replica ids are embedded as a list, and the instance's position in
   its ``RunInstances`` call comes from the metadata service (``ami-launch-index``, IMDSv2);
2. writes ``/opt/sky-lite/env.sh`` (the task's ``envs`` plus ``PORT``, ``SKY_LITE_REPLICA_ID`` and
   ``SKY_LITE_SERVICE``) and the task's ``setup`` and ``run`` as files;
3. fetches ``workdir`` into ``/opt/sky-lite/workdir`` and every ``file_mounts`` entry to its destination
   with the AWS CLI, using the instance's own role (no credential is ever written into user data);
4. runs ``setup`` in the workdir; if it fails the instance powers itself off, so the controller sees it
   stopped instead of waiting for a readiness probe that cannot succeed;
5. installs ``run`` as the systemd unit ``sky-lite-replica`` that restarts it whenever it exits.

Its output goes where cloud-init sends it: ``/var/log/cloud-init-output.log`` and the console. The script
holds what the instance needs and nothing else: every byte counts against EC2's 16 KB.

Everything here is pure: values in, text out.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from skyserve_lite.spec.model import Pairs

# EC2 refuses user data above 16 KB (before its base64 encoding).
USER_DATA_LIMIT_BYTES = 16 * 1024
BOOT_ROOT = "/opt/sky-lite"
WORKDIR = f"{BOOT_ROOT}/workdir"
UNIT_NAME = "sky-lite-replica"


@dataclass(frozen=True)
class BootBatch:
    """What the boot script of one launch batch needs: whose instances they are and what they run.

    ``replica_ids[i]`` is the replica id of the instance with launch index ``i``; ``port`` is the service
    port ``run`` listens on (``$PORT``).
    """

    service: str
    version: int
    replica_ids: tuple[int, ...]
    envs: Pairs
    setup: str | None
    run: str
    port: int


@dataclass(frozen=True)
class Fetch:
    """One thing to copy from S3 at boot.

    ``is_dir`` None means "not known" (a user's own ``s3://`` source): the script tries a single object
    first, then the prefix.
    """

    source: str  # s3://bucket/key, or s3://bucket/prefix/ for a directory
    destination: str  # an absolute path on the instance
    is_dir: bool | None


def render_user_data(batch: BootBatch, fetches: Sequence[Fetch] = ()) -> str:
    """The cloud-init script for one launch batch. See the module docstring for what it does.

    ``fetches`` are copied in order, so a file mount into the workdir lands after the workdir itself.
    """
    env_lines = [f"export {key}={shlex.quote(value)}" for key, value in batch.envs]
    env_lines.append(f"export PORT={batch.port}")
    env_lines.append(f"export SKY_LITE_SERVICE={shlex.quote(batch.service)}")
    lines = [
        "#!/bin/bash",
        f"# sky-lite replica bootstrap: service {batch.service}, version {batch.version}, "
        f"replicas {_id_list(batch.replica_ids)}",
        "set -Eeuo pipefail",
        f"fail() {{ echo \"sky-lite: $1\" >&2; echo \"$1\" > {BOOT_ROOT}/failed; shutdown -h now; exit 1; }}",
        "trap 'fail \"bootstrap failed at line $LINENO\"' ERR",
        f"mkdir -p {WORKDIR}",
        f"cd {BOOT_ROOT}",
        f"replica_ids={_id_list(batch.replica_ids)}",
        "imds=http://169.254.169.254/latest",
        "imds_token=$(curl -fsS -X PUT \"$imds/api/token\" -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')",
        "launch_index=$(curl -fsS -H \"X-aws-ec2-metadata-token: $imds_token\" "
        "\"$imds/meta-data/ami-launch-index\")",
        "replica_id=$(echo \"$replica_ids\" | cut -d, -f\"$((launch_index + 1))\")",
        "[ -n \"$replica_id\" ] || fail \"no replica id for launch index $launch_index\"",
        _write_file(f"{BOOT_ROOT}/env.sh", "\n".join(env_lines) + "\n"),
        f"echo \"export SKY_LITE_REPLICA_ID=$replica_id\" >> {BOOT_ROOT}/env.sh",
        _write_file(f"{BOOT_ROOT}/setup.sh", batch.setup or ""),
        _write_file(f"{BOOT_ROOT}/run.sh", batch.run),
    ]
    if fetches:
        lines.append("fetch() {  # source destination kind(file|dir|any)")
        lines.append("  mkdir -p \"$(dirname \"$2\")\"")
        lines.append("  if [ \"$3\" = dir ]; then aws s3 cp --recursive --only-show-errors \"$1\" \"$2\"; return; fi")
        lines.append("  if [ \"$3\" = file ]; then aws s3 cp --only-show-errors \"$1\" \"$2\"; return; fi")
        lines.append("  aws s3 cp --only-show-errors \"$1\" \"$2\" 2>/dev/null "
                     "|| aws s3 cp --recursive --only-show-errors \"$1\" \"$2\"")
        lines.append("}")
        for fetch in fetches:
            kind = "any" if fetch.is_dir is None else ("dir" if fetch.is_dir else "file")
            lines.append(f"fetch {shlex.quote(fetch.source)} {shlex.quote(fetch.destination)} {kind}")
    lines += [
        f"cd {WORKDIR}",
        f"if ! (. {BOOT_ROOT}/env.sh && bash {BOOT_ROOT}/setup.sh); then fail \"setup failed\"; fi",
        f"cat > /etc/systemd/system/{UNIT_NAME}.service <<'UNIT'",
        "[Unit]",
        "Description=sky-lite replica",
        "After=network-online.target",
        "Wants=network-online.target",
        "[Service]",
        f"WorkingDirectory={WORKDIR}",
        f"ExecStart=/bin/bash -c '. {BOOT_ROOT}/env.sh && exec /bin/bash {BOOT_ROOT}/run.sh'",
        "Restart=always",
        # 5 s between restarts: a crashing `run` costs at most 12 starts a minute, not a busy loop.
        "RestartSec=5",
        "[Install]",
        "WantedBy=multi-user.target",
        "UNIT",
        "systemctl daemon-reload",
        f"systemctl enable --now {UNIT_NAME}.service",
    ]
    return "\n".join(lines) + "\n"


def find_mount_destination(destination: str) -> str:
    """Where a ``file_mounts`` destination lands on the instance: absolute paths as given, ``~`` is root's
    home (the bootstrap and the unit run as root), relative paths below the workdir."""
    if destination == "~" or destination.startswith("~/"):
        return "/root" + destination[1:]
    if destination.startswith("/"):
        return destination
    return f"{WORKDIR}/{destination}"


def _write_file(path: str, content: str) -> str:
    # base64 keeps any text, quotes and heredoc markers included, out of the shell's reach.
    encoded = base64.b64encode(content.encode()).decode("ascii")
    return f"echo {encoded} | base64 -d > {path}"


def _id_list(replica_ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in replica_ids)

