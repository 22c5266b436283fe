"""`serve update --mode canary --dry-run` shows what the controller will do, from the controller's own step
planner: the canary's steps with the replicas each launches, then the promotion (no rolling forecast that
launches every replica at once beside them), and "nothing to judge" when every replica is reused."""

from __future__ import annotations

import json
from pathlib import Path

from .homes import IMAGE_V1, IMAGE_V2, versions, write
from .runner import Cli

V1, V2 = IMAGE_V1, IMAGE_V2
# Only the service section changes: every replica is reused.
SERVICE_ONLY = V1.replace("replicas: 4", "replicas: 4\n  canary: {steps: [20]}")


def test_a_canary_plan_shows_its_steps_with_their_launches_and_no_rolling_steps(cli: Cli, home: Path,
                                                                                 tmp_path: Path) -> None:
    code, stdout, stderr = cli("serve", "update", "svc", write(tmp_path, V2), "--mode", "canary", "--steps",
                               "10,50", "--bake", "2m", "--dry-run")
    assert code == 0, stderr
    text = " ".join(stdout.split())
    # Target 4: ceil(4 x 10%) = 1 new replica (5), then ceil(4 x 50%) = 2 (one more, 6), then the rest.
    assert "1. 10% on 1 new replica, bake 2m, then judged (launch 5)" in text
    assert "2. 50% on 2 new replicas, bake 2m, then judged (launch 6)" in text
    assert ("3. 100% (promoted): launch 7, 8; drain 1, 2, 3, 4 as the new replicas are READY (traffic: version 2)"
            in text)
    assert "Steps (each once" not in text and "launch 5, 6, 7, 8" not in text
    assert versions(home) == [1]


def test_every_replica_reused_is_nothing_to_judge_in_the_dry_run_too(cli: Cli, home: Path, tmp_path: Path) -> None:
    new = write(tmp_path, SERVICE_ONLY)
    code, stdout, stderr = cli("serve", "update", "svc", new, "--mode", "canary", "--dry-run")
    assert code == 0, stderr
    text = " ".join(stdout.split())
    assert "Canary steps" not in text and "then judged" not in text
    assert ("version 2 reuses every replica (same replica config): nothing to judge, it is current at once"
            in text)
    code, stdout, _ = cli("serve", "update", "svc", new, "--mode", "canary", "--dry-run", "-o", "json")
    plan = json.loads(stdout)
    assert "canary" not in plan and any("nothing to judge" in note for note in plan["notes"])
    assert versions(home) == [1]
