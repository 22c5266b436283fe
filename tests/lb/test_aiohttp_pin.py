"""aiohttp is allowed from the tested release up to the next major one because the load balancer uses only its
public names: its HTTP/1.1 framing is llhttp's (lb/http1.py), and of aiohttp it keeps ``StreamReader`` for
bodies, over a protocol of its own that has only what ``FlowControl`` names."""

from __future__ import annotations

import ast
import asyncio
import re
from importlib.metadata import version
from pathlib import Path

import aiohttp
from packaging.requirements import Requirement
from packaging.version import Version

from skyserve_lite.lb.http1 import new_stream

from .recording_flow import RecordingFlow

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
LB = Path(__file__).resolve().parents[2] / "skyserve_lite" / "lb"


def aiohttp_requirement() -> Requirement:
    """The aiohttp line of pyproject.toml's dependencies (read as text: tomllib is not in Python 3.10)."""
    found = re.findall(r'^\s*"(aiohttp[^"]*)",', PYPROJECT.read_text(), flags=re.MULTILINE)
    assert len(found) == 1, found
    return Requirement(found[0])


def test_the_requirement_allows_the_installed_release_and_later_minors_but_no_next_major() -> None:
    specifier = aiohttp_requirement().specifier
    installed = Version(version("aiohttp"))
    assert specifier.contains(installed)
    assert specifier.contains(f"{installed.major}.{installed.minor + 1}.0")
    assert not specifier.contains(f"{installed.major + 1}.0.0")


def aiohttp_uses(path: Path) -> list[str]:
    """What ``path`` takes from aiohttp: modules imported ("from aiohttp.x ...", "import aiohttp.x") and
    the attributes read off the top-level package ("aiohttp.StreamReader")."""
    uses = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.module.startswith("aiohttp"):
            uses += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            uses += [alias.name for alias in node.names if alias.name.startswith("aiohttp.")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "aiohttp":
            uses.append(f"aiohttp.{node.attr}")
    return uses


def test_the_load_balancer_uses_only_names_aiohttp_exports() -> None:
    public = {f"aiohttp.{name}" for name in aiohttp.__all__}
    uses = {f"{path.name}: {use}" for path in sorted(LB.glob("*.py")) for use in aiohttp_uses(path)}
    assert uses, "the scan found no use of aiohttp at all: it no longer looks where the load balancer is"
    assert {use for use in uses if use.split(": ", 1)[1] not in public} == set()


def test_a_stream_pauses_above_twice_its_limit_and_resumes_below_it_on_a_flow_control_protocol() -> None:
    async def run() -> None:
        flow = RecordingFlow()
        stream = new_stream(flow, asyncio.get_running_loop(), 100)
        stream.feed_data(b"a" * 150)
        assert "pause" not in flow.calls
        stream.feed_data(b"b" * 100)  # 250 bytes held: above 2 x 100
        assert flow.calls == ["pause"]
        assert await stream.read(200) == b"a" * 150 + b"b" * 50  # 50 left: below 100
        assert flow.calls[-1] == "resume"
        waiting = asyncio.ensure_future(stream.read())
        stream.feed_eof()
        assert await waiting == b"b" * 50
        assert stream.is_eof()

    asyncio.run(run())
