"""What `serve status` says about the autoscaler, as a table of cases."""

from __future__ import annotations

import pytest

from skyserve_lite.api import ServiceView
from skyserve_lite.autoscalers.base import AutoscalerState
from skyserve_lite.cli.render import describe_autoscaler, format_age
from skyserve_lite.state.models import AutoscalerObservation, ServiceRecord, ServiceStatus

SERVICE = ServiceRecord(name="svc", current_version=1, status=ServiceStatus.READY, status_reason=None,
                        lb_port=30001, lb_pid=None, lb_policy="least_load", deleting=False, created_at=0.0,
                        next_replica_id=1)


def view(autoscaler: tuple[AutoscalerState, AutoscalerObservation] | None) -> ServiceView:
    return ServiceView(service=SERVICE, policy="p", load_balancing_policy="least_load", replicas=(), events=(),
                       autoscaler=autoscaler)


@pytest.mark.parametrize(
    ("autoscaler", "text"),
    [
        pytest.param(None, "-", id="no-decision-yet"),
        pytest.param((AutoscalerState(1, 2), AutoscalerObservation("fixed", 2)), "-", id="fixed"),
        pytest.param((AutoscalerState(1, 1, upscale_count=4), AutoscalerObservation(
            "request_rate", 3, qps=5.2, held_back="upscale delay 4/15")),
            "qps 5.20 -> raw 3, target 1 (upscale delay 4/15)", id="request-rate-held"),
        pytest.param((AutoscalerState(1, 4), AutoscalerObservation("ongoing_requests", 4, average_ongoing=9.5)),
                     "in-flight 9.5/replica -> raw 4, target 4", id="in-flight"),
    ],
)
def test_autoscaler_column(autoscaler: tuple[AutoscalerState, AutoscalerObservation] | None, text: str) -> None:
    assert describe_autoscaler(view(autoscaler)) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (-5, "0s"), (0, "0s"), (59, "59s"), (60, "1m"), (3599, "59m"), (3600, "1h"), (7200, "2h"), (86399, "23h"),
    (172800, "2d")])
def test_age(seconds: float, text: str) -> None:
    assert format_age(1000.0, 1000.0 + seconds) == text
