"""A readiness probe that carries a secret, with real processes: the replica answers its probe (a POST to
``/health/$MODEL_NAME`` with ``{"model": "$MODEL_NAME"}``) only with ``Authorization: Bearer $API_KEY``, so
the service becomes READY only when the controller's prober filled the secret into the request; and the
value is then found nowhere but in the secret store: no file of the home, no log, no output."""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .conftest import SkyLite, http_get

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

MODEL = "tiny-lm-7b"
# The replica: `/` for everyone; its probe path only for a POST naming the model, with the secret as a bearer
# token (401 without it). The token expected is built from the environment the replica gets, so a probe that
# sent `$API_KEY` as written, or nothing, is refused. The first probe that passes those checks still gets 503,
# so the controller also handles (records, shows) a failed probe that carried the secret. The request log
# (stderr, the replica's log) holds request lines only, never a header.
TASK = """\
name: {name}
envs:
  MODEL_NAME: {model}
secrets:
  API_KEY: null
service:
  readiness_probe:
    path: /health/$MODEL_NAME
    post_data:
      model: $MODEL_NAME
    headers:
      Authorization: Bearer $API_KEY
    initial_delay_seconds: 30
    timeout_seconds: 2
  replicas: 1
run: |
  exec python3 -u -c '
  import http.server, json, os
  EXPECTED = "Bearer " + os.environ["API_KEY"]
  MODEL = os.environ["MODEL_NAME"]
  WARMING = [True]
  class Handler(http.server.BaseHTTPRequestHandler):
      def answer(self, code, text):
          body = text.encode()
          self.send_response(code)
          self.send_header("Content-Length", str(len(body)))
          self.end_headers()
          self.wfile.write(body)
      def do_GET(self):
          if self.path == "/":
              self.answer(200, "hello from " + MODEL + "\\n")
          else:
              self.answer(404, "no such page\\n")
      def do_POST(self):
          body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
          if self.path != "/health/" + MODEL:
              self.answer(404, "no such probe path\\n")
          elif self.headers.get("Authorization") != EXPECTED:
              self.answer(401, "unauthorized\\n")
          elif json.loads(body or b"null") != {{"model": MODEL}}:
              self.answer(400, "wrong model\\n")
          elif WARMING:
              WARMING.clear()
              self.answer(503, "warming up\\n")
          else:
              self.answer(200, "ready\\n")
  http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
  '
"""


def post(url: str, data: bytes, headers: dict[str, str]) -> int:
    """The status of a POST to ``url`` (a replica on 127.0.0.1)."""
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def searched_files(home: Path) -> dict[str, bytes]:
    """Every file under ``home`` (``state.db`` and its journals, every log, the replicas' directories) by its
    path there, as bytes, the secret store aside: ``secrets/`` keeps each value, unencrypted, in a file named
    by its keyed digest (``state/secrets.py``); that is where the value lives by design, read when a replica
    is launched and when a probe is sent. Only that folder is left out, not any other folder of that name."""
    store = home / "secrets"
    return {str(path.relative_to(home)): path.read_bytes() for path in sorted(home.rglob("*"))
            if path.is_file() and path.parent != store}


def test_a_probe_secret_reaches_the_replica_in_the_request_only(sky: SkyLite, tmp_path: Path) -> None:
    value = f"pk-{secrets.token_hex(16)}"
    task = tmp_path / "guarded.yaml"
    task.write_text(TASK.format(name="guarded", model=MODEL))
    outputs: dict[str, str] = {}  # what each command printed, stdout and stderr

    up = sky.run("serve", "up", str(task), "--secret", f"API_KEY={value}", "--timeout", "45")
    outputs["serve up"] = up.stdout + up.stderr
    assert up.stdout.startswith("Service guarded is READY at http://127.0.0.1:"), outputs["serve up"]
    (service,) = sky.status()["services"]
    assert service["status"] == "READY"
    (replica,) = service["replicas"]
    assert replica["status"] == "READY"

    # READY means the probe got 200; the replica gives 200 only with the secret filled in: without the
    # header, with the reference as written, or with another token it answers 401.
    probe_url = f"{replica['url']}/health/{MODEL}"
    assert probe_url.startswith("http://127.0.0.1:")
    body = json.dumps({"model": MODEL}).encode()
    json_type = {"Content-Type": "application/json"}
    assert post(probe_url, body, json_type) == 401
    assert post(probe_url, body, {**json_type, "Authorization": "Bearer $API_KEY"}) == 401
    assert post(probe_url, body, {**json_type, "Authorization": "Bearer not-the-key"}) == 401
    assert post(probe_url, body, {**json_type, "Authorization": f"Bearer {value}"}) == 200
    assert post(probe_url, b'{"model": "other"}', {**json_type, "Authorization": f"Bearer {value}"}) == 400

    assert http_get(service["endpoint"] + "/") == (200, f"hello from {MODEL}\n")

    # The probes the replica answered: the controller's, at the path filled in from envs, refused once while
    # warming up, then 200.
    replica_log = sky.run("serve", "logs", "guarded", "1", "--no-follow").stdout
    probes = [line.rsplit('"', 1)[1].split()[0] for line in replica_log.splitlines()
              if f'"POST /health/{MODEL} HTTP/1.1"' in line]
    assert probes[:2] == ["503", "200"], replica_log
    outputs["serve logs 1"] = replica_log

    # The stored probe keeps the reference: no value to find, but the field is there to look in.
    database = b"".join(path.read_bytes() for path in sky.home.glob("state.db*"))
    assert b"Bearer $API_KEY" in database

    plan_task = tmp_path / "guarded-plan.yaml"
    plan_task.write_text(TASK.format(name="guarded-plan", model=MODEL))
    commands = {
        "status": ("serve", "status"), "status json": ("serve", "status", "-o", "json"),
        "history": ("serve", "history", "guarded"), "history json": ("serve", "history", "guarded", "-o", "json"),
        "dry run": ("serve", "up", str(plan_task), "--secret", f"API_KEY={value}", "--dry-run"),
        "dry run json": ("serve", "up", str(plan_task), "--secret", f"API_KEY={value}", "--dry-run", "-o", "json"),
        "controller log": ("serve", "logs", "guarded", "--controller", "--no-follow"),
        "load balancer log": ("serve", "logs", "guarded", "--load-balancer", "--no-follow"),
    }
    stdouts = {}
    for label, command in commands.items():
        result = sky.run(*command)
        stdouts[label] = result.stdout
        outputs[label] = result.stdout + result.stderr
    # The plan names the secret it was given (so the value went through it), and launches nothing.
    assert "API_KEY (secret)" in outputs["dry run"], outputs["dry run"]
    assert json.loads(stdouts["dry run json"])["secrets"] == ["API_KEY"]
    assert [s["name"] for s in sky.status()["services"]] == ["guarded"]

    assert [label for label, output in outputs.items() if value in output] == []
    files = searched_files(sky.home)
    assert {"state.db", "logs/controller.log", "logs/load-balancer-guarded.log"} <= files.keys()
    assert any(name.endswith("/replica.log") for name in files)
    assert [name for name, data in files.items() if value.encode() in data] == []
    # The value was stored, in the one place left out above.
    assert [p.name for p in (sky.home / "secrets").iterdir() if value.encode() in p.read_bytes()] != []

    down = sky.run("serve", "down", "guarded", "-y")
    assert down.stdout == "Service guarded is down.\n"
    assert value not in down.stderr
    assert sky.processes() == []
    assert sky.status()["services"] == []
    # Taking the service down logs and stores more: still without the value.
    assert [name for name, data in searched_files(sky.home).items() if value.encode() in data] == []
