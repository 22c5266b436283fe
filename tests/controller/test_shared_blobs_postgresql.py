"""Two controller hosts on one PostgreSQL database, each with its own state directory: a version whose
files were captured on one host launches a replica on the other with the same files, read from the database
(the other host's blob folder never had them)."""

from __future__ import annotations

import dataclasses
import io
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyserve_lite.clock import FakeClock, SystemClock
from skyserve_lite.controller.lb_runner import FakeLoadBalancerRunner
from skyserve_lite.controller.probe import FakeProber
from skyserve_lite.controller.reconcile import Reconciler
from skyserve_lite.controller.settings import ControllerSettings
from skyserve_lite.files.blobs import SHARED_GRACE_SECONDS, BlobStore, blob_store_of
from skyserve_lite.files.capture import capture_task_files
from skyserve_lite.providers.local import LocalProvider
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state import pg
from skyserve_lite.state.blob_table import BlobTable
from skyserve_lite.state.dburl import find_database_url
from skyserve_lite.state.store import Store
from tests.postgres import PostgresServer

TEXT = """\
service:
  replicas: 1
workdir: app
file_mounts:
  /data/weights.bin: weights.bin
run: exec sleep 60
"""


@pytest.fixture
def database(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = postgres_server.create_database()
    monkeypatch.setenv("SKY_LITE_DB_URL", postgres_server.url(name))
    yield name
    postgres_server.drop_database(name)


def test_a_version_captured_on_one_host_launches_on_another_with_the_same_files(
        tmp_path: Path, database: str) -> None:
    project = tmp_path / "project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "main.txt").write_text("from host a")
    # 2.5 MiB: three chunks in the database, the last one short.
    weights = random.Random(7).randbytes(5 * (1 << 19))
    (project / "weights.bin").write_bytes(weights)

    home_a, home_b = tmp_path / "host-a", tmp_path / "host-b"
    store_a = Store.open(home_a)
    spec = parse_task(TEXT)
    spec = dataclasses.replace(spec, files=capture_task_files(spec, project, "<test>", blob_store_of(home_a)))
    store_a.create_service("svc", SubmittedTask(text=TEXT, source=str(project / "svc.yaml"), spec=spec), 30001, 1.0)
    store_a.close()
    assert spec.files is not None
    assert not (home_b / "blobs").exists()

    store_b = Store.open(home_b)
    blobs_b = blob_store_of(home_b)
    provider = LocalProvider(home_b, SystemClock(), grace_seconds=1, blobs=blobs_b)
    reconciler = Reconciler(store_b, {"local": provider}, FakeProber(), FakeLoadBalancerRunner(), FakeClock(),
                            ControllerSettings(), blobs=blobs_b)
    try:
        reconciler.reconcile_once()
        (replica,) = store_b.list_replicas("svc")
        assert replica.instance_id is not None, replica.status_reason
        (workdir,) = (home_b / "replicas" / "svc").glob("1-*/workdir")
        assert (workdir / "main.txt").read_text() == "from host a"
        assert (workdir / "data" / "weights.bin").read_bytes() == weights
        # Read from the database into host b's own folder, once.
        assert BlobStore(home_b / "blobs").digests() == set(spec.files.blob_digests())
    finally:
        provider.terminate([i.instance_id for i in provider.list_instances()])
        store_b.close()


def test_a_blob_is_written_to_the_database_once_and_collected_only_past_the_grace(
        tmp_path: Path, database: str) -> None:
    Store.open(tmp_path / "a").close()  # the schema
    url = find_database_url(tmp_path / "a", os.environ)
    assert url is not None
    now = [1000.0]
    a = BlobStore(tmp_path / "a" / "blobs", shared=lambda: BlobTable(pg.connect(url)), now=lambda: now[0])
    b = blob_store_of(tmp_path / "b")
    digest, _ = a.put(io.BytesIO(b"shared bytes"))
    again, _ = b.put(io.BytesIO(b"shared bytes"))  # host b stores the same file: one copy stays
    assert again == digest and b.has(digest)
    assert a.collect_garbage(set) == 1  # a's own file; the database's copy is younger than the grace
    assert b.has(digest) and blob_store_of(tmp_path / "c").has(digest)
    now[0] += SHARED_GRACE_SECONDS + 1
    assert a.collect_garbage(set) == 1  # now the database's copy goes too
    assert not blob_store_of(tmp_path / "c").has(digest)


def test_a_blob_write_that_fails_midway_stores_nothing_and_the_next_one_stores_it(
        tmp_path: Path, database: str) -> None:
    Store.open(tmp_path / "a").close()  # the schema
    url = find_database_url(tmp_path / "a", os.environ)
    assert url is not None
    table = BlobTable(pg.connect(url))
    data = [b"first chunk", b"second chunk"]

    def broken() -> Iterator[bytes]:
        yield b"a stale first"  # kept, were the failed write's chunk left in place, over the retry's
        raise OSError("the source file went away")

    try:
        with pytest.raises(OSError, match="went away"):
            table.put("d" * 64, 23, broken(), 1000.0)
        assert not table.has("d" * 64)
        table.put("d" * 64, 23, iter(data), 1000.0)  # the connection is usable again: rolled back, not stuck
        assert b"".join(table.read("d" * 64)) == b"".join(data)
    finally:
        table.close()
