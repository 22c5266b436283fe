"""The boot script of one launch batch, for every cloud: a bash script, and the file list it applies.

The script runs as root at first boot (EC2's user data through cloud-init, GCE's ``startup-script``). GCE
runs it again at every boot (a reboot, a GPU instance restarted after host maintenance); by then the workload
has owned its workdir and home and may have planted symbolic links there (``workdir/data -> /root``), through
which a root that wrote files again would write or ``chmod`` anywhere. So the first boot leaves a root-only
marker (``BOOTED_MARKER``) before the workload first owns anything, and a later run only puts back the
metadata block (step 6) and starts the service (``render_later_boot``): setup is not run again, no file is
written again. A first boot that stopped after the marker (``setup`` failed) fails again, setup not run. At
first boot it:

1. finds its replica id: the batch's replica ids are embedded as a list, and the cloud's metadata service
   says which of them this instance is (``BootCloud.find_replica_id``: on EC2 its launch index);
2. creates the unprivileged user ``sky`` that runs the workload (unless the task says
   ``resources.run_as_root: true``: then root does, as before that field existed);
3. writes ``/opt/sky-lite/env.sh`` (the task's ``envs`` plus ``PORT``, ``SKY_LITE_REPLICA_ID`` and
   ``SKY_LITE_SERVICE``) and the task's ``setup`` and ``run`` as files;
4. reads each of the task's secrets from the cloud's secret store with the instance's own identity
   (``BootCloud.read_secret``) into ``/opt/sky-lite/secrets.sh``: the script names the secrets
   (``BootBatch.secrets``), never holds a value, so user data and instance metadata carry none;
5. writes the version's snapshot (``workdir`` into ``/opt/sky-lite/workdir``, each local ``file_mounts``
   source to its destination): it downloads the snapshot's file list and applies it line by line
   (``apply_files``), each file from the bucket's ``blobs/<sha256>``; then copies every cloud mount source
   (``s3://``, ``gs://``). Both with the cloud's own CLI and the instance's own identity
   (``BootCloud.copy_object``, ``copy_tree``): no credential is ever written into the script;
6. unless the workload runs as root, keeps the workload user away from the instance metadata service
   (``GUARD``): the instance's credentials are the replicas' role or service account, which reads every
   secret of every service of the controller; root keeps them (it has just used them, and the cloud's
   agents run as root). Then it writes the marker, and the workdir and the workload user's home become
   that user's;
7. runs ``setup`` in the workdir as the workload user; if it fails the instance powers itself off, so the
   controller sees it stopped instead of waiting for a readiness probe that cannot succeed;
8. installs ``run`` as the systemd unit ``sky-lite-replica`` that restarts it whenever it exits, again as
   the workload user, and the metadata block as the unit ``sky-lite-guard`` that puts it back at every boot
   before the network is up (an iptables rule does not survive a reboot, and EC2 runs user data only once),
   which the replica's unit requires.

``env.sh`` and ``secrets.sh`` are root's alone (mode 0600): root sources them and only then becomes the
workload user (``runuser``), so the values reach the workload's environment and that user cannot read the
files themselves.

Its output goes to the console (and on EC2 to ``/var/log/cloud-init-output.log``); ``run``'s goes to the
journal, which keeps each line's time (``journalctl -u sky-lite-replica -o short-iso``). Lines are not
prefixed with their time as a local replica's are: `serve logs` shows the console as the cloud captured it,
where kernel, cloud-init and journal lines mix with times of their own, and a prefixing loop would cost
user data bytes and a `date` process per line on images whose bash has no ``EPOCHREALTIME`` (Amazon Linux
2's 4.2). `serve logs --since` shows such a log whole. The script holds what the
instance needs and nothing else: every byte counts against EC2's 16 KB of user data. The file list is an
object in the bucket, not part of the script, so a workdir of 10 files and one of 10,000 make a script of the
same size.

File list format (``render_file_list``), one line per entry, fields separated by one tab::

    file<TAB>644<TAB><sha256><TAB>/opt/sky-lite/workdir/app.py
    dir<TAB>755<TAB>-<TAB>/opt/sky-lite/workdir/empty
    link<TAB>777<TAB>../shared/lib<TAB>/opt/sky-lite/workdir/lib

The mode is octal; the last field is the absolute path on the instance, or ``~/...`` below the home of the
user the workload runs as (``sky``'s, or root's with ``run_as_root``: the boot script knows which, so one file
list serves both). Capture refuses names with tabs or newlines, and ``find_placements`` refuses link targets
and destinations holding them, so every line splits into exactly these four fields. ``apply_files`` refuses a
relative path and a path with a ``..`` component (a file list is data from a bucket: the script does not
trust it to stay where the task said).

Everything here is pure: values in, text out.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from skyserve_lite.files.manifest import EntryKind, Manifest, ManifestEntry, TaskFiles
from skyserve_lite.spec.model import Pairs

BOOT_ROOT = "/opt/sky-lite"
WORKDIR = f"{BOOT_ROOT}/workdir"
UNIT_NAME = "sky-lite-replica"
UNIT_DIR = "/etc/systemd/system"
FILE_LIST_PATH = f"{BOOT_ROOT}/files.tsv"
ENV_FILE = f"{BOOT_ROOT}/env.sh"
SECRETS_FILE = f"{BOOT_ROOT}/secrets.sh"
# The workload's user unless the task asks for root (``resources.run_as_root``): no sudo, no password.
WORKLOAD_USER = "sky"
WORKLOAD_HOME = f"/home/{WORKLOAD_USER}"
ROOT_HOME = "/root"

# Root's alone (0700): the workload can neither make nor remove the marker of a first boot done.
STATE_DIR = "/var/lib/sky-lite"
BOOTED_MARKER = f"{STATE_DIR}/booted"
GUARD_NAME = "sky-lite-guard"
GUARD_SCRIPT = f"{BOOT_ROOT}/guard.sh"
# Every instance metadata address of the clouds sky-lite launches on: EC2's IPv4 and IPv6 (Nitro) endpoints
# and Compute Engine's (IPv4, and IPv6 on IPv6-only instances). One list for every cloud: a rule for an
# address that does not exist there costs nothing.
METADATA_IPV4 = ("169.254.169.254",)
METADATA_IPV6 = ("fd00:ec2::254", "fd20:ce::254")

# Blocks every user but root from the metadata service: a rule at the top of OUTPUT (inserted, so no ACCEPT
# before it can skip it), checked first so the boot and every start of the unit add it once. TCP only and
# not port 53: Compute Engine's metadata server is also the VM's DNS resolver and NTP server, which the
# workload's own lookups, systemd-resolved and chrony (none of them root) use; credentials are HTTP (TCP 80).
# An image without iptables keeps the service reachable: a warning in the boot log (and the journal), and
# the boot goes on, as it did before this block existed; an iptables that refuses the rule fails the boot.
GUARD = r"""#!/bin/bash
set -euo pipefail
block() {
  local r=(OUTPUT -d "$2" -p tcp ! --dport 53 -m owner ! --uid-owner 0 -j REJECT)
  "$1" -w -C "${r[@]}" 2>/dev/null || "$1" -w -I "${r[@]}"
}
command -v iptables >/dev/null || { echo "sky-lite: warning: no iptables: the workload user can reach" \
  "the instance metadata service and this instance's credentials" >&2; exit 0; }
for a in IPV4; do block iptables $a; done
if command -v ip6tables >/dev/null; then
  for a in IPV6; do block ip6tables $a || echo "sky-lite: warning: ip6tables cannot block $a" >&2; done
fi
""".replace("IPV4", " ".join(METADATA_IPV4)).replace("IPV6", " ".join(METADATA_IPV6))

# Before the network is up at every boot (as ufw's unit is), so no process of the workload user (a crontab of
# its own, say) meets the metadata service before the rule is back.
GUARD_UNIT = f"""[Unit]
Description=sky-lite metadata guard
DefaultDependencies=no
After=local-fs.target
Wants=network-pre.target
Before=network-pre.target {UNIT_NAME}.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/bash {GUARD_SCRIPT}
[Install]
WantedBy=multi-user.target
"""

# File lists and cloud mounts name ``~`` as the task wrote it; the script knows whose home that is (``$home``).
EXPAND_HOME = r"""homed() {  # path: REPLY is the path with a leading ~ made the workload user's home
  case "$1" in "~") REPLY=$home ;; "~/"*) REPLY="$home/${1#"~/"}" ;; *) REPLY=$1 ;; esac
}"""

# The boot script's half of the file list format (module docstring). The list is read on descriptor 3, so a
# command in the loop that reads its stdin cannot eat the rest of the list; each step is its own command,
# because `set -e` ignores a failure on the left of `&&`.
APPLY_FILES = r"""apply_files() {  # file-list blob-prefix: write every entry of a snapshot's file list
  local kind mode ref path
  while IFS=$'\t' read -r -u 3 kind mode ref path; do
    homed "$path"
    path=$REPLY
    case "$path" in /*) ;; *) fail "file list: $path is not an absolute path" ;; esac
    case "$path/" in */../*) fail "file list: refusing $path: it has a .. component" ;; esac
    case "$mode" in ''|*[!0-7]*) fail "file list: bad mode $mode for $path" ;; esac
    case "$kind" in
      dir)
        mkdir -p -- "$path"
        chmod -- "$mode" "$path" ;;
      file)
        mkdir -p -- "$(dirname -- "$path")"
        cloud_copy "$2$ref" "$path" </dev/null
        chmod -- "$mode" "$path" ;;
      link)
        mkdir -p -- "$(dirname -- "$path")"
        ln -sfn -- "$ref" "$path" ;;
      *) fail "file list: unknown kind $kind for $path" ;;
    esac
  done 3< "$1"
}"""

# ``secret_env VARIABLE REFERENCE`` appends ``export VARIABLE=<value>`` to the secrets file, the value read with
# ``cloud_secret`` (base64 from the cloud, so every byte comes through: a trailing newline too, which a plain
# command substitution would drop; the ``.`` keeps it). A secret that cannot be read fails the boot.
READ_SECRETS = (r"""secret_env() {
  local encoded value
  encoded=$(cloud_secret "$2") || fail "cannot read the secret $1 ($2) with this instance's identity"
  value=$(printf '%s' "$encoded" | base64 -d; echo .)
  printf 'export %s=%q\n' "$1" "${value%.}" >> """ + SECRETS_FILE + "\n}")


@dataclass(frozen=True)
class BootCloud:
    """A cloud's part of the boot script: shell lines that set ``replica_id`` (from ``$replica_ids``, the
    batch's ids separated by commas), and the bodies of ``cloud_copy SRC DST`` (one object),
    ``cloud_copy_tree SRC DST`` (everything under a prefix) and ``cloud_secret REFERENCE`` (print a secret's
    value in base64), with the instance's own identity. ``prepare`` makes the cloud's CLI available before
    its first use (an image may lack it)."""

    name: str
    find_replica_id: tuple[str, ...]
    copy_object: str
    copy_tree: str
    read_secret: str
    prepare: tuple[str, ...] = ()


def render_copy_functions(cloud: BootCloud) -> str:
    return (f"cloud_copy() {{ {cloud.copy_object}; }}\n"
            f"cloud_copy_tree() {{ {cloud.copy_tree}; }}")


@dataclass(frozen=True)
class BootBatch:
    """What the boot script of one launch batch needs: whose instances they are and what they run.

    ``replica_ids[i]`` is the replica id of the instance with launch index ``i``; ``port`` is the service
    port ``run`` listens on (``$PORT``). ``envs`` are written into the script; ``secrets`` are (variable, the
    secret store's reference to its value) and only their references are: never a secret's value.
    """

    service: str
    version: int
    replica_ids: tuple[int, ...]
    envs: Pairs
    setup: str | None
    run: str
    port: int
    secrets: Pairs = ()
    run_as_root: bool = False

    @property
    def home(self) -> str:
        """The home of the user ``setup`` and ``run`` run as: where ``~`` lands."""
        return ROOT_HOME if self.run_as_root else WORKLOAD_HOME


@dataclass(frozen=True)
class Fetch:
    """A user's own cloud mount source, copied at boot: the script tries a single object first, then the
    prefix (whether it is a folder is not known)."""

    source: str  # s3://bucket/key, gs://bucket/key
    destination: str  # an absolute path on the instance


@dataclass(frozen=True)
class StagedFiles:
    """Where the boot script finds a version's snapshot: its file list, and the prefix its blobs are under
    (a file entry's blob is ``blobs + digest``)."""

    file_list: str  # s3://bucket/files/<TaskFiles digest>.tsv (gs:// on GCP)
    blobs: str  # s3://bucket/blobs/


@dataclass(frozen=True)
class Placement:
    """One snapshot entry and the absolute path it lands at on the instance; ``field`` is the task field it
    came from (``workdir``, ``file_mounts./data``), for error messages."""

    field: str
    entry: ManifestEntry
    path: str


def find_placements(files: TaskFiles) -> list[Placement]:
    """Every entry of ``files`` where the boot script writes it, in the order it writes them: the workdir's
    entries below ``WORKDIR``, then each mount's (sorted by destination) below ``find_mount_destination``;
    a single-file mount is the destination itself. A mount into the workdir therefore lands after it.

    Raises ``ValueError`` naming the field for what the file list cannot carry: a tab or a newline in a path
    or link target, a ``..`` component in a destination.
    """
    sources: list[tuple[str, str, Manifest]] = []
    if files.workdir is not None:
        sources.append(("workdir", WORKDIR, files.workdir))
    sources += [(f"file_mounts.{d}", find_mount_destination(d), m) for d, m in files.mounts]
    placements = []
    for field, root, manifest in sources:
        for entry in manifest.entries:
            path = _join_path(field, root, entry.path)
            if entry.target is not None and ("\t" in entry.target or "\n" in entry.target):
                raise ValueError(f"{field}: {entry.path}: link targets with tabs or newlines are not supported")
            placements.append(Placement(field, entry, path))
    return placements


def render_file_list(placements: Sequence[Placement]) -> str:
    """The file list the boot script applies (format in the module docstring); "" when there is nothing."""
    lines = []
    for placement in placements:
        entry = placement.entry
        ref = {EntryKind.FILE: entry.digest, EntryKind.LINK: entry.target}.get(entry.kind) or "-"
        lines.append(f"{entry.kind.value}\t{entry.mode:o}\t{ref}\t{placement.path}\n")
    return "".join(lines)


def render_boot_script(cloud: BootCloud, batch: BootBatch, fetches: Sequence[Fetch] = (),
                       files: StagedFiles | None = None) -> str:
    """The boot script for one launch batch on ``cloud``. See the module docstring for what it does.

    ``files`` (the snapshot) is written first, then ``fetches`` in order, so a cloud mount into the workdir
    lands after the workdir itself. The script's size does not depend on how many files there are, and it
    holds no secret's value: ``batch.secrets`` are references the instance resolves itself.
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
        *render_later_boot(batch),
        f"mkdir -p {WORKDIR}",
        f"cd {BOOT_ROOT}",
        f"replica_ids={_id_list(batch.replica_ids)}",
        *cloud.find_replica_id,
        "[ -n \"$replica_id\" ] || fail \"no replica id for this instance among $replica_ids\"",
    ]
    if not batch.run_as_root:
        # A system user of its own, no password and no sudo: the workload cannot become root.
        lines.append(f"id -u {WORKLOAD_USER} >/dev/null 2>&1 || useradd --create-home --home-dir {WORKLOAD_HOME} "
                     f"--user-group --shell /bin/bash {WORKLOAD_USER}")
    lines += [
        f"home={batch.home}",
        # Root's alone from their first byte; the workload gets their values through its environment only.
        f"(umask 077 && {_write_file(ENV_FILE, chr(10).join(env_lines) + chr(10))})",
        f"echo \"export SKY_LITE_REPLICA_ID=$replica_id\" >> {ENV_FILE}",
        f"(umask 077 && : > {SECRETS_FILE})",
        _write_file(f"{BOOT_ROOT}/setup.sh", batch.setup or ""),
        _write_file(f"{BOOT_ROOT}/run.sh", batch.run),
    ]
    if batch.secrets or files is not None or fetches:
        # Ubuntu installs cloud CLIs as snaps, which cloud-init's PATH leaves out.
        lines += ["export PATH=\"$PATH:/snap/bin\"", *cloud.prepare]
    if batch.secrets:
        lines.append(f"cloud_secret() {{ {cloud.read_secret}; }}")
        lines.append(READ_SECRETS)
        lines += [f"secret_env {name} {shlex.quote(reference)}" for name, reference in batch.secrets]
    if files is not None or fetches:
        lines.append(render_copy_functions(cloud))
        lines.append(EXPAND_HOME)
    if files is not None:
        lines.append(APPLY_FILES)
        lines.append(f"cloud_copy {shlex.quote(files.file_list)} {FILE_LIST_PATH}")
        lines.append(f"apply_files {FILE_LIST_PATH} {shlex.quote(files.blobs)}")
    if fetches:
        lines.append("fetch() {  # source destination: one object, else everything under the prefix")
        lines.append("  homed \"$2\"")
        lines.append("  mkdir -p \"$(dirname \"$REPLY\")\"")
        lines.append("  cloud_copy \"$1\" \"$REPLY\" 2>/dev/null || cloud_copy_tree \"$1\" \"$REPLY\"")
        lines.append("}")
        for fetch in fetches:
            lines.append(f"fetch {shlex.quote(fetch.source)} {shlex.quote(fetch.destination)}")
    # What the workload runs: root sources the two files, then (unless the task runs as root) becomes the
    # workload user, who keeps the environment but cannot read the files.
    become = "" if batch.run_as_root else f"runuser -u {WORKLOAD_USER} -- "
    load = f". {ENV_FILE} && . {SECRETS_FILE}"
    if not batch.run_as_root:
        # Root's own reads of the metadata service are done; from here on only root reaches it.
        lines += [f"(umask 077 && cat > {GUARD_SCRIPT}) <<'GUARD'", *GUARD.splitlines(), "GUARD"]
        lines.append(f"/bin/bash {GUARD_SCRIPT} || fail \"cannot keep the workload user from the metadata service\"")
    # From here on the workload may own files, so a later boot must not act in its tree as root.
    lines.append(f"(umask 077 && mkdir -p {STATE_DIR}) && : > {BOOTED_MARKER}")
    if not batch.run_as_root:
        # The workdir and the home are the workload's: setup may write there (caches, builds, checkpoints).
        lines.append(f"chown -R {WORKLOAD_USER}: {WORKDIR} {WORKLOAD_HOME}")
    guarded = () if batch.run_as_root else (f"Requires={GUARD_NAME}.service", f"After={GUARD_NAME}.service")
    lines += [
        f"cd {WORKDIR}",
        f"if ! ({load} && {become}/bin/bash {BOOT_ROOT}/setup.sh); then fail \"setup failed\"; fi",
        f"cat > {UNIT_DIR}/{UNIT_NAME}.service <<'UNIT'",
        "[Unit]",
        "Description=sky-lite replica",
        "After=network-online.target",
        "Wants=network-online.target",
        *guarded,
        "[Service]",
        f"WorkingDirectory={WORKDIR}",
        f"ExecStart=/bin/bash -c '{load} && exec {become}/bin/bash {BOOT_ROOT}/run.sh'",
        "Restart=always",
        # 5 s between restarts: a crashing `run` costs at most 12 starts a minute, not a busy loop.
        "RestartSec=5",
        "[Install]",
        "WantedBy=multi-user.target",
        "UNIT",
    ]
    if not batch.run_as_root:
        lines += [f"cat > {UNIT_DIR}/{GUARD_NAME}.service <<'UNIT'", *GUARD_UNIT.splitlines(), "UNIT"]
    lines.append("systemctl daemon-reload")
    if not batch.run_as_root:
        lines.append(f"systemctl enable {GUARD_NAME}.service")
    lines.append(f"systemctl enable --now {UNIT_NAME}.service")
    return "\n".join(lines) + "\n"


def render_later_boot(batch: BootBatch) -> list[str]:
    """The lines a boot after the first runs instead of the rest of the script (module docstring): start the
    service if the first boot installed it (the guard first, which the unit requires anyway), else fail as the
    first boot did. Nothing here touches the workload's files."""
    guard = [] if batch.run_as_root else [f"  /bin/bash {GUARD_SCRIPT}"]
    return [
        f"if [ -e {BOOTED_MARKER} ]; then",
        f"  [ -e {UNIT_DIR}/{UNIT_NAME}.service ] || fail \"the first boot did not finish; setup is not run again\"",
        *guard,
        f"  systemctl start {UNIT_NAME}.service",
        "  exit 0",
        "fi",
    ]


def find_mount_destination(destination: str) -> str:
    """Where a ``file_mounts`` destination lands on the instance: absolute paths as given, ``~`` as written
    (the home of the user the workload runs as: the boot script expands it, ``EXPAND_HOME``), relative paths
    below the workdir."""
    if destination == "~" or destination.startswith("~/"):
        return destination
    if destination.startswith("/"):
        return destination
    return f"{WORKDIR}/{destination}"


def _join_path(field: str, root: str, relative: str) -> str:
    """``root`` + ``relative`` as one path without empty or ``.`` components: absolute, or ``~``-relative
    when ``root`` is (``~/conf``). Raises ``ValueError`` for a ``..`` component, a tab or a newline."""
    joined = f"{root}/{relative}" if relative else root
    in_home = joined == "~" or joined.startswith("~/")
    parts = [p for p in joined.removeprefix("~").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{field}: {joined!r} has a '..' component: name the path it should land at")
    if "\t" in joined or "\n" in joined:
        raise ValueError(f"{field}: {joined!r}: paths with tabs or newlines are not supported")
    if in_home:
        return "/".join(["~", *parts])
    return "/" + "/".join(parts)


def _write_file(path: str, content: str) -> str:
    # base64 keeps any text, quotes and heredoc markers included, out of the shell's reach.
    encoded = base64.b64encode(content.encode()).decode("ascii")
    return f"echo {encoded} | base64 -d > {path}"


def _id_list(replica_ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in replica_ids)

