"""Secret values, kept apart from the task text and the state database.

``$SKY_LITE_HOME/secrets/`` (mode 0700) holds one file per value (mode 0600), named by its keyed digest:
an HMAC-SHA256 under a random key of this home (``.key``, 0600), so a stored digest (in a version's inputs,
in a plan) tells nothing about the value, not even by guessing it, to whoever lacks the key. Versions
store only digests; the value is read when a replica is launched. Equal values share a file; a changed
value has another digest, so an update sees that a secret changed without seeing either value.

Files are written to a temporary name, flushed and renamed, so a crash leaves either the whole value or
nothing under its digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets as random
from pathlib import Path

from skyserve_lite.errors import StateConflictError
from skyserve_lite.spec.model import Secret

_DIGEST_RE = re.compile(r"[0-9a-f]{32}")


class SecretStore:
    def __init__(self, home: Path) -> None:
        self.directory = home / "secrets"

    def _key(self) -> bytes:
        path = self.directory / ".key"
        try:
            return path.read_bytes()
        except FileNotFoundError:
            pass
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        with contextlib.suppress(FileExistsError):  # another submission made it first: use that one
            _write_new(path, random.token_bytes(32))
        return path.read_bytes()

    def digest(self, secret: Secret, *, make_key: bool = True) -> str:
        """The digest ``put`` would give ``secret``. Without ``make_key`` (a plan, which writes nothing) a
        home with no key yet uses a throwaway one: no stored digest exists for it to equal anyway."""
        key_path = self.directory / ".key"
        key = self._key() if make_key or key_path.exists() else random.token_bytes(32)
        return hmac.new(key, secret.value.encode(), hashlib.sha256).hexdigest()[:32]

    def put(self, secret: Secret) -> str:
        """Keep ``secret``; returns its digest."""
        digest = self.digest(secret)
        path = self.directory / digest
        if not path.exists():
            with contextlib.suppress(FileExistsError):  # the same value, put by another submission
                _write_new(path, secret.value.encode())
        return digest

    def get(self, digest: str) -> Secret:
        if not _DIGEST_RE.fullmatch(digest):
            raise StateConflictError(f"not a secret digest: {digest[:40]!r}")
        try:
            return Secret((self.directory / digest).read_bytes().decode())
        except FileNotFoundError:
            raise StateConflictError(f"a secret of this version is missing from {self.directory} (digest "
                                     f"{digest[:8]}...): submit the version again with --secret") from None

    def read_value(self, digest: str) -> str:
        """The text of the secret ``digest``, for the readers that need the text itself (the prober filling
        a probe header, the load balancer comparing API keys). Raises as ``get``."""
        return self.get(digest).value

    def collect(self, keep: set[str], older_than: float) -> int:
        """Remove every value whose digest is not in ``keep`` (the digests stored versions name) and that was
        put before ``older_than`` (a time): a submission puts its values moments before it stores the version
        that names them, so a young value may be about to be named."""
        removed = 0
        for path in self.directory.glob("*") if self.directory.is_dir() else ():
            if not _DIGEST_RE.fullmatch(path.name) or path.name in keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < older_than:
                    path.unlink()
                    removed += 1
        return removed


def _write_new(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (0600) whole or not at all; ``FileExistsError`` if it is there already."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{random.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.link(temporary, path)  # fails when the name exists: never replaces a value another writer put
    finally:
        temporary.unlink(missing_ok=True)
