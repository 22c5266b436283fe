"""Update with real replica processes: scale-only reuses processes; a `run` change replaces every replica
while traffic keeps flowing; rollback returns to the first version's behaviour."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from .conftest import SkyLite, answering_run, http_get, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TASK = """\
service:
  readiness_probe:
    path: /
    initial_delay_seconds: 60
  replicas: {replicas}
envs:
  GREETING: {greeting}
""" + answering_run('os.environ["GREETING"] + " " + os.environ["SKY_LITE_REPLICA_ID"]')


def replicas(sky: SkyLite) -> dict[int, tuple[int, str, str]]:
    service = sky.status("greeter")["services"][0]
    return {r["replica_id"]: (r["version"], r["status"], r["instance_id"]) for r in service["replicas"]}


def settled(sky: SkyLite, version: int, count: int) -> bool:
    rows = replicas(sky)
    return len(rows) == count and all(v == version and s == "READY" for v, s, _ in rows.values())


def test_scale_only_update_then_replacing_update_then_rollback(sky: SkyLite, tmp_path: Path) -> None:
    v1 = tmp_path / "v1.yaml"
    v1.write_text(TASK.format(replicas=2, greeting="hello"))
    endpoint = sky.run("serve", "up", str(v1), "-n", "greeter").stdout.rsplit(" ", 1)[1].strip()
    before = replicas(sky)

    # Scale only: the two processes stay, their version is bumped, exactly one replica is added.
    v2 = tmp_path / "v2.yaml"
    v2.write_text(TASK.format(replicas=3, greeting="hello"))
    out = sky.run("serve", "update", "greeter", str(v2), "-y").stdout
    assert "reuse 2, replace 0, launch 1, terminate 0" in out
    wait_until(lambda: settled(sky, 2, 3), timeout=60, message="version 2 with 3 READY replicas")
    after = replicas(sky)
    assert {rid: after[rid][2] for rid in before} == {rid: before[rid][2] for rid in before}
    assert sorted(after) == [1, 2, 3]

    # `run`'s environment changes: every replica is replaced, and requests keep succeeding throughout.
    failures: list[int] = []
    answers: set[str] = set()
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            status, body = http_get(endpoint + "/")
            answers.add(body.split(" ")[0])
            if status != 200:
                failures.append(status)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        v3 = tmp_path / "v3.yaml"
        v3.write_text(TASK.format(replicas=3, greeting="bonjour"))
        out = sky.run("serve", "update", "greeter", str(v3), "-y").stdout
        assert "reuse 0, replace 3, launch 3, terminate 3" in out
        assert "envs.GREETING: hello -> bonjour" in out
        wait_until(lambda: settled(sky, 3, 3), timeout=90, message="version 3 with 3 READY replicas")
    finally:
        stop.set()
        worker.join(10)
    assert failures == []
    assert answers == {"hello", "bonjour"}
    assert sorted(replicas(sky)) == [4, 5, 6]

    # Rollback to version 2's text (the previous one): replaced again, answers say hello.
    out = sky.run("serve", "rollback", "greeter", "-y").stdout
    assert "replace 3" in out
    wait_until(lambda: settled(sky, 4, 3), timeout=90, message="version 4 (rollback) READY")
    assert http_get(endpoint + "/")[1].startswith("hello ")
    history = sky.run("serve", "history", "greeter").stdout
    assert "rollback to version 2" in history
