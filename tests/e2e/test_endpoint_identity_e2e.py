"""Two state directories on one host, each `serve up` of a service named `svc` at the same moment: neither
may report the other's load balancer as its own endpoint. Each replica answers with its home, so a GET on
an endpoint says whose it is."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyserve_lite.procs import find_free_port

from .conftest import SkyLite, answering_run, http_get

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TASK = "service:\n  readiness_probe: /\n  replicas: 1\n" + answering_run('os.environ["SKY_LITE_HOME"]')
READY = re.compile(r"Service svc is READY at (http://127\.0\.0\.1:\d+)")


@pytest.fixture
def two(tmp_path: Path) -> Iterator[list[SkyLite]]:
    homes = [SkyLite(tmp_path / "a"), SkyLite(tmp_path / "b")]
    yield homes
    for sky in homes:
        sky.cleanup()


def _up_at_once(homes: list[SkyLite], task: Path, *extra: str) -> list[subprocess.CompletedProcess[str]]:
    """`serve up` of ``task`` as `svc` in every home at the same moment; their results."""
    running = [subprocess.Popen([sys.executable, "-m", "skyserve_lite", "serve", "up", str(task), "--name", "svc",
                                 *extra], env=sky.env, cwd=sky.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True) for sky in homes]
    results = []
    for process in running:
        out, err = process.communicate(timeout=240)
        results.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return results


def test_a_pinned_port_both_homes_chose_is_ready_only_for_the_home_whose_load_balancer_has_it(
        two: list[SkyLite], tmp_path: Path) -> None:
    # Both homes pin the same free port: both are accepted (nothing listens yet), one load balancer binds
    # it, and the other home's waits for it (pinned ports never move). Its replica is READY all the same.
    (tmp_path / "svc.yaml").write_text(TASK)
    port = find_free_port()
    results = _up_at_once(two, tmp_path / "svc.yaml", "--endpoint-port", str(port), "--timeout", "60")
    ready = [(sky, result) for sky, result in zip(two, results, strict=True) if result.returncode == 0]
    assert len(ready) == 1, [(r.returncode, r.stdout, r.stderr) for r in results]
    (winner, result), = ready
    match = READY.search(result.stdout)
    assert match is not None and match.group(1) == f"http://127.0.0.1:{port}", result.stdout
    assert http_get(f"{match.group(1)}/") == (200, str(winner.home))
    [(loser_home, loser)] = [(sky, r) for sky, r in zip(two, results, strict=True) if r.returncode != 0]
    assert "is the endpoint of service 'svc' of controller" in loser.stderr, loser.stderr
    assert "READY at" not in loser.stdout
    # Its status says the same: the endpoint it shows is not its own.
    [view] = loser_home.status("svc")["services"]
    assert view["status"] == "READY" and view["endpoint"] == f"http://127.0.0.1:{port}"
    assert "is the endpoint of service 'svc' of controller" in view["endpoint_problem"]
    table = loser_home.run("serve", "status")
    assert f"Warning: svc: http://127.0.0.1:{port} is the endpoint of service 'svc'" in table.stderr, table.stderr


def test_two_homes_racing_serve_up_each_report_their_own_load_balancer(two: list[SkyLite], tmp_path: Path) -> None:
    (tmp_path / "svc.yaml").write_text(TASK)
    results = _up_at_once(two, tmp_path / "svc.yaml", "--timeout", "120")
    endpoints = []
    for sky, result in zip(two, results, strict=True):
        assert result.returncode == 0, (result.stdout, result.stderr)
        match = READY.search(result.stdout)
        assert match is not None, result.stdout
        endpoint = match.group(1)
        assert http_get(f"{endpoint}/") == (200, str(sky.home))
        # The load balancer recorded the address it bound and its pid; status checked who answers there.
        [view] = sky.status("svc")["services"]
        assert view["endpoint"] == endpoint and view["endpoint_problem"] is None
        [recorded] = view["load_balancers"]
        assert recorded["address"] == endpoint.removeprefix("http://")
        assert Path(f"/proc/{recorded['pid']}").exists()
        endpoints.append(endpoint)
    assert endpoints[0] != endpoints[1]
