"""Self-signed certificates made at test time with the system's openssl, for the `service.tls` tests."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_pair(directory: Path, stem: str, address: str = "127.0.0.1") -> tuple[Path, Path]:
    """``directory/<stem>.crt`` and ``<stem>.key``: a fresh RSA key and a self-signed certificate for the IP
    ``address`` (in its subject and subjectAltName, so that clients verify it against that address)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", f"/CN={address}", "-addext", f"subjectAltName=IP:{address}",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def encrypt_key(key: Path, out: Path, passphrase: str = "secret") -> Path:
    """``key`` protected by ``passphrase``, written to ``out``."""
    subprocess.run(["openssl", "pkey", "-in", str(key), "-aes256", "-passout", f"pass:{passphrase}", "-out",
                    str(out)], check=True, capture_output=True, timeout=60)
    return out
