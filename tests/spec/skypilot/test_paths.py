"""Relative paths of a task (`workdir`, `file_mounts` sources, `service.tls` files) resolve as SkyPilot
resolves them: against the directory sky-lite runs in, not the task file's folder; ``~`` is expanded and an
absolute path is taken as written. A relative path missing from the working directory that exists beside the
task file (where sky-lite read such paths before) is refused naming the field, with the spelling that works.

Every row lays out files below a temporary folder (``repo/`` is the working directory unless the row says
otherwise, the task file is ``repo/tasks/svc.yaml``, ``home/`` is ``$HOME``) and checks the task's sources
as a submission does: ``check_task_sources(spec, find_task_dir(source), source)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from skyserve_lite.errors import SpecError
from skyserve_lite.files.capture import capture_task_files, check_task_sources, describe_missing, find_task_dir
from skyserve_lite.spec.parse import parse_task

TASK_FILE = "repo/tasks/svc.yaml"


@dataclasses.dataclass(frozen=True)
class Pem:
    key: bytes
    cert: bytes


@pytest.fixture(scope="module")
def pem() -> Pem:
    """A fresh EC key and a self-signed certificate for it (what `service.tls` needs to load as a pair)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "paths.example")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(private, hashes.SHA256()))
    return Pem(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()),
               cert.public_bytes(serialization.Encoding.PEM))


def lay_out(root: Path, files: tuple[str, ...], pem: Pem) -> None:
    """Make ``files`` below ``root``: a name ending in ``/`` is a folder, ``*.key``/``*.crt`` a TLS key or
    certificate, anything else a small text file."""
    for name in files:
        path = root / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pem.key if name.endswith(".key") else pem.cert if name.endswith(".crt") else b"x\n")


def task_text(fields: dict[str, Any]) -> str:
    doc: dict[str, Any] = {"run": "python app.py", "service": {"replicas": 1}}
    doc.update(fields)
    if "tls" in doc:
        doc["service"] = {"replicas": 1, "tls": doc.pop("tls")}
    return yaml.safe_dump(doc, sort_keys=False)


def fill(text: str, root: Path) -> str:
    return text.replace("{tmp}", str(root))


def tls(keyfile: str, certfile: str) -> dict[str, Any]:
    return {"tls": {"keyfile": keyfile, "certfile": certfile}}


@dataclasses.dataclass(frozen=True)
class Row:
    files: tuple[str, ...]  # laid out below the temporary folder
    fields: dict[str, Any]  # of the task ("{tmp}" is the temporary folder)
    cwd: str = "repo"


ACCEPTED = [
    pytest.param(Row(("repo/app/",), {"workdir": "app"}), id="workdir-relative-to-cwd"),
    pytest.param(Row(("repo/app/",), {"workdir": "./app"}), id="workdir-dot-relative"),
    pytest.param(Row(("repo/examples/x/",), {"workdir": "examples/x"}), id="workdir-nested-like-skypilot-examples"),
    # the task file's own folder named from the repository root, as `sky serve up examples/x/task.yaml` users do
    pytest.param(Row(("repo/tasks/",), {"workdir": "tasks"}), id="workdir-the-task-folder-from-cwd"),
    pytest.param(Row(("home/app/",), {"workdir": "~/app"}), id="workdir-tilde"),
    pytest.param(Row(("elsewhere/app/",), {"workdir": "{tmp}/elsewhere/app"}), id="workdir-absolute"),
    # both exist: the working directory's wins (see the capture test below)
    pytest.param(Row(("repo/app/", "repo/tasks/app/"), {"workdir": "app"}), id="workdir-in-both"),
    pytest.param(Row(("repo/data.csv",), {"file_mounts": {"/data.csv": "data.csv"}}), id="mount-file-relative"),
    pytest.param(Row(("repo/models/",), {"file_mounts": {"/models": "models"}}), id="mount-dir-relative"),
    pytest.param(Row(("home/data.csv",), {"file_mounts": {"/data.csv": "~/data.csv"}}), id="mount-tilde"),
    pytest.param(Row(("elsewhere/d.csv",), {"file_mounts": {"/d.csv": "{tmp}/elsewhere/d.csv"}}),
                 id="mount-absolute"),
    pytest.param(Row((), {"file_mounts": {"/data": "s3://bucket/data"}}), id="mount-cloud-uri-not-looked-for"),
    pytest.param(Row(("repo/tls/s.key", "repo/tls/s.crt"), tls("tls/s.key", "tls/s.crt")), id="tls-relative"),
    pytest.param(Row(("home/s.key", "elsewhere/s.crt"), tls("~/s.key", "{tmp}/elsewhere/s.crt")),
                 id="tls-tilde-and-absolute"),
    pytest.param(Row(("elsewhere/app/",), {"workdir": "app"}, cwd="elsewhere"), id="cwd-outside-the-repo"),
]


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary folder every row lays out its files below; ``home/`` is ``$HOME``."""
    real = tmp_path.resolve()  # the working directory as the process sees it (no symlink)
    (real / "home").mkdir()
    (real / "repo" / "tasks").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(real / "home"))
    return real


def check(row: Row, root: Path, pem: Pem, monkeypatch: pytest.MonkeyPatch) -> None:
    lay_out(root, row.files, pem)
    (root / row.cwd).mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(root / row.cwd)
    source = str(root / TASK_FILE)
    text = fill(task_text(row.fields), root)
    (root / TASK_FILE).write_text(text)
    assert find_task_dir(source) == root / row.cwd
    check_task_sources(parse_task(text, source), find_task_dir(source), source)


@pytest.mark.parametrize("row", ACCEPTED)
def test_relative_paths_are_read_from_the_working_directory(row: Row, root: Path, pem: Pem,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    check(row, root, pem, monkeypatch)


_HINT = "relative paths are read from the directory sky-lite runs in, as SkyPilot does"

# row -> (field, what the message says: "{tmp}" is the temporary folder), and whether it gives the hint
REFUSED = [
    pytest.param(Row(("repo/tasks/app/",), {"workdir": "app"}), "workdir",
                 ("'app' does not exist (resolved to {tmp}/repo/app)", _HINT, "write 'tasks/app'",
                  "or run sky-lite from {tmp}/repo/tasks"), True, id="workdir-beside-the-task-file"),
    pytest.param(Row(("repo/tasks/app/",), {"workdir": "./app"}), "workdir", ("write 'tasks/app'",), True,
                 id="workdir-dot-beside-the-task-file"),
    pytest.param(Row(("repo/shared/",), {"workdir": "../shared"}), "workdir",
                 ("'../shared' does not exist (resolved to {tmp}/repo/../shared)", "write 'shared'"), True,
                 id="workdir-parent-of-the-task-file"),
    # from outside the repository the spelling that works is the absolute path
    pytest.param(Row(("repo/tasks/app/",), {"workdir": "app"}, cwd="elsewhere"), "workdir",
                 ("resolved to {tmp}/elsewhere/app", "write '{tmp}/repo/tasks/app'"), True,
                 id="workdir-beside-from-outside-the-repo"),
    pytest.param(Row((), {"workdir": "app"}), "workdir", ("'app' does not exist (resolved to {tmp}/repo/app)",),
                 False, id="workdir-missing-everywhere"),
    pytest.param(Row(("repo/tasks/app/",), {"workdir": "~/app"}), "workdir",
                 ("'~/app' does not exist (resolved to {tmp}/home/app)",), False, id="workdir-tilde-missing"),
    pytest.param(Row(("repo/tasks/app/",), {"workdir": "{tmp}/gone/app"}), "workdir",
                 ("does not exist (resolved to {tmp}/gone/app)",), False, id="workdir-absolute-missing"),
    pytest.param(Row(("repo/app",), {"workdir": "app"}), "workdir", ("'app' is not a directory",), False,
                 id="workdir-is-a-file"),
    pytest.param(Row(("repo/tasks/data.csv",), {"file_mounts": {"/data": "data.csv"}}), "file_mounts./data",
                 ("'data.csv' does not exist (resolved to {tmp}/repo/data.csv)", _HINT, "write 'tasks/data.csv'"),
                 True, id="mount-beside-the-task-file"),
    pytest.param(Row(("repo/tasks/models/",), {"file_mounts": {"~/models": "models/"}}), "file_mounts.~/models",
                 ("write 'tasks/models'",), True, id="mount-dir-beside-the-task-file"),
    pytest.param(Row(("repo/tasks/tls/s.key", "repo/tasks/tls/s.crt"), tls("tls/s.key", "tls/s.crt")),
                 "service.tls.keyfile", ("'tls/s.key' does not exist", _HINT, "write 'tasks/tls/s.key'"), True,
                 id="tls-keyfile-beside-the-task-file"),
    pytest.param(Row(("repo/tls/s.key", "repo/tasks/tls/s.crt"), tls("tls/s.key", "tls/s.crt")),
                 "service.tls.certfile", ("'tls/s.crt' does not exist", _HINT, "write 'tasks/tls/s.crt'"), True,
                 id="tls-certfile-beside-the-task-file"),
]


@pytest.mark.parametrize(("row", "path", "fragments", "hint"), REFUSED)
def test_a_path_missing_from_the_working_directory_is_refused_naming_the_field(
        row: Row, path: str, fragments: tuple[str, ...], hint: bool, root: Path, pem: Pem,
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SpecError) as caught:
        check(row, root, pem, monkeypatch)
    assert (caught.value.source, caught.value.path) == (str(root / TASK_FILE), path)
    for fragment in fragments:
        assert fill(fragment, root) in caught.value.problem
    assert (_HINT in caught.value.problem) is hint


def test_where_both_hold_the_path_the_working_directorys_files_are_captured(root: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for folder, text in (("repo/app", "the working directory's\n"), ("repo/tasks/app", "the task folder's\n")):
        (root / folder).mkdir(parents=True)
        (root / folder / "server.py").write_text(text)
    monkeypatch.chdir(root / "repo")
    source = str(root / TASK_FILE)
    spec = parse_task(task_text({"workdir": "app", "file_mounts": {"/srv/server.py": "tasks/app/server.py"}}), source)
    files = capture_task_files(spec, find_task_dir(source), source)
    assert files is not None and files.workdir is not None
    digest = hashlib.sha256(b"the working directory's\n").hexdigest()
    assert files.workdir.files["server.py"].digest == digest
    assert dict(files.mounts)["/srv/server.py"].files[""].digest == hashlib.sha256(b"the task folder's\n").hexdigest()


# (written, task file) -> whether the hint is given: only for a relative path, a task file named by its
# absolute path, and a path that exists beside it
HINTS = [
    pytest.param("app", TASK_FILE, True, id="relative"),
    pytest.param("app", "<string>", False, id="task-from-a-string"),
    pytest.param("~/app", TASK_FILE, False, id="tilde"),
    pytest.param("{tmp}/repo/tasks/app", TASK_FILE, False, id="absolute"),
    pytest.param("nothing", TASK_FILE, False, id="not-beside-either"),
]


@pytest.mark.parametrize(("written", "task_file", "hint"), HINTS)
def test_the_hint_is_given_only_where_it_helps(written: str, task_file: str, hint: bool, root: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (root / "repo/tasks/app").mkdir()
    monkeypatch.chdir(root / "repo")
    source = task_file if task_file.startswith("<") else str(root / task_file)
    problem = describe_missing(fill(written, root), root / "repo" / "missing", source)
    assert problem.startswith(f"{fill(written, root)!r} does not exist (resolved to {root}/repo/missing)")
    assert (_HINT in problem) is hint
