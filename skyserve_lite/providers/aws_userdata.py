"""EC2 user data for one launch batch: a cloud-init bash script, and the header that describes it.

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

Its output goes where cloud-init sends it: ``/var/log/cloud-init-output.log`` and the console.

The second line is ``# sky-lite-emulation: <base64 JSON>``: what the replica runs, in a form a program
can read back (``decode_emulation_header``) to boot the same replicas somewhere else.

Everything here is pure: values in, text out.
"""

from __future__ import annotations

import base64
import binascii
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from skyserve_lite.spec.model import Pairs

EMULATION_PREFIX = "# sky-lite-emulation: "
# EC2 refuses user data above 16 KB (before its base64 encoding).
USER_DATA_LIMIT_BYTES = 16 * 1024
BOOT_ROOT = "/opt/sky-lite"
WORKDIR = f"{BOOT_ROOT}/workdir"
UNIT_NAME = "sky-lite-replica"

_T = TypeVar("_T")


@dataclass(frozen=True)
class EmulationSpec:
    """What every replica of one launch batch runs; the header of its user data.

    ``replica_ids[i]`` is the replica id of the instance with launch index ``i``.
    """

    service: str
    version: int
    replica_ids: tuple[int, ...]
    envs: Pairs
    setup: str | None
    run: str
    port: int

    def replica_id_for(self, launch_index: int) -> int:
        """The replica id of the instance at ``launch_index``; IndexError if the batch had no such instance."""
        return self.replica_ids[launch_index]


@dataclass(frozen=True)
class Fetch:
    """One thing to copy from S3 at boot.

    ``is_dir`` None means "not known" (a user's own ``s3://`` source): the script tries a single object
    first, then the prefix.
    """

    source: str  # s3://bucket/key, or s3://bucket/prefix/ for a directory
    destination: str  # an absolute path on the instance
    is_dir: bool | None


def encode_emulation_header(spec: EmulationSpec) -> str:
    """The header line (without newline) for ``spec``."""
    document = {
        "service": spec.service,
        "version": spec.version,
        "replica_ids": list(spec.replica_ids),
        "envs": dict(spec.envs),
        "setup": spec.setup,
        "run": spec.run,
        "port": spec.port,
    }
    payload = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    return EMULATION_PREFIX + base64.b64encode(payload).decode("ascii")


def decode_emulation_header(user_data: str) -> EmulationSpec | None:
    """The ``EmulationSpec`` in a user data text; None when it has no header line.

    Raises ``ValueError`` when a header line is present but is not one this module wrote.
    """
    line = next((candidate for candidate in user_data.splitlines() if candidate.startswith(EMULATION_PREFIX)),
                None)
    if line is None:
        return None
    try:
        document = json.loads(base64.b64decode(line[len(EMULATION_PREFIX):], validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"malformed sky-lite emulation header: {exc}") from exc
    if not isinstance(document, dict):
        raise ValueError("malformed sky-lite emulation header: not a JSON object")
    try:
        envs = document["envs"]
        spec = EmulationSpec(
            service=_typed(document["service"], str),
            version=_typed(document["version"], int),
            replica_ids=tuple(_typed(i, int) for i in _typed(document["replica_ids"], list)),
            envs=tuple(sorted((_typed(k, str), _typed(v, str)) for k, v in _typed(envs, dict).items())),
            setup=None if document["setup"] is None else _typed(document["setup"], str),
            run=_typed(document["run"], str),
            port=_typed(document["port"], int),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed sky-lite emulation header: {exc!r}") from exc
    return spec


def render_user_data(spec: EmulationSpec, fetches: Sequence[Fetch] = ()) -> str:
    """The cloud-init script for one launch batch. See the module docstring for what it does.

    ``fetches`` are copied in order, so a file mount into the workdir lands after the workdir itself.
    """
    env_lines = [f"export {key}={shlex.quote(value)}" for key, value in spec.envs]
    env_lines.append(f"export PORT={spec.port}")
    env_lines.append(f"export SKY_LITE_SERVICE={shlex.quote(spec.service)}")
    lines = [
        "#!/bin/bash",
        encode_emulation_header(spec),
        f"# sky-lite replica bootstrap: service {spec.service}, version {spec.version}, "
        f"replicas {_id_list(spec.replica_ids)}",
        "set -Eeuo pipefail",
        f"fail() {{ echo \"sky-lite: $1\" >&2; echo \"$1\" > {BOOT_ROOT}/failed; shutdown -h now; exit 1; }}",
        "trap 'fail \"bootstrap failed at line $LINENO\"' ERR",
        f"mkdir -p {WORKDIR}",
        f"cd {BOOT_ROOT}",
        f"replica_ids={_id_list(spec.replica_ids)}",
        "imds=http://169.254.169.254/latest",
        "imds_token=$(curl -fsS -X PUT \"$imds/api/token\" -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')",
        "launch_index=$(curl -fsS -H \"X-aws-ec2-metadata-token: $imds_token\" "
        "\"$imds/meta-data/ami-launch-index\")",
        "replica_id=$(echo \"$replica_ids\" | cut -d, -f\"$((launch_index + 1))\")",
        "[ -n \"$replica_id\" ] || fail \"no replica id for launch index $launch_index\"",
        _write_file(f"{BOOT_ROOT}/env.sh", "\n".join(env_lines) + "\n"),
        f"echo \"export SKY_LITE_REPLICA_ID=$replica_id\" >> {BOOT_ROOT}/env.sh",
        _write_file(f"{BOOT_ROOT}/setup.sh", spec.setup or ""),
        _write_file(f"{BOOT_ROOT}/run.sh", spec.run),
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


def _typed(value: object, kind: type[_T]) -> _T:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value
