"""Secrets with real processes: a local replica gets its secret and an `envs: null` value from the command
line, answers with a digest of them over the load balancer, and afterwards no file of the home (the state
database, every log, the replica's directory) nor any output holds the secret; an update with a new value
replaces the replica, saying so without the value."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from .conftest import SkyLite, answering_run, http_get, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FIRST = "s3cr3t-first-3f9a1c"
SECOND = "s3cr3t-second-77b2e0"
TASK = """\
name: tokened
envs:
  GREETING: null
secrets:
  API_TOKEN: null
service:
  readiness_probe:
    path: /
    initial_delay_seconds: 30
    timeout_seconds: 2
  replicas: 1
""" + answering_run('os.environ["GREETING"] + " " + hashlib.sha256(os.environ["API_TOKEN"].encode()).hexdigest()'
                    ' + "\\n"')


def files_holding(home: Path, needle: str) -> list[str]:
    """Every file under ``home`` holding ``needle``, the secret store itself aside."""
    return sorted(str(path.relative_to(home)) for path in home.rglob("*")
                  if path.is_file() and path.parent.name != "secrets" and needle.encode() in path.read_bytes())


def test_a_secret_reaches_the_replica_and_nothing_else(sky: SkyLite, tmp_path: Path) -> None:
    task = tmp_path / "tokened.yaml"
    task.write_text(TASK)
    outputs = []
    up = sky.run("serve", "up", str(task), "--env", "GREETING=hello", "--secret", f"API_TOKEN={FIRST}",
                 "--timeout", "90")
    outputs.append(up.stdout + up.stderr)
    endpoint = sky.status("tokened")["services"][0]["endpoint"]
    code, body = http_get(endpoint)
    assert code == 200 and body.strip() == f"hello {hashlib.sha256(FIRST.encode()).hexdigest()}"

    plan = sky.run("serve", "update", "tokened", str(task), "--secret", f"API_TOKEN={SECOND}", "--dry-run")
    outputs.append(plan.stdout + plan.stderr)
    assert "secrets.API_TOKEN: changed" in plan.stdout and "replace" in plan.stdout
    done = sky.run("serve", "update", "tokened", str(task), "--secret", f"API_TOKEN={SECOND}", "-y")
    outputs.append(done.stdout + done.stderr)
    wanted = f"hello {hashlib.sha256(SECOND.encode()).hexdigest()}"
    wait_until(lambda: http_get(endpoint) == (200, wanted + "\n"), timeout=90, message="the new secret served")

    for command in (("serve", "status", "tokened"), ("serve", "status", "-o", "json"),
                    ("serve", "history", "tokened"), ("serve", "history", "tokened", "-o", "json"),
                    ("serve", "logs", "tokened", "--controller", "--no-follow"),
                    ("serve", "logs", "tokened", "1", "--no-follow")):
        result = sky.run(*command, check=False)
        outputs.append(result.stdout + result.stderr)
    for value in (FIRST, SECOND):
        assert all(value not in output for output in outputs)
        assert files_holding(sky.home, value) == []
    stored = sorted(p.name for p in (sky.home / "secrets").iterdir())
    assert ".key" in stored and len(stored) == 3  # the key and the two values, each under its digest
