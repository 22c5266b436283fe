"""HTTPS at the load balancer, with the `service.tls` key and certificate of the service's current version.

The pair is the one captured when that version was submitted (``TaskFiles.tls``, in the blob store).
``TlsReloader`` writes it to the load balancer's private folder, ``$SKY_LITE_HOME/lb/<service>/tls``
(mode 0700, each file 0600: the only copy besides the blob store's), loads it into a new ``ssl.SSLContext``
and offers that as ``context``; the listener reads it for every connection it accepts, None meaning plain
HTTP.

An update that changes the pair, adds TLS or removes it is picked up within ``REFRESH_SECONDS``: the
connections accepted from then on get the new context (or plain HTTP), the open ones keep the one they
shook hands with, and no connection is cut. Each change builds a new context instead of calling
``load_cert_chain`` on the live one: a pair that fails to load then leaves the live context whole (OpenSSL
would have installed the new certificate before refusing its key). A failure is logged once per pair and
the previous context stays. At start there is no previous one, and ``start`` raises: a load balancer that
cannot serve the HTTPS its service asks for does not serve plain HTTP in its place.

No log line or message holds key material: the certificate is named by its sha256, the key never.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import ssl
from pathlib import Path
from typing import Final, Protocol

from skyserve_lite.files.blobs import BlobStore
from skyserve_lite.files.manifest import TLS_CERT, TLS_KEY, Manifest
from skyserve_lite.files.tls import TlsPairError, load_server_context

__all__ = ["REFRESH_SECONDS", "TlsError", "TlsReloader", "TlsSource", "tls_dir"]

log = logging.getLogger(__name__)

# How often the current version's pair is looked at: one indexed row read a second per load balancer
# (a changed version costs one more read), and a renewed certificate is served 1 s after the update.
REFRESH_SECONDS: Final = 1.0


class TlsError(Exception):
    """The current version's key and certificate cannot be served; the message says why (no key material)."""


class TlsSource(Protocol):
    def read(self) -> Manifest | None:
        """The `service.tls` pair of the service's current version (``TaskFiles.tls``); None when that
        version has no `service.tls`. Raises ``TlsError`` when it has one whose files are not in its
        snapshot."""
        ...


def tls_dir(home: Path, service: str, worker: int | None = None) -> Path:
    """The load balancer's private folder for the key and certificate of ``service``; with several worker
    processes (``lb.workers``), worker ``worker``'s own."""
    return home / "lb" / service / ("tls" if worker is None else f"tls-worker-{worker}")


class TlsReloader:
    """Keeps ``context`` on the current version's pair, as the module docstring says.

    The constructor only stores its arguments. ``start`` loads once (raises ``TlsError``), ``run`` then
    checks every ``refresh_seconds`` until cancelled, ``discard`` removes the private folder. Blocking work
    (the source, the disk, OpenSSL) runs through ``asyncio.to_thread``; ``context`` is set on the loop.
    """

    def __init__(self, service: str, source: TlsSource, blobs: BlobStore, directory: Path,
                 refresh_seconds: float = REFRESH_SECONDS) -> None:
        self.service = service
        self.context: ssl.SSLContext | None = None
        self._source = source
        self._blobs = blobs
        self._directory = directory
        self._refresh_seconds = refresh_seconds
        self._loaded: str | None = None  # the digest of the pair behind ``context``; None: plain HTTP
        self._refused: str | None = None  # the last failure logged, so that each is logged once

    async def start(self) -> None:
        """Load what the source says now. Raises ``TlsError``."""
        await self._refresh()

    async def run(self) -> None:
        """Check the source every ``refresh_seconds`` until cancelled; failures are logged, never raised."""
        while True:
            await asyncio.sleep(self._refresh_seconds)
            try:
                await self._refresh()
            except TlsError as exc:
                self._log_refusal(str(exc))
            except Exception:  # top of the loop: keep the context and try again next time
                log.exception("load balancer for service %s: checking the TLS certificate failed", self.service)

    def discard(self) -> None:
        """Remove the private folder, and ``lb/<service>`` when nothing else is in it (``lb/`` stays: other
        services' load balancers make their folders in it at any time). Idempotent."""
        shutil.rmtree(self._directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            self._directory.parent.rmdir()

    async def _refresh(self) -> None:
        manifest = await asyncio.to_thread(self._source.read)
        digest = None if manifest is None else manifest.digest
        if digest == self._loaded:
            return
        if manifest is None:
            await asyncio.to_thread(self.discard)
            self.context, self._loaded, self._refused = None, None, None
            log.info("load balancer for service %s: the current version has no service.tls; serving HTTP",
                     self.service)
            return
        context = await asyncio.to_thread(self._load, manifest)
        self.context, self._loaded, self._refused = context, digest, None
        cert = manifest.files[TLS_CERT].digest or ""
        log.info("load balancer for service %s: serving HTTPS with the certificate of sha256 %s", self.service,
                 cert[:12])

    def _load(self, manifest: Manifest) -> ssl.SSLContext:
        files = manifest.files
        if TLS_CERT not in files or TLS_KEY not in files:
            raise TlsError("the version's snapshot lacks its key or its certificate; submit it again with "
                           "`sky-lite serve update`")
        self._make_private_dir()
        for name in (TLS_CERT, TLS_KEY):
            digest = files[name].digest
            assert digest is not None
            try:
                self._blobs.copy_to(digest, self._directory / name, 0o600)
            except FileNotFoundError as exc:
                raise TlsError(f"{name}: its content (sha256 {digest[:12]}) is missing from the snapshot store; "
                               "submit the task again with `sky-lite serve update`") from exc
            except OSError as exc:
                raise TlsError(f"cannot write {self._directory / name}: {exc.strerror or exc}") from exc
        try:
            return load_server_context(self._directory / TLS_CERT, self._directory / TLS_KEY)
        except TlsPairError as exc:
            raise TlsError(str(exc)) from exc
        except OSError as exc:
            raise TlsError(f"cannot read {exc.filename}: {exc.strerror or exc}") from exc

    def _make_private_dir(self) -> None:
        try:
            self._directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self._directory, 0o700)  # mkdir's mode goes through the umask, and an old folder keeps its own
        except OSError as exc:
            raise TlsError(f"cannot make {self._directory}: {exc.strerror or exc}") from exc

    def _log_refusal(self, reason: str) -> None:
        if reason == self._refused:
            return
        self._refused = reason
        serving = "HTTPS with the previous certificate" if self.context is not None else "plain HTTP as before"
        log.error("load balancer for service %s: cannot load the current version's service.tls: %s; still serving "
                  "%s", self.service, reason, serving)
