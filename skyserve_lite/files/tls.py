"""The `service.tls` pair: loading a certificate chain and its private key as a server context.

One function for both ends: a submission checks that the files it captures load (``files.capture``), and
the load balancer loads them from its private copy (``lb.tls``). Nothing here reads the key's bytes
itself, and no message carries them: OpenSSL's reasons name what is wrong, never the content.

A passphrase-protected key is refused instead of prompting for its passphrase on the terminal (OpenSSL's
default when no ``password`` is given): a load balancer has no terminal.
"""

from __future__ import annotations

import ssl
from pathlib import Path


class TlsPairError(Exception):
    """The certificate and key do not load together; the message says why, naming ``certfile`` and
    ``keyfile`` by those words (the caller knows their paths)."""


def load_server_context(certfile: Path, keyfile: Path) -> ssl.SSLContext:
    """A server context holding the chain in ``certfile`` and the key in ``keyfile``, both PEM. Raises
    ``TlsPairError``, or ``OSError`` when a file cannot be read."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=str(certfile))  # only to tell "no certificate" from a bad key
    except ssl.SSLError as exc:
        raise TlsPairError("certfile holds no PEM certificate" + _reason(exc)) from exc
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    asked: list[bool] = []

    def no_passphrase() -> bytes:
        asked.append(True)
        return b""

    try:
        context.load_cert_chain(str(certfile), str(keyfile), password=no_passphrase)
    except ssl.SSLError as exc:
        if asked:
            raise TlsPairError("keyfile is encrypted; the load balancer needs a key without a passphrase") from exc
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsPairError("keyfile is not the private key of the certificate in certfile") from exc
        raise TlsPairError("keyfile holds no PEM private key" + _reason(exc)) from exc
    return context


def _reason(exc: ssl.SSLError) -> str:
    """`` (NO_CERTIFICATE_OR_CRL_FOUND)``: OpenSSL's reason, when it gives one ("PEM lib" says nothing)."""
    return f" ({exc.reason})" if exc.reason else ""
