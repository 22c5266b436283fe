"""Making the NamedTuples the load balancer builds per request (heads, feeds, outcomes) cheaply.

A NamedTuple's own constructor is a Python function (its ``__new__`` is generated source); ``tuple.__new__``
bound to the class does the same in C, from a tuple of every field in order, at about half the cost. Only
for hot paths that pass every field: defaults are not filled in and the length is not checked, which the
callers' tests cover.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["tuple_maker"]

_T = TypeVar("_T")


def tuple_maker(cls: type[_T]) -> Callable[[tuple[Any, ...]], _T]:
    """A function making a ``cls`` (a NamedTuple) from a tuple of all its fields."""
    return cast(Callable[[tuple[Any, ...]], _T], functools.partial(tuple.__new__, cls))
