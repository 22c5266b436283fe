"""aiohttp is pinned to the minor release the load balancer was tested on, because the load balancer uses its
private parser and protocol internals; and those internals are there in the aiohttp installed."""

from __future__ import annotations

import asyncio
import importlib
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def aiohttp_requirement() -> Requirement:
    """The aiohttp line of pyproject.toml's dependencies (read as text: tomllib is not in Python 3.10)."""
    found = re.findall(r'^\s*"(aiohttp[^"]*)",', PYPROJECT.read_text(), flags=re.MULTILINE)
    assert len(found) == 1, found
    return Requirement(found[0])


def test_the_requirement_allows_the_installed_release_and_no_other_minor() -> None:
    specifier = aiohttp_requirement().specifier
    installed = Version(version("aiohttp"))
    assert specifier.contains(installed)
    assert not specifier.contains(f"{installed.major}.{installed.minor + 1}.0")
    assert not specifier.contains(f"{installed.major + 1}.0.0")
    assert not specifier.contains(f"{installed.major}.{installed.minor - 1}.0")  # lacks what lb/ calls


# What lb/server.py and lb/pooled_upstream.py use that aiohttp does not document (module, attribute).
INTERNALS = [
    ("aiohttp.base_protocol", "BaseProtocol._pause_reading_for_buffer"),
    ("aiohttp.base_protocol", "BaseProtocol._resume_reading_for_buffer"),
    ("aiohttp.base_protocol", "BaseProtocol._drain_helper"),
    ("aiohttp.http_parser", "HttpRequestParser.feed_data"),
    ("aiohttp.http_parser", "HttpRequestParser.message_consumed"),
    ("aiohttp.http_parser", "HttpResponseParser.feed_data"),
    ("aiohttp.http_parser", "HttpResponseParser.feed_eof"),
    ("aiohttp.http_parser", "RawRequestMessage"),
    ("aiohttp.http_parser", "RawResponseMessage"),
    ("aiohttp.http_exceptions", "BadHttpMessage"),
    ("aiohttp.streams", "EmptyStreamReader"),
]


@pytest.mark.parametrize(("module", "attribute"), INTERNALS)
def test_the_internals_the_load_balancer_uses_are_there(module: str, attribute: str) -> None:
    found: object = importlib.import_module(module)
    for name in attribute.split("."):
        assert hasattr(found, name), f"{module}.{attribute}: this aiohttp has no {name}"
        found = getattr(found, name)


def test_the_parsers_take_the_arguments_the_load_balancer_gives() -> None:
    from aiohttp.base_protocol import BaseProtocol
    from aiohttp.http_parser import HttpRequestParser, HttpResponseParser

    async def build() -> None:
        loop = asyncio.get_running_loop()
        protocol = BaseProtocol(loop)
        requests = HttpRequestParser(protocol, loop, 2**16, max_msg_queue_size=2)
        messages, _, _ = requests.feed_data(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        assert [message.path for message, _ in messages] == ["/a", "/a"]  # the third waits in the queue
        requests.message_consumed()
        messages, _, _ = requests.feed_data(b"")
        assert [message.path for message, _ in messages] == ["/a"]
        HttpResponseParser(protocol, loop, 2**16, payload_exception=ValueError, response_with_body=True,
                           read_until_eof=True, auto_decompress=False)

    asyncio.run(build())
