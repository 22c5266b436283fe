"""`serve rollout` while an earlier command waits for the controller's next pass: the later one replaces it
(as the store's contract says), and the person is told which command was dropped, or that the same one was
asked already."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from skyserve_lite.api import LocalController
from skyserve_lite.clock import FakeClock
from skyserve_lite.plan.canary import Command
from skyserve_lite.state.store import Store

from .homes import IMAGE_V1, IMAGE_V2, write
from .runner import Cli

V1, V2 = IMAGE_V1, IMAGE_V2


@pytest.fixture
def cli(home: Path, tmp_path: Path) -> Cli:
    cli = Cli(LocalController(home, FakeClock(), start_daemon=False))
    assert cli("serve", "update", "--no-wait", "svc", write(tmp_path, V2), "--mode", "canary", "-y")[0] == 0
    return cli


def pending(home: Path) -> Command | None:
    store = Store.open(home)
    try:
        return store.list_canaries("svc")["svc"].command
    finally:
        store.close()


@pytest.mark.parametrize(
    ("first", "second", "said"),
    [
        ("abort", "pause", "Asked the controller to pause the canary rollout of svc instead of the `abort` asked "
                           "before, which it had not done yet and now will not; `sky-lite serve wait svc` follows it."),
        ("promote", "abort", "Asked the controller to abort the canary rollout of svc instead of the `promote` "
                             "asked before, which it had not done yet and now will not;"),
        ("pause", "pause", "The controller was asked to pause the canary rollout of svc already and has not done "
                           "it yet; `sky-lite serve wait svc` follows it."),
    ],
)
def test_a_command_asked_before_the_controller_acted_is_named(cli: Cli, home: Path, first: str, second: str,
                                                              said: str) -> None:
    code, stdout, _ = cli("serve", "rollout", "svc", first)
    assert code == 0 and stdout.startswith(f"Asked the controller to {first} the canary rollout of svc; ")
    code, stdout, stderr = cli("serve", "rollout", "svc", second)
    assert code == 0, stderr
    assert said in " ".join(stdout.split())
    assert pending(home) is Command(second)


def test_a_refused_command_names_no_pending_one_and_keeps_it(cli: Cli, home: Path) -> None:
    assert cli("serve", "rollout", "svc", "abort")[0] == 0
    code, stdout, stderr = cli("serve", "rollout", "svc", "resume")
    assert code == 1 and stdout == ""
    assert "is not paused; nothing to resume" in stderr
    assert pending(home) is Command.ABORT


def test_an_unknown_service_is_named_as_before(cli: Cli) -> None:
    code, stdout, stderr = cli("serve", "rollout", "nosuch", "pause")
    assert code == 1 and stdout == ""
    assert "no service named 'nosuch'" in stderr


def paused(home: Path) -> None:
    """The rollout as the controller leaves it after acting on a `pause`: paused, no command pending."""
    store = Store.open(home)
    try:
        state = store.list_canaries("svc")["svc"].state
        store.put_canary("svc", dataclasses.replace(state, paused=True, window_start=1000.0), 10)
    finally:
        store.close()


def test_pause_after_a_pending_resume_replaces_it(cli: Cli, home: Path) -> None:
    paused(home)
    assert cli("serve", "rollout", "svc", "resume")[0] == 0
    code, stdout, stderr = cli("serve", "rollout", "svc", "pause")
    assert code == 0, stderr
    assert ("Asked the controller to pause the canary rollout of svc instead of the `resume` asked before"
            in " ".join(stdout.split()))
    assert pending(home) is Command.PAUSE


def test_resume_after_a_pending_pause_replaces_it(cli: Cli, home: Path) -> None:
    assert cli("serve", "rollout", "svc", "pause")[0] == 0
    code, stdout, stderr = cli("serve", "rollout", "svc", "resume")
    assert code == 0, stderr
    assert ("Asked the controller to resume the canary rollout of svc instead of the `pause` asked before"
            in " ".join(stdout.split()))
    assert pending(home) is Command.RESUME


def test_a_paused_rollout_with_nothing_pending_still_refuses_pause(cli: Cli, home: Path) -> None:
    paused(home)
    code, stdout, stderr = cli("serve", "rollout", "svc", "pause")
    assert code == 1 and stdout == ""
    assert "is paused already" in " ".join(stderr.split())
    assert pending(home) is None
