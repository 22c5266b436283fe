"""`service.tls` with real processes: a local replica behind a load balancer that serves HTTPS with a
self-signed certificate made here, and an update that renews the certificate without new replicas."""

from __future__ import annotations

import re
import socket
import ssl
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.files.certs import make_pair

from .conftest import SkyLite, answering_run, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TASK = """\
name: secure
service:
  readiness_probe:
    path: /
    initial_delay_seconds: 30
    timeout_seconds: 2
  replicas: 1
  tls:
    keyfile: {key}
    certfile: {cert}
""" + answering_run('"secure hello over " + str(self.headers.get("X-Forwarded-Proto")) + "\\n"')


def https_get(url: str, cafile: Path) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(cafile))
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        return response.status, response.read().decode()


def plain_http_answer(port: int) -> bytes:
    """What a plain-HTTP request to the port gets before the connection ends."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        return received


def is_verified_by(url: str, cafile: Path) -> bool:
    try:
        return https_get(url, cafile)[0] == 200
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLCertVerificationError):
            return False
        raise


def test_the_load_balancer_serves_https_with_the_tasks_certificate(sky: SkyLite, tmp_path: Path) -> None:
    project = tmp_path / "project"
    sky.cwd = project  # relative paths in the task are read from the directory sky-lite runs in
    make_pair(project / "tls", "v1")
    make_pair(project / "tls", "v2")
    task = project / "secure.yaml"
    task.write_text(TASK.format(key="tls/v1.key", cert="tls/v1.crt"))  # relative to the directory sky-lite runs in

    result = sky.run("serve", "up", str(task))
    match = re.fullmatch(r"Service secure is READY at (https://127\.0\.0\.1:(\d+))\n", result.stdout)
    assert match, result.stdout
    endpoint, port = match.group(1), int(match.group(2))
    (service,) = sky.status()["services"]
    assert service["endpoint"] == endpoint
    assert endpoint in sky.run("serve", "status").stdout

    assert https_get(endpoint + "/", project / "tls" / "v1.crt") == (200, "secure hello over https\n")
    answer = plain_http_answer(port)
    assert b"secure hello" not in answer and not answer.startswith(b"HTTP/"), answer

    # The load balancer's private folder; each worker's own when it runs as several processes (lb.workers).
    folders = sorted((sky.home / "lb" / "secure").glob("tls*"))
    assert [folder.name for folder in folders] in (["tls"], [f"tls-worker-{k}" for k in range(len(folders))])
    for folder in folders:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE((folder / "key.pem").stat().st_mode) == 0o600
        assert (folder / "key.pem").read_bytes() == (project / "tls" / "v1.key").read_bytes()
    log = sky.run("serve", "logs", "secure", "--load-balancer", "--no-follow").stdout
    assert f"listening on 127.0.0.1:{port}" in log and " over HTTPS " in log
    key_lines = (project / "tls" / "v1.key").read_text().splitlines()[1:-1]
    assert not any(line in log for line in key_lines), "no key material in the load balancer's log"

    # A renewed certificate: the service setting changes, the replica stays, the load balancer reloads.
    renewed = project / "renewed.yaml"
    renewed.write_text(TASK.format(key="tls/v2.key", cert="tls/v2.crt"))
    out = sky.run("serve", "update", "secure", str(renewed), "-y").stdout
    assert "reuse 1, replace 0" in out, out
    wait_until(lambda: is_verified_by(endpoint + "/", project / "tls" / "v2.crt"), timeout=30,
               message="the renewed certificate served")
    assert not is_verified_by(endpoint + "/", project / "tls" / "v1.crt")
    assert [r["replica_id"] for r in sky.status()["services"][0]["replicas"]] == [1]

    assert sky.run("serve", "down", "secure", "-y").stdout == "Service secure is down.\n"
    assert not (sky.home / "lb" / "secure").exists(), "the key's private copy goes with the load balancer"


def test_a_mismatched_pair_is_refused_at_submit(sky: SkyLite, tmp_path: Path) -> None:
    project = tmp_path / "project"
    sky.cwd = project  # relative paths in the task are read from the directory sky-lite runs in
    make_pair(project / "tls", "a")
    make_pair(project / "tls", "b")
    task = project / "secure.yaml"
    task.write_text(TASK.format(key="tls/b.key", cert="tls/a.crt"))
    result = sky.run("serve", "up", str(task), check=False)
    assert result.returncode == 2
    assert "service.tls.certfile" in result.stderr and "not the private key" in result.stderr
    assert not (sky.home / "blobs").exists()
