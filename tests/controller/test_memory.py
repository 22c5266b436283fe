"""The controller loop's garbage collection policy: what survived a pass is frozen out of later
collections, and every refreeze period everything is thawed and collected, cycles included."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from skyserve_lite.controller.memory import PassCollector


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_survivors_are_frozen_and_frozen_cycles_are_freed_at_the_next_refreeze() -> None:
    now = [0.0]
    collector = PassCollector(lambda: now[0], refreeze_seconds=600)
    node = Node()
    alive = weakref.ref(node)
    collector.after_pass()
    assert gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert alive() is not None  # frozen: collections leave it alone
    now[0] = 300.0
    collector.after_pass()
    assert alive() is not None  # not yet a refreeze period
    now[0] = 600.0
    collector.after_pass()
    assert alive() is None  # thawed and collected
    assert gc.get_freeze_count() > 0  # and what lives on is frozen again


def test_a_passs_own_cyclic_garbage_is_collected_not_frozen() -> None:
    collector = PassCollector(lambda: 0.0, refreeze_seconds=600)
    node = Node()
    gone = weakref.ref(node)
    del node  # garbage of this pass, in a cycle: only the cyclic collector frees it
    collector.after_pass()
    assert gone() is None
