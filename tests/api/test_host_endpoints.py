"""`serve status`'s endpoints on every controller host: live when the endpoint answers as the service of this
state, whatever its host's controller does; a host that does not answer costs one timeout, not one per
service (``host_endpoints``). The asking is a fake that records what it was asked."""

from __future__ import annotations

import socket

import pytest

from skyserve_lite.api import ServiceView
from skyserve_lite.controller.fleet import ControllerView
from skyserve_lite.endpoint_identity import EndpointIdentity, TimedOut, read_endpoint_identity
from skyserve_lite.host_endpoints import (
    EndpointView,
    ask_endpoints,
    check_host_endpoints,
    find_endpoint_views,
    find_first_asks,
    is_unreachable,
)
from skyserve_lite.state.models import ServiceRecord, ServiceStatus

TIMED_OUT = TimedOut("nothing answers at http://127.0.0.9:30001 (TimeoutError: timed out)")
REFUSED = "nothing answers at http://127.0.0.5:30002 (ConnectionRefusedError: [Errno 111] Connection refused)"


def view(name: str, port: int) -> ServiceView:
    service = ServiceRecord(name=name, current_version=1, status=ServiceStatus.READY, status_reason=None,
                            lb_port=port, lb_pid=None, lb_policy="least_load", deleting=False, created_at=0.0,
                            next_replica_id=2, endpoint_host="127.0.0.5")
    return ServiceView(service=service, policy="Fixed 1 replica", load_balancing_policy="least_load", replicas=(),
                       events=(), controller_id="c1")


def controller(host: str, live: bool) -> ControllerView:
    return ControllerView(loop_id=f"{host}-1-aaaaaa", host=host, services=(), renewed_at=0.0, live=live)


class Asked:
    """Answers from a table (an endpoint missing from it refuses), and the urls asked, in order."""

    def __init__(self, answers: dict[str, EndpointIdentity | str]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, url: str) -> EndpointIdentity | str:
        self.asked.append(url)
        return self.answers.get(url, REFUSED)


@pytest.mark.parametrize(("answer", "unreachable"), [
    (TIMED_OUT, True),
    (REFUSED, False),  # refused at once: a host that is there, without a load balancer at this port
    ("http://127.0.0.5:30001 is not a sky-lite load balancer (/.sky-lite/identity answered 404)", False),
    (EndpointIdentity("web", "c1", 7), False),
    (str(TIMED_OUT), False),  # told by its type, not by its words
])
def test_is_unreachable(answer: EndpointIdentity | str, unreachable: bool) -> None:
    assert is_unreachable(answer) is unreachable


def test_an_endpoint_that_never_answers_times_out_and_one_that_refuses_does_not() -> None:
    with socket.socket() as silent, socket.socket() as closed:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the connection is queued and never read: the request gets no answer
        closed.bind(("127.0.0.1", 0))  # bound, not listening: refused at once
        silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        refused_url = f"http://127.0.0.1:{closed.getsockname()[1]}"

        timed_out = read_endpoint_identity(silent_url, timeout_seconds=0.3)
        refused = read_endpoint_identity(refused_url, timeout_seconds=0.3)

    assert isinstance(timed_out, TimedOut) and is_unreachable(timed_out)
    assert timed_out.startswith(f"nothing answers at {silent_url} (TimeoutError")
    assert isinstance(refused, str) and not is_unreachable(refused)
    assert refused.startswith(f"nothing answers at {refused_url} (ConnectionRefusedError")


def test_find_first_asks_is_each_hosts_first_url() -> None:
    urls = ["http://127.0.0.5:30001", "http://127.0.0.9:30001", "http://127.0.0.5:30002", "http://[::1]:30001"]
    assert find_first_asks(urls) == {"127.0.0.5": "http://127.0.0.5:30001", "127.0.0.9": "http://127.0.0.9:30001",
                                     "::1": "http://[::1]:30001"}


def test_a_host_that_times_out_is_asked_once_and_its_other_endpoints_get_its_answer() -> None:
    urls = [f"http://{host}:{port}" for port in (30001, 30002, 30003) for host in ("127.0.0.5", "127.0.0.9")]
    ask = Asked({"http://127.0.0.9:30001": TIMED_OUT})
    answers = ask_endpoints(urls, ask)
    # 127.0.0.9 is asked once (1 s at most), not once per service (1,000 services: 31 s at 32 at once).
    assert sorted(ask.asked) == sorted(["http://127.0.0.5:30001", "http://127.0.0.9:30001",
                                        "http://127.0.0.5:30002", "http://127.0.0.5:30003"])
    assert {url: answers[url] for url in urls if "127.0.0.9" in url} == dict.fromkeys(
        ["http://127.0.0.9:30001", "http://127.0.0.9:30002", "http://127.0.0.9:30003"], TIMED_OUT)
    assert answers["http://127.0.0.5:30002"] == REFUSED


def test_live_is_answering_as_the_service_of_this_state_whatever_the_hosts_controller_does() -> None:
    controllers = [controller("127.0.0.5", live=True), controller("127.0.0.6", live=False),
                   controller("127.0.0.7", live=True), controller("127.0.0.8", live=True)]
    ask = Asked({
        # A host whose loop stopped: its load balancer reads the database and serves on.
        "http://127.0.0.6:30001": EndpointIdentity("web", "c1", 41),
        # The live controller's host has no load balancer at the port yet: refused.
        # Another state's load balancer at the port, and this state's of another service.
        "http://127.0.0.7:30001": EndpointIdentity("web", "c2", 42),
        "http://127.0.0.8:30001": EndpointIdentity("api", "c1", 43),
    })
    [checked] = check_host_endpoints([view("web", 30001)], controllers, ask)
    assert checked.endpoints == (EndpointView("http://127.0.0.5:30001", live=False, controller_live=True),
                                 EndpointView("http://127.0.0.6:30001", live=True, controller_live=False),
                                 EndpointView("http://127.0.0.7:30001", live=False, controller_live=True),
                                 EndpointView("http://127.0.0.8:30001", live=False, controller_live=True))
    assert checked.endpoints[1].to_json() == {"url": "http://127.0.0.6:30001", "live": True, "controller_live": False}


def test_without_any_controller_row_nothing_is_asked() -> None:
    ask = Asked({})
    [checked] = check_host_endpoints([view("web", 30001)], [], ask)
    assert checked.endpoints == (EndpointView("http://127.0.0.5:30001", live=False, controller_live=False),)
    assert ask.asked == []


def test_views_from_an_older_host_are_live_as_their_hosts_controller() -> None:
    asked = check_host_endpoints([view("web", 30001)], [controller("127.0.0.5", live=True)],
                                 Asked({"http://127.0.0.5:30001": EndpointIdentity("web", "c1", 41)}))
    older = view("api", 30002)  # its host asked nothing: no endpoints
    found = find_endpoint_views([*asked, older], [controller("127.0.0.5", live=True), controller("127.0.0.6", False)])
    assert found == {"web": (EndpointView("http://127.0.0.5:30001", True, True),),
                     "api": (EndpointView("http://127.0.0.5:30002", True, True),
                             EndpointView("http://127.0.0.6:30002", False, False))}
