"""`serve update --mode canary` and `serve rollout` through the CLI: each flag checked and named, the dry run
shows the steps, the settings stored with the version, the person's command stored for the controller, and
a wait that ends with the rollback line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import skyserve_lite.state.store as store_module
from skyserve_lite.plan.canary import CanaryPhase, CanarySettings, CanaryState, Command
from skyserve_lite.state.models import StoredCanary
from skyserve_lite.state.store import Store, _upsert_canary

from .homes import IMAGE_V1, IMAGE_V2, write
from .runner import Cli

V1, V2 = IMAGE_V1, IMAGE_V2


def stored(home: Path) -> tuple[list[int], dict[str, CanaryState]]:
    store = Store.open(home)
    try:
        return ([v.version for v in store.list_versions("svc")],
                {name: c.state for name, c in store.list_canaries().items()})
    finally:
        store.close()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--steps", "50,10"], "--steps: steps must increase, not [50, 10]"),
        (["--steps", "10,100"], "--steps: each step is a percentage above 0 and below 100"),
        (["--steps", "ten"], "--steps: 'ten' is not a list of whole percentages"),
        (["--bake", "soon"], "--bake: 'soon' is not a duration"),
        (["--bake", "0s"], "--bake: must be a positive duration"),
        (["--bake", "30m"], "--bake: 30m extended up to 3 times is a window of 120m: at most 60m"),
        (["--max-error-rate", "lots"], "--max-error-rate: 'lots' is not a rate"),
        (["--max-error-rate", "150%"], "--max-error-rate: must be a fraction from 0 to below 1"),
    ],
)
def test_each_bad_flag_is_named_and_nothing_is_stored(cli: Cli, home: Path, tmp_path: Path, flags: list[str],
                                                      message: str) -> None:
    code, _, stderr = cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "-y", *flags)
    assert code == 2
    assert message in stderr
    assert stored(home) == ([1], {})


def test_a_canary_flag_without_the_canary_mode_is_refused(cli: Cli, home: Path, tmp_path: Path) -> None:
    code, _, stderr = cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--bake", "30s", "-y")
    assert code == 2
    assert "--bake goes with --mode canary" in stderr
    assert stored(home) == ([1], {})


def test_the_dry_run_shows_the_steps(cli: Cli, home: Path, tmp_path: Path) -> None:
    new = write(tmp_path, V2)
    code, stdout, stderr = cli("serve", "update", "--no-wait", "svc", new, "--mode", "canary", "--steps", "10,50",
                               "--bake", "2m", "--dry-run")
    assert code == 0, stderr
    text = " ".join(stdout.split())
    assert "1. 10% on 1 new replica, bake 2m, then judged" in text
    assert "2. 50% on 2 new replicas, bake 2m, then judged" in text
    assert "3. 100% (promoted)" in text
    code, stdout, _ = cli("serve", "update", "--no-wait", "svc", new, "--mode", "canary", "--steps", "25",
                          "--dry-run", "-o", "json")
    assert json.loads(stdout)["canary"] == [{"percent": 25, "new_replicas": 1, "bake_seconds": 120.0, "launch": [5]}]
    assert stored(home) == ([1], {})


def test_the_flags_over_the_task_section_are_stored_with_the_version(cli: Cli, home: Path, tmp_path: Path) -> None:
    text = V2.replace("replicas: 4", "replicas: 4\n  canary: {steps: [5, 20], min_requests: 10}")
    code, stdout, stderr = cli("serve", "update", "--no-wait", "svc", write(tmp_path, text), "--mode", "canary",
                               "--bake", "90s", "--max-error-rate", "5%", "-y")
    assert code == 0, stderr
    assert "rolling out version 2 (canary)" in stdout + stderr
    versions, canaries = stored(home)
    assert versions == [1, 2]
    assert canaries == {"svc": CanaryState(version=2, settings=CanarySettings(
        steps=(5, 20), bake_seconds=90.0, max_error_rate=0.05, min_requests=10))}


def test_rollout_commands_are_stored_for_the_controller(cli: Cli, home: Path, tmp_path: Path) -> None:
    code, _, stderr = cli("serve", "rollout", "svc", "promote")
    assert code == 1
    assert "service 'svc' has no canary rollout of its current version 1" in stderr
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "-y")[0] == 0
    code, stdout, stderr = cli("serve", "rollout", "svc", "pause")
    assert code == 0, stderr
    assert "Asked the controller to pause the canary rollout of svc" in stdout
    store = Store.open(home)
    assert store.list_canaries("svc")["svc"].command is Command.PAUSE
    store.put_canary("svc", CanaryState(version=2, phase=CanaryPhase.PROMOTED), 100)
    store.close()
    code, _, stderr = cli("serve", "rollout", "svc", "abort")
    assert code == 1
    assert "is over (promoted); nothing to abort" in stderr


def test_status_shows_the_split_the_step_and_the_rates(cli: Cli, home: Path, tmp_path: Path) -> None:
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "-y")[0] == 0
    store = Store.open(home)
    store.put_canary("svc", CanaryState(version=2, window_start=1000.0), 10)
    store.record_version_counts("svc", {(2, 1001, "2xx"): 158, (2, 1001, "5xx"): 2, (1, 1001, "2xx"): 1440})
    store.close()
    code, stdout, _ = cli("serve", "status", "svc", "-o", "json")
    canary = json.loads(stdout)["services"][0]["canary"]
    assert (canary["percent"], canary["step"], canary["new"]["requests"], canary["new"]["errors"],
            canary["old"]["requests"]) == (10, 0, 160, 2, 1440)
    code, stdout, _ = cli("serve", "status", "svc")
    assert code == 0
    text = " ".join(stdout.split())
    assert "canary version 2: step 1 of 2, 10%" in text
    assert "5xx new 1.2% (2/160), old 0% (0/1440), limit 2%" in text


def test_status_of_every_service_reads_the_canaries_in_one_query(cli: Cli, home: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "-y")[0] == 0
    asked: list[str | None] = []
    list_canaries = Store.list_canaries

    def recording(self: Store, service: str | None = None) -> dict[str, StoredCanary]:
        asked.append(service)
        return list_canaries(self, service)

    monkeypatch.setattr(Store, "list_canaries", recording)
    code, stdout, _ = cli("serve", "status", "-o", "json")
    assert code == 0
    assert json.loads(stdout)["services"][0]["canary"]["version"] == 2
    assert asked == [None]  # one query for every service, not one per service


def test_wait_exits_1_with_the_rollback_line(cli: Cli, home: Path, tmp_path: Path) -> None:
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "-y")[0] == 0
    reason = "version 2 rolled back: 5xx 7.5% (12/160) over 2m at 10%, limit 2%"
    store = Store.open(home)
    store.put_canary("svc", CanaryState(version=2, phase=CanaryPhase.ROLLED_BACK, verdict=reason), 0)
    assert store.add_rollback_version("svc", 2, 1, reason, 5.0) == 3
    store.close()
    code, _, stderr = cli("serve", "wait", "svc", "--version", "2", "--timeout", "5")
    assert code == 1
    assert f"svc: version 2 did not roll out: {reason}" in " ".join(stderr.split())


def test_auto_rollback_watches_a_rolling_update_with_its_bake_and_limit(cli: Cli, home: Path, tmp_path: Path) -> None:
    code, _, stderr = cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--auto-rollback",
                          "--bake", "30s", "--max-error-rate", "1%", "-y")
    assert code == 0, stderr
    versions, canaries = stored(home)
    assert versions == [1, 2]
    assert canaries == {"svc": CanaryState(version=2, settings=CanarySettings(bake_seconds=30.0, max_error_rate=0.01),
                                           phase=CanaryPhase.WATCHING)}
    code, _, stderr = cli("serve", "rollout", "svc", "promote")
    assert code == 1
    assert "is an update watched for an automatic rollback, not a canary" in stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mode", "canary", "--auto-rollback"], "--auto-rollback goes with --mode rolling or blue_green"),
        (["--auto-rollback", "--steps", "10"], "--steps goes with --mode canary"),
        (["--max-error-rate", "0.1"], "--max-error-rate goes with --mode canary or --auto-rollback"),
    ],
)
def test_auto_rollback_flags_that_do_not_go_together(cli: Cli, home: Path, tmp_path: Path, flags: list[str],
                                                     message: str) -> None:
    code, _, stderr = cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "-y", *flags)
    assert code == 2
    assert message in stderr
    assert stored(home) == ([1], {})


def test_a_crash_storing_the_rollout_leaves_no_version_without_its_flags(cli: Cli, home: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # the process stopped after the version row, before the rollout's

    monkeypatch.setattr(store_module, "_upsert_canary", crash)
    code, _, _ = cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "--steps",
                     "5,25", "--bake", "90s", "-y")
    assert code != 0
    monkeypatch.setattr(store_module, "_upsert_canary", _upsert_canary)
    assert stored(home) == ([1], {})  # neither: a controller never starts version 2 from the defaults
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "--steps", "5,25",
               "--bake", "90s", "-y")[0] == 0
    assert stored(home) == ([1, 2], {"svc": CanaryState(2, CanarySettings(steps=(5, 25), bake_seconds=90.0))})


def test_resume_is_for_a_paused_rollout_and_pause_for_a_running_one(cli: Cli, home: Path, tmp_path: Path) -> None:
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "-y")[0] == 0
    code, _, stderr = cli("serve", "rollout", "svc", "resume")
    assert code == 1
    assert "the canary rollout of version 2 of 'svc' is not paused; nothing to resume" in " ".join(stderr.split())
    store = Store.open(home)
    assert store.list_canaries("svc")["svc"].command is None  # nothing stored
    store.put_canary("svc", CanaryState(version=2, window_start=1000.0, extensions=3, paused=True), 10)
    store.close()
    code, _, stderr = cli("serve", "rollout", "svc", "pause")
    assert code == 1
    assert "is paused already; `resume`, `promote` or `abort` decides" in " ".join(stderr.split())
    code, stdout, _ = cli("serve", "status", "svc")
    assert "step 1 of 2, 10% (window from" in " ".join(stdout.split()) and "PAUSED" in stdout
    for command in ("resume", "promote", "abort"):
        code, _, stderr = cli("serve", "rollout", "svc", command)
        assert code == 0, stderr
        store = Store.open(home)
        assert store.list_canaries("svc")["svc"].command is Command(command)
        store.close()


def test_wait_on_a_paused_canary_names_the_command_that_decides(cli: Cli, home: Path, tmp_path: Path) -> None:
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "-y")[0] == 0
    store = Store.open(home)
    store.put_canary("svc", CanaryState(version=2, window_start=1000.0, extensions=3, paused=True), 10)
    store.close()
    code, _, stderr = cli("serve", "wait", "svc", "--timeout", "0")
    assert code == 1
    said = " ".join(stderr.split())
    assert "waiting for the canary: version 2: step 1 of 2, 10%" in said and ", PAUSED;" in said
    assert "a person decides: `sky-lite serve rollout svc resume`, `promote` or `abort`" in said
