"""A version is everything its replicas run, with real processes: the workdir is captured when the task is
submitted, a replacement replica runs the submitted code (not the file edited on disk since), a rollback
runs exactly the old version's files, and taking the service down leaves no snapshot data behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from .conftest import SkyLite, http_get, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TASK = """\
workdir: ./app
service:
  readiness_probe:
    path: /
    initial_delay_seconds: 60
  replicas: 2
run: exec python3 -u serve.py
"""

SERVER = """\
import http.server, os
BODY = open("message.txt").read().strip().encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def ready_replicas(sky: SkyLite, version: int) -> list[dict[str, object]]:
    service = sky.status("web")["services"][0]
    return [r for r in service["replicas"] if r["status"] == "READY" and r["version"] == version]


def answers(endpoint: str, count: int = 12) -> set[str]:
    return {http_get(endpoint + "/")[1] for _ in range(count)}


def test_replicas_run_the_submitted_files_and_rollback_runs_the_old_ones(sky: SkyLite, tmp_path: Path) -> None:
    project = tmp_path / "project"
    sky.cwd = project  # relative paths in the task are read from the directory sky-lite runs in
    (project / "app").mkdir(parents=True)
    (project / "app" / "serve.py").write_text(SERVER)
    (project / "app" / "message.txt").write_text("version one")
    (project / "app" / ".skyignore").write_text("*.log\n")
    (project / "app" / "debug.log").write_text("left out")
    task = project / "web.yaml"
    task.write_text(TASK)
    endpoint = sky.run("serve", "up", str(task), "-n", "web").stdout.rsplit(" ", 1)[1].strip()
    wait_until(lambda: len(ready_replicas(sky, 1)) == 2, timeout=60, message="two READY replicas of version 1")
    assert answers(endpoint) == {"version one"}
    assert not list((sky.home / "replicas" / "web").glob("*/workdir/debug.log"))  # .skyignore honoured

    # Version 2 changes the code; the plan names the file.
    (project / "app" / "message.txt").write_text("version two")
    out = sky.run("serve", "update", "web", str(task), "-y").stdout
    assert "workdir: contents changed (1 file: message.txt)" in out
    wait_until(lambda: len(ready_replicas(sky, 2)) == 2 and answers(endpoint) == {"version two"}, timeout=90,
               message="version 2 serving everywhere")

    # Edit the file on disk without `serve update`, then lose a replica: the replacement runs version 2.
    (project / "app" / "message.txt").write_text("never submitted")
    victim = ready_replicas(sky, 2)[0]
    (directory,) = (sky.home / "replicas" / "web").glob(f"{victim['replica_id']}-*")
    os.killpg(int((directory / "pid").read_text().split()[0]), signal.SIGKILL)
    wait_until(lambda: len(ready_replicas(sky, 2)) == 2
               and victim["replica_id"] not in {r["replica_id"] for r in ready_replicas(sky, 2)},
               timeout=60, message="a replacement replica READY")
    assert answers(endpoint) == {"version two"}

    # Roll back to version 1: every replica serves version 1's text, whatever the disk says now.
    out = sky.run("serve", "rollback", "web", "--to", "1", "-y").stdout
    assert "rollback to version 1" in sky.run("serve", "history", "web").stdout
    wait_until(lambda: len(ready_replicas(sky, 3)) == 2 and answers(endpoint) == {"version one"}, timeout=90,
               message="the rollback serving version 1's files")
    history = sky.run("serve", "history", "web", "-o", "json").stdout
    assert '"digest"' in history

    assert (sky.home / "blobs").is_dir()
    sky.run("serve", "down", "web", "-y")
    assert not (sky.home / "blobs").exists()  # the last service is gone: no snapshot data left behind
    assert not (sky.home / "replicas" / "web").exists()
