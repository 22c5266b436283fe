"""The load balancer's process entry (``python -m skyserve_lite.lb``) and its settings."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from skyserve_lite.errors import UsageError
from skyserve_lite.lb import __main__ as lb_main
from skyserve_lite.lb.proxy import LbReport, LbView
from skyserve_lite.lb.settings import (
    ConnectionLimits,
    LbSettings,
    compute_default_max_connections,
    compute_default_max_connections_per_client,
    hold_seconds_from_env,
    max_connections_from_env,
)
from skyserve_lite.procs import find_free_port
from skyserve_lite.state.store import Store

START = 1_767_225_600.25  # 2026-01-01T00:00:00.25Z


@pytest.fixture(autouse=True)
def _keep_open_file_limit() -> Iterator[None]:
    """``main`` raises the process's soft limit on open files; give the test process its own back."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


@pytest.mark.timeout(60)
def test_main_exits_1_with_a_message_when_the_port_is_taken(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        Store.open(tmp_path).close()
        code = lb_main.main(["--home", str(tmp_path), "--service", "svc", "--port", str(port)])
    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_main_never_creates_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = lb_main.main(["--home", str(tmp_path / "home"), "--service", "svc", "--port", str(find_free_port())])
    assert code == 1
    assert "no state store at" in capsys.readouterr().err
    assert not (tmp_path / "home").exists()


@pytest.mark.timeout(60)
def test_main_exits_0_when_the_service_does_not_exist(tmp_path: Path) -> None:
    Store.open(tmp_path).close()
    code = lb_main.main(["--home", str(tmp_path), "--service", "nosuch", "--port", str(find_free_port())])
    assert code == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 30.0), ("", 30.0), (" 0 ", 0.0), ("2.5", 2.5), ("abc", None), ("-1", None), ("inf", None), ("nan", None)],
)
def test_hold_seconds_from_the_environment(value: str | None, expected: float | None) -> None:
    environ = {} if value is None else {"SKY_LITE_LB_HOLD_SECONDS": value}
    if expected is None:
        with pytest.raises(UsageError, match="SKY_LITE_LB_HOLD_SECONDS"):
            hold_seconds_from_env(environ)
    else:
        assert hold_seconds_from_env(environ) == expected


def test_main_exits_2_naming_an_invalid_hold_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SKY_LITE_LB_HOLD_SECONDS", "soon")
    code = lb_main.main(["--home", str(tmp_path), "--service", "svc", "--port", str(find_free_port())])
    assert code == 2
    assert "SKY_LITE_LB_HOLD_SECONDS must be a number of seconds, got 'soon'" in capsys.readouterr().err


def test_store_adapters_pass_the_store_values_through() -> None:
    view = LbView(ready_urls=("http://a",), policy="least_load")

    class FakeStore:
        def __init__(self) -> None:
            self.recorded: list[tuple[str, dict[int, int] | LbReport]] = []

        def get_lb_view(self, service: str) -> LbView | None:
            return view if service == "svc" else None

        def is_current(self) -> bool:
            return True

        def record_request_counts(self, service: str, counts: Mapping[int, int]) -> None:
            self.recorded.append((service, dict(counts)))

        def record_lb_report(self, service: str, report: LbReport, lb: str = "") -> None:
            self.recorded.append((service, report))

    store = FakeStore()
    assert lb_main.StoreTargetSource(store, "svc").read() is view  # type: ignore[arg-type]
    assert lb_main.StoreTargetSource(store, "gone").read() is None  # type: ignore[arg-type]
    sink = lb_main.StoreMetricsSink(store, "svc")  # type: ignore[arg-type]
    sink.record_request_counts({5: 1})
    report = LbReport(reported_at=START, in_flight=(("http://a", 2),), waiting=1)
    sink.record_load(report)
    assert store.recorded == [("svc", {5: 1}), ("svc", report)]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("", None), (" 1 ", 1), ("500", 500), ("many", None), ("2.5", None), ("0", None), ("-3", None)],
)
def test_max_connections_from_the_environment(value: str | None, expected: int | None) -> None:
    environ = {} if value is None else {"SKY_LITE_LB_MAX_CONNECTIONS": value}
    if value is not None and value.strip() and expected is None:
        with pytest.raises(UsageError, match="SKY_LITE_LB_MAX_CONNECTIONS"):
            max_connections_from_env(environ)
    else:
        assert max_connections_from_env(environ) == expected


def test_settings_from_the_environment_read_both_variables() -> None:
    environ = {"SKY_LITE_LB_HOLD_SECONDS": "5", "SKY_LITE_LB_MAX_CONNECTIONS": "300"}
    assert LbSettings.from_env(environ) == LbSettings(hold_seconds=5.0, max_connections=300)
    assert LbSettings.from_env({}) == LbSettings(hold_seconds=30.0, max_connections=None)


# variable, value -> the LbSettings field and its value, or the error message (None: valid)
_SETTING_CASES = [
    ("SKY_LITE_LB_MAX_CONNECTIONS_PER_CLIENT", "50", "max_connections_per_client", 50),
    ("SKY_LITE_LB_MAX_CONNECTIONS_PER_CLIENT", "0", None, "SKY_LITE_LB_MAX_CONNECTIONS_PER_CLIENT must be at least 1"),
    ("SKY_LITE_LB_HEAD_SECONDS", "2.5", "head_seconds", 2.5),
    ("SKY_LITE_LB_HEAD_SECONDS", "0", None, "SKY_LITE_LB_HEAD_SECONDS must be a number of seconds > 0, got '0'"),
    ("SKY_LITE_LB_HEAD_SECONDS", "soon", None, "SKY_LITE_LB_HEAD_SECONDS must be a number of seconds, got 'soon'"),
    ("SKY_LITE_LB_KEEPALIVE_SECONDS", "5", "keepalive_seconds", 5.0),
    ("SKY_LITE_LB_KEEPALIVE_SECONDS", "inf", None, "SKY_LITE_LB_KEEPALIVE_SECONDS must be a finite number"),
    ("SKY_LITE_LB_UPSTREAM_TIMEOUT_SECONDS", "30", "upstream_timeout_seconds", 30.0),
    ("SKY_LITE_LB_UPSTREAM_TIMEOUT_SECONDS", "-1", None, "SKY_LITE_LB_UPSTREAM_TIMEOUT_SECONDS must be a number"),
    ("SKY_LITE_LB_EJECT_AFTER_FAILURES", "0", "eject_after_failures", 0),
    ("SKY_LITE_LB_EJECT_AFTER_FAILURES", "2.5", None, "SKY_LITE_LB_EJECT_AFTER_FAILURES must be a whole number"),
    ("SKY_LITE_LB_EJECT_SECONDS", "1", "eject_seconds", 1.0),
    ("SKY_LITE_LB_EJECT_SECONDS", "0", None, "SKY_LITE_LB_EJECT_SECONDS must be a number of seconds > 0"),
]


@pytest.mark.parametrize(("variable", "value", "field", "expected"), _SETTING_CASES)
def test_settings_from_the_environment_table(variable: str, value: str, field: str | None, expected: object) -> None:
    if field is None:
        with pytest.raises(UsageError, match=str(expected).replace("(", r"\(")):
            LbSettings.from_env({variable: value})
    else:
        assert getattr(LbSettings.from_env({variable: value}), field) == expected


def test_settings_defaults() -> None:
    settings = LbSettings.from_env({})
    assert (settings.head_seconds, settings.keepalive_seconds, settings.upstream_timeout_seconds) == (10, 20, 600)
    assert (settings.eject_after_failures, settings.eject_seconds) == (5, 30)


@pytest.mark.parametrize(
    ("settings", "open_file_limit", "expected"),
    [
        (LbSettings(), 1_024, ConnectionLimits(max_connections=480)),
        (LbSettings(max_connections=100, max_connections_per_client=7, head_seconds=3, keepalive_seconds=4), 1_024,
         ConnectionLimits(max_connections=100, max_per_client=7, head_seconds=3, keepalive_seconds=4)),
    ],
)
def test_connection_limits_from_the_settings(settings: LbSettings, open_file_limit: int,
                                             expected: ConnectionLimits) -> None:
    assert settings.connection_limits(open_file_limit) == expected


@pytest.mark.parametrize(
    ("limits", "per_client"),
    [(ConnectionLimits(max_connections=480), 120), (ConnectionLimits(max_connections=10_000), 2_500),
     (ConnectionLimits(max_connections=3), 1), (ConnectionLimits(max_connections=10, max_per_client=50), 10),
     (ConnectionLimits(max_connections=10, max_per_client=4), 4)],
)
def test_per_client_limit_is_a_quarter_by_default_and_never_above_the_connection_limit(
    limits: ConnectionLimits, per_client: int
) -> None:
    assert limits.per_client == per_client
    assert compute_default_max_connections_per_client(limits.max_connections) == max(1, limits.max_connections // 4)


@pytest.mark.parametrize(
    ("open_file_limit", "expected"),
    [(1_024, 480), (20_000, 9_968), (1_048_576, 10_000), (64, 1), (10, 1), (66, 1), (68, 2)],
)
def test_default_max_connections_leave_descriptors_for_upstream_connections(
    open_file_limit: int, expected: int
) -> None:
    assert compute_default_max_connections(open_file_limit) == expected


def test_main_exits_2_naming_an_invalid_connection_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SKY_LITE_LB_MAX_CONNECTIONS", "lots")
    code = lb_main.main(["--home", str(tmp_path), "--service", "svc", "--port", str(find_free_port())])
    assert code == 2
    assert "SKY_LITE_LB_MAX_CONNECTIONS must be a whole number, got 'lots'" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_the_process_raises_its_open_file_limit_to_the_hard_limit_and_derives_the_connection_limit(
    tmp_path: Path,
) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1_024:
        pytest.skip(f"the hard open-file limit ({hard}) is too low to lower the soft one below it")
    Store.open(tmp_path).close()
    environ = {key: value for key, value in os.environ.items() if not key.startswith("SKY_LITE_LB_")}
    command = [sys.executable, "-m", "skyserve_lite.lb", "--home", str(tmp_path), "--service", "nosuch"]
    result = subprocess.run(
        [*command, "--port", str(find_free_port())],
        capture_output=True,
        text=True,
        timeout=30,
        env=environ,
        # 256 of at most 1,024: the entry point must take the whole 1,024.
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1_024)),
    )
    assert result.returncode == 0, result.stderr
    assert "open-file limit raised from 256 to 1024; at most 480 client connections, 120 per client address" in \
        result.stderr
