"""HTTPS at the load balancer: the current version's pair from the blob store, written privately, served
from the next connection on after a change, never replaced by plain HTTP when it cannot load."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
import stat
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from skyserve_lite.clock import FakeClock
from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.files.capture import capture_task_files
from skyserve_lite.files.manifest import TLS_CERT, TLS_KEY, Manifest
from skyserve_lite.lb.__main__ import StoreTlsSource
from skyserve_lite.lb.proxy import LoadBalancer
from skyserve_lite.lb.server import HttpServer
from skyserve_lite.lb.tls import TlsError, TlsReloader, tls_dir
from skyserve_lite.spec.model import SubmittedTask
from skyserve_lite.spec.parse import parse_task
from skyserve_lite.state.models import LbView
from skyserve_lite.state.store import Store
from tests.files.certs import make_pair

from .serving import StaticSource

TLS_TEXT = "service:\n  replicas: 1\n  tls:\n    keyfile: {key}\n    certfile: {cert}\nrun: python app.py\n"
PLAIN_TEXT = "service:\n  replicas: 1\nrun: python app.py\n"


@dataclasses.dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pair, Pair]:
    folder = tmp_path_factory.mktemp("certs")
    return Pair(*make_pair(folder, "a")), Pair(*make_pair(folder, "b"))


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "home" / "blobs")


def captured(pair: Pair, blobs: BlobStore) -> SubmittedTask:
    text = TLS_TEXT.format(key=pair.key, cert=pair.cert)
    spec = parse_task(text)
    spec = dataclasses.replace(spec, files=capture_task_files(spec, pair.cert.parent, "svc.yaml", blobs))
    return SubmittedTask(text=text, source="svc.yaml", spec=spec)


def tls_of(pair: Pair, blobs: BlobStore) -> Manifest:
    files = captured(pair, blobs).spec.files
    assert files is not None and files.tls is not None
    return files.tls


class FakeTlsSource:
    """The current version's pair, as the test sets it."""

    def __init__(self, manifest: Manifest | None) -> None:
        self.manifest = manifest

    def read(self) -> Manifest | None:
        return self.manifest


def _backend() -> web.Application:
    async def answer(request: web.Request) -> web.Response:
        return web.Response(text=f"app over {request.headers.get('X-Forwarded-Proto')}")

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    return app


@contextlib.asynccontextmanager
async def serving(ssl_context: Callable[[], ssl.SSLContext | None]) -> AsyncIterator[int]:
    """The backend behind a load balancer whose connections get ``ssl_context()``; yields its port."""
    runner = web.AppRunner(_backend(), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        lb = LoadBalancer("svc", StaticSource(LbView((f"http://{host}:{port}",), "round_robin")), None,
                          FakeClock(0.0), hold_seconds=0)
        server = HttpServer(lb, ssl_context=ssl_context)
        await lb.start()
        try:
            yield (await server.start("127.0.0.1", 0))[0][1]
        finally:
            lb.stop_holding()
            await server.close()
            await lb.close()
    finally:
        await runner.cleanup()


async def https_get(port: int, cafile: Path) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(cafile))
    async with aiohttp.ClientSession() as session, \
            session.get(f"https://127.0.0.1:{port}/", ssl=context, timeout=aiohttp.ClientTimeout(total=10)) as got:
        return got.status, await got.text()


async def plain_exchange(port: int) -> bytes:
    """What a plain-HTTP request to ``port`` gets back before the connection ends."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def wait_for(predicate: Callable[[], bool]) -> None:
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


@pytest.mark.timeout(60)
def test_the_current_pair_is_served_over_https_and_written_privately(certs: tuple[Pair, Pair], blobs: BlobStore,
                                                                     tmp_path: Path) -> None:
    a, _ = certs
    directory = tls_dir(tmp_path / "home", "svc")
    reloader = TlsReloader("svc", FakeTlsSource(tls_of(a, blobs)), blobs, directory)

    async def body() -> None:
        await reloader.start()
        async with serving(lambda: reloader.context) as port:
            assert await https_get(port, a.cert) == (200, "app over https")
            assert b"app over" not in await plain_exchange(port)
            assert await https_get(port, a.cert) == (200, "app over https")  # still serving after that

    _run(body)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert sorted(p.name for p in directory.iterdir()) == sorted([TLS_CERT, TLS_KEY])
    assert stat.S_IMODE((directory / TLS_KEY).stat().st_mode) == 0o600
    assert stat.S_IMODE((directory / TLS_CERT).stat().st_mode) == 0o600
    assert (directory / TLS_KEY).read_bytes() == a.key.read_bytes()
    reloader.discard()
    assert not (tmp_path / "home" / "lb" / "svc").exists()


@pytest.mark.timeout(60)
def test_a_changed_pair_is_served_from_the_next_connection_and_open_ones_go_on(certs: tuple[Pair, Pair],
                                                                               blobs: BlobStore,
                                                                               tmp_path: Path) -> None:
    a, b = certs
    source = FakeTlsSource(tls_of(a, blobs))
    reloader = TlsReloader("svc", source, blobs, tls_dir(tmp_path / "home", "svc"), refresh_seconds=0.02)

    async def body() -> None:
        await reloader.start()
        reloading = asyncio.create_task(reloader.run())
        async with serving(lambda: reloader.context) as port:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ssl.create_default_context(cafile=str(a.cert)))
            before = reloader.context
            source.manifest = tls_of(b, blobs)
            await wait_for(lambda: reloader.context is not before)
            assert await https_get(port, b.cert) == (200, "app over https")
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await https_get(port, a.cert)
            # The connection made before the change keeps its handshake and is still answered.
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), 10)).endswith(b"app over https")
            writer.close()

            source.manifest = None  # an update without service.tls: plain HTTP from the next connection on
            await wait_for(lambda: reloader.context is None)
            assert (await plain_exchange(port)).endswith(b"app over http")
            assert not (tmp_path / "home" / "lb" / "svc").exists(), "the private copy goes with the TLS"
        reloading.cancel()

    _run(body)


@pytest.mark.timeout(60)
def test_a_pair_that_cannot_load_is_fatal_at_start(certs: tuple[Pair, Pair], blobs: BlobStore,
                                                   tmp_path: Path) -> None:
    a, _ = certs
    manifest = tls_of(a, blobs)
    key_digest = manifest.files[TLS_KEY].digest
    assert key_digest is not None
    blobs.path_of(key_digest).unlink()
    reloader = TlsReloader("svc", FakeTlsSource(manifest), blobs, tls_dir(tmp_path / "home", "svc"))
    with pytest.raises(TlsError, match=r"key.pem: its content \(sha256 [0-9a-f]{12}\) is missing"):
        asyncio.run(reloader.start())
    assert reloader.context is None


@pytest.mark.timeout(60)
def test_a_pair_that_cannot_load_later_keeps_the_previous_one_and_is_logged_once(
        certs: tuple[Pair, Pair], blobs: BlobStore, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a, b = certs
    source = FakeTlsSource(tls_of(a, blobs))
    reloader = TlsReloader("svc", source, blobs, tls_dir(tmp_path / "home", "svc"), refresh_seconds=0.02)
    mismatched = Manifest((tls_of(a, blobs).files[TLS_CERT], tls_of(b, blobs).files[TLS_KEY]))

    async def body() -> None:
        await reloader.start()
        before = reloader.context
        reloading = asyncio.create_task(reloader.run())
        async with serving(lambda: reloader.context) as port:
            source.manifest = mismatched
            await asyncio.sleep(0.3)  # about 15 checks
            assert reloader.context is before
            assert await https_get(port, a.cert) == (200, "app over https")
        reloading.cancel()

    with caplog.at_level(logging.INFO, logger="skyserve_lite.lb.tls"):
        _run(body)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "keyfile is not the private key of the certificate in certfile" in errors[0]
    assert "still serving HTTPS with the previous certificate" in errors[0]
    key_lines = a.key.read_text().splitlines()[1:-1] + b.key.read_text().splitlines()[1:-1]
    assert not any(line in caplog.text for line in key_lines), "no key material in the log"


@pytest.mark.timeout(60)
def test_failed_handshakes_are_counted_not_logged_per_connection(certs: tuple[Pair, Pair], blobs: BlobStore,
                                                                 tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    a, _ = certs
    reloader = TlsReloader("svc", FakeTlsSource(tls_of(a, blobs)), blobs, tls_dir(tmp_path / "home", "svc"))

    async def body() -> None:
        await reloader.start()
        async with serving(lambda: reloader.context) as port:
            for _ in range(5):
                assert b"app over" not in await plain_exchange(port)

    with caplog.at_level(logging.INFO, logger="skyserve_lite.lb.listener"):
        _run(body)
    lines = [r.getMessage() for r in caplog.records if "TLS handshake" in r.getMessage()]
    # The first at once, the other 4 in one line at the close (the 10 s interval had not passed).
    assert [line.split(": ", 1)[1].split(" (")[0] for line in lines] == [
        "1 TLS handshake(s) failed since the last report", "4 TLS handshake(s) failed since the last report"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_store_source_reads_the_current_versions_pair(certs: tuple[Pair, Pair], blobs: BlobStore,
                                                          tmp_path: Path) -> None:
    a, b = certs
    store = Store.open(tmp_path / "home")
    try:
        source = StoreTlsSource(store, "svc")
        assert source.read() is None  # no such service (yet)
        store.create_service("svc", captured(a, blobs), 30001, 0.0)
        assert source.read() == tls_of(a, blobs)
        store.add_version("svc", captured(b, blobs), "rolling", 1.0)
        assert source.read() == tls_of(b, blobs)
        store.add_version("svc", SubmittedTask(PLAIN_TEXT, "svc.yaml", parse_task(PLAIN_TEXT)), "rolling", 2.0)
        assert source.read() is None
        # A version whose spec has service.tls but no snapshot of it: refused, not served as plain HTTP.
        text = TLS_TEXT.format(key=a.key, cert=a.cert)
        store.add_version("svc", SubmittedTask(text, "svc.yaml", parse_task(text)), "rolling", 3.0)
        with pytest.raises(TlsError, match=r"version 4 has service\.tls but its snapshot holds no key"):
            source.read()
    finally:
        store.close()
