"""Capturing `service.tls`: the key and certificate land in the version's snapshot (0600, kept by garbage
collection, uploaded by a remote client), and a missing, unreadable or mismatched pair is refused at submit
time naming the field, with nothing stored and no key material in the message."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock
from skyserve_lite.errors import SpecError
from skyserve_lite.files import capture as capture_module
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.files.capture import capture_task_files, check_task_sources, find_local_paths, needs_capture
from skyserve_lite.files.manifest import TLS_CERT, TLS_KEY, EntryKind, Manifest, ManifestEntry, TaskFiles
from skyserve_lite.remote.client import RemoteController
from skyserve_lite.remote.transport import InProcessTransport
from skyserve_lite.spec.model import SubmittedTask, TaskSpec
from skyserve_lite.spec.parse import load_task_file, parse_task
from skyserve_lite.state.store import Store
from tests.files.certs import encrypt_key, make_pair


@dataclasses.dataclass(frozen=True)
class Pairs:
    folder: Path  # every file below, made once for the module
    cert: Path
    key: Path
    other_key: Path  # the key of another certificate
    encrypted_key: Path  # ``key`` with a passphrase
    junk: Path  # not PEM at all


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Pairs:
    folder = tmp_path_factory.mktemp("certs")
    cert, key = make_pair(folder, "server")
    _, other_key = make_pair(folder, "other")
    junk = folder / "junk.pem"
    junk.write_text("not a certificate\n")
    return Pairs(folder, cert, key, other_key, encrypt_key(key, folder / "encrypted.key"), junk)


@pytest.fixture
def project(tmp_path: Path, pairs: Pairs, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder holding the pairs, and the working directory (where relative paths resolve)."""
    root = tmp_path / "project"
    (root / "tls").mkdir(parents=True)
    monkeypatch.chdir(root)
    for name in ("server.crt", "server.key", "other.key", "encrypted.key", "junk.pem"):
        shutil.copy(pairs.folder / name, root / "tls" / name)
    (root / "tls" / "server.key").chmod(0o640)
    return root


def tls_task(keyfile: str = "tls/server.key", certfile: str = "tls/server.crt", extra: str = "") -> TaskSpec:
    return parse_task(f"service:\n  replicas: 1\n  tls:\n    keyfile: {keyfile}\n    certfile: {certfile}\n"
                      f"run: python app.py\n{extra}")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_pair_lands_in_the_snapshot_with_mode_0600(project: Path, tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    files = capture_task_files(tls_task(), project, str(project / "svc.yaml"), blobs)
    assert files is not None and files.workdir is None and files.mounts == ()
    assert files.tls == Manifest((
        ManifestEntry(TLS_CERT, EntryKind.FILE, 0o600, (project / "tls/server.crt").stat().st_size,
                      sha(project / "tls/server.crt")),
        ManifestEntry(TLS_KEY, EntryKind.FILE, 0o600, (project / "tls/server.key").stat().st_size,
                      sha(project / "tls/server.key")),
    ))
    assert files.blob_digests() == {sha(project / "tls/server.crt"), sha(project / "tls/server.key")}
    assert blobs.digests() == files.blob_digests()
    assert files.size == (project / "tls/server.crt").stat().st_size + (project / "tls/server.key").stat().st_size


def test_paths_resolve_like_workdir_relative_to_the_task_and_with_a_tilde(project: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(project))
    files = capture_task_files(tls_task(keyfile="~/tls/server.key", certfile=str(project / "tls/server.crt"),
                                        extra="workdir: tls\n"), project, "svc.yaml")
    assert files is not None and files.tls is not None and files.workdir is not None
    assert files.tls.files[TLS_KEY].digest == sha(project / "tls/server.key")
    # The workdir holds the same bytes: one blob each, wherever the snapshot names it.
    assert files.workdir.files["server.key"].digest == files.tls.files[TLS_KEY].digest


def test_a_tls_only_task_needs_capture_until_it_has_its_snapshot(project: Path) -> None:
    spec = tls_task()
    assert needs_capture(spec)
    captured = dataclasses.replace(spec, files=capture_task_files(spec, project, "svc.yaml"))
    assert not needs_capture(captured)


def test_the_snapshot_json_keeps_older_snapshots_as_they_were(project: Path) -> None:
    files = capture_task_files(tls_task(extra="workdir: tls\n"), project, "svc.yaml")
    assert files is not None
    assert TaskFiles.from_json(json.loads(json.dumps(files.to_json()))) == files
    without = TaskFiles(workdir=files.workdir)
    # A snapshot stored before TLS existed has no "tls" key, and one without TLS still writes none: its
    # digest (the snapshot row's key, the staged file list's name) does not move.
    assert "tls" not in without.to_json()
    older = {"workdir": without.to_json()["workdir"], "mounts": {}}
    assert TaskFiles.from_json(older) == without and TaskFiles.from_json(older).digest == without.digest


def test_garbage_collection_keeps_the_pair_of_a_stored_version(project: Path, tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "home" / "blobs")
    spec = tls_task()
    spec = dataclasses.replace(spec, files=capture_task_files(spec, project, "svc.yaml", blobs))
    store = Store.open(tmp_path / "home")
    try:
        store.create_service("svc", SubmittedTask(text="x", source="svc.yaml", spec=spec), 30001, 0.0)
        assert spec.files is not None
        assert store.find_needed_blobs() == spec.files.blob_digests()
        assert blobs.collect_garbage(store.find_needed_blobs) == 0
    finally:
        store.close()
    assert blobs.digests() == spec.files.blob_digests()


def test_a_remote_client_uploads_the_pair_from_where_it_read_it(project: Path) -> None:
    spec = tls_task()
    files = capture_task_files(spec, project, "svc.yaml")
    assert files is not None
    paths = find_local_paths(spec, project, files)
    assert paths == {sha(project / "tls/server.crt"): project / "tls/server.crt",
                     sha(project / "tls/server.key"): project / "tls/server.key"}


@pytest.mark.parametrize(("keyfile", "certfile", "field", "message"), [
    pytest.param("tls/nope.key", "tls/server.crt", "service.tls.keyfile", "'tls/nope.key' does not exist",
                 id="missing-key"),
    pytest.param("tls/server.key", "tls/nope.crt", "service.tls.certfile", "'tls/nope.crt' does not exist",
                 id="missing-cert"),
    pytest.param("tls", "tls/server.crt", "service.tls.keyfile", "'tls' is not a file", id="key-is-a-folder"),
    pytest.param("tls/other.key", "tls/server.crt", "service.tls.certfile",
                 "keyfile is not the private key of the certificate in certfile", id="mismatched"),
    pytest.param("tls/server.key", "tls/junk.pem", "service.tls.certfile", "certfile holds no PEM certificate",
                 id="cert-not-pem"),
    pytest.param("tls/server.key", "tls/server.key", "service.tls.certfile", "certfile holds no PEM certificate",
                 id="key-given-as-cert"),
    pytest.param("tls/junk.pem", "tls/server.crt", "service.tls.certfile", "keyfile holds no PEM private key",
                 id="key-not-pem"),
    pytest.param("tls/encrypted.key", "tls/server.crt", "service.tls.certfile",
                 "keyfile is encrypted; the load balancer needs a key without a passphrase", id="encrypted-key"),
])
def test_a_bad_pair_is_refused_naming_the_field(project: Path, tmp_path: Path, keyfile: str, certfile: str,
                                                field: str, message: str) -> None:
    spec = tls_task(keyfile, certfile)
    with pytest.raises(SpecError) as raised:
        check_task_sources(spec, project, str(project / "svc.yaml"))
    assert raised.value.path == field and message in raised.value.problem
    blobs = BlobStore(tmp_path / "blobs")
    with pytest.raises(SpecError, match=message):
        capture_task_files(spec, project, "svc.yaml", blobs)
    assert not blobs.root.exists(), "nothing is stored for a refused pair"
    key_lines = {line for path in project.glob("tls/*.key") for line in path.read_text().splitlines()[1:-1]}
    assert not any(line in str(raised.value) for line in key_lines), "no key material in the message"


def test_an_unreadable_key_is_refused_naming_the_field(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = open

    def denied(path: object, *args: object, **kwargs: object) -> object:
        if str(path).endswith("server.key"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(capture_module, "open", denied, raising=False)  # root reads every file: simulate it
    with pytest.raises(SpecError) as raised:
        check_task_sources(tls_task(), project, "svc.yaml")
    assert raised.value.path == "service.tls.keyfile"
    assert "cannot read" in raised.value.problem and "Permission denied" in raised.value.problem


def test_a_submission_with_a_bad_pair_stores_nothing(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = project / "svc.yaml"
    path.write_text("service:\n  replicas: 1\n  tls:\n    keyfile: tls/other.key\n    certfile: tls/server.crt\n"
                    "run: python app.py\n")
    controller = LocalController(home, FakeClock(), start_daemon=False)
    with pytest.raises(SpecError) as raised:
        controller.create_service("svc", load_task_file(path))
    assert raised.value.path == "service.tls.certfile"
    assert not (home / "blobs").exists()
    assert controller.get_status() == []


def test_a_submission_with_tls_shows_an_https_endpoint(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = project / "svc.yaml"
    path.write_text("service:\n  replicas: 1\n  tls:\n    keyfile: tls/server.key\n    certfile: tls/server.crt\n"
                    "run: python app.py\n")
    controller = LocalController(home, FakeClock(), start_daemon=False)
    service = controller.create_service("svc", load_task_file(path))
    assert service.endpoint == f"https://127.0.0.1:{service.lb_port}"
    (view,) = controller.get_status(["svc"])
    assert view.service.endpoint == service.endpoint and view.to_json()["endpoint"] == service.endpoint
    files = controller.get_rollout_state("svc").versions[0].files
    assert files is not None and files.tls is not None and len(files.blob_digests()) == 2
    assert all(BlobStore(home / "blobs").has(d) for d in files.blob_digests())


def test_a_remote_submission_uploads_the_pair_to_the_host(project: Path, tmp_path: Path) -> None:
    host_home = tmp_path / "host-home"
    path = project / "svc.yaml"
    path.write_text("service:\n  replicas: 1\n  tls:\n    keyfile: tls/server.key\n    certfile: tls/server.crt\n"
                    "run: python app.py\n")
    remote = RemoteController(InProcessTransport(host_home))
    service = remote.create_service("svc", load_task_file(path))
    assert service.endpoint.startswith("https://")
    files = remote.get_rollout_state("svc").versions[0].files
    assert files is not None and files.tls is not None
    host_blobs = BlobStore(host_home / "blobs")
    assert host_blobs.path_of(sha(project / "tls/server.key")).read_bytes() == (project / "tls/server.key").read_bytes()
    assert all(host_blobs.has(d) for d in files.blob_digests())

    path.write_text("service:\n  replicas: 1\n  tls:\n    keyfile: tls/other.key\n    certfile: tls/server.crt\n"
                    "run: python app.py\n")
    with pytest.raises(SpecError) as raised:  # checked on the client, where the files are
        remote.create_service("bad", load_task_file(path))
    assert raised.value.path == "service.tls.certfile"
