"""The arguments of Ray Serve's ``get_decision_num_replicas``, as Ray 1.x and Ray 2.x pass them. Pure.

Both versions use the same three names, in two positional orders:

- Ray 1.x: ``(current_num_ongoing_requests, curr_target_num_replicas)``
- Ray 2.x: ``(curr_target_num_replicas, current_num_ongoing_requests, current_handle_queued_queries)``

By name, any call works. By position, the first argument tells the order, since the two cannot be confused: a
number is Ray 2.x's current target (``4``), a sequence Ray 1.x's in-flight requests per replica (``[7, 1, 8, 4]``).
Anything else is a TypeError that names the argument and both orders.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import TypeGuard

TARGET = "curr_target_num_replicas"
ONGOING = "current_num_ongoing_requests"
QUEUED = "current_handle_queued_queries"

_RAY_2_ORDER = (TARGET, ONGOING, QUEUED)
_RAY_1_ORDER = (ONGOING, TARGET, QUEUED)
_FUNCTION = "get_decision_num_replicas()"


@dataclass(frozen=True)
class DecisionArgs:
    """One call's arguments, checked: counts are whole and non-negative, loads finite and non-negative."""

    curr_target_num_replicas: int
    current_num_ongoing_requests: tuple[float, ...]
    current_handle_queued_queries: float = 0.0


def resolve_decision_args(args: Sequence[object], kwargs: Mapping[str, object]) -> DecisionArgs:
    """The arguments of one call in either Ray order. Raises TypeError for a wrong kind, a missing, repeated or
    unknown argument (naming it, as Python does), ValueError for a negative or non-finite number."""
    if len(args) > len(_RAY_2_ORDER):
        raise TypeError(f"{_FUNCTION} takes at most 3 arguments ({len(args)} given)")
    for name in kwargs:
        if name not in _RAY_2_ORDER:
            raise TypeError(f"{_FUNCTION} got an unexpected keyword argument {name!r}; "
                            f"it takes {', '.join(_RAY_2_ORDER)}")
    values = dict(kwargs)
    if args:
        for name, value in zip(_positional_order(args[0]), args, strict=False):
            if name in values:
                raise TypeError(f"{_FUNCTION} got multiple values for argument {name!r}")
            values[name] = value
    for name in (TARGET, ONGOING):
        if name not in values:
            raise TypeError(f"{_FUNCTION} missing required argument {name!r}")
    return DecisionArgs(_check_target(values[TARGET]), _check_ongoing(values[ONGOING]),
                        _check_queued(values.get(QUEUED, 0)))


def _positional_order(first: object) -> tuple[str, str, str]:
    if _is_number(first):
        return _RAY_2_ORDER
    if _is_sequence(first):
        return _RAY_1_ORDER
    raise TypeError(f"{_FUNCTION}: the first argument must be {TARGET}, a number (Ray 2.x's order: "
                    f"{', '.join(_RAY_2_ORDER)}), or {ONGOING}, a sequence of numbers (Ray 1.x's order: "
                    f"{', '.join(_RAY_1_ORDER[:2])}); got {_describe(first)}")


def _is_number(value: object) -> TypeGuard[Real]:
    # bool is an int to Python, but True replicas is a mistake, not a count.
    return isinstance(value, Real) and not isinstance(value, bool)


def _is_sequence(value: object) -> TypeGuard[Sequence[object]]:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))


def _check_target(value: object) -> int:
    if not _is_number(value):
        raise TypeError(f"{TARGET} must be a whole number of replicas; got {_describe(value)}")
    number = float(value)
    if not number.is_integer():
        raise TypeError(f"{TARGET} must be a whole number of replicas; got {value!r}")
    if number < 0:
        raise ValueError(f"{TARGET} must be 0 or more; got {value!r}")
    return int(number)


def _check_ongoing(value: object) -> tuple[float, ...]:
    if not _is_sequence(value):
        raise TypeError(f"{ONGOING} must be a sequence of numbers, one per replica; got {_describe(value)}")
    return tuple(_check_load(f"{ONGOING}[{index}]", item) for index, item in enumerate(value))


def _check_queued(value: object) -> float:
    return _check_load(QUEUED, value)


def _check_load(name: str, value: object) -> float:
    if not _is_number(value):
        raise TypeError(f"{name} must be a number; got {_describe(value)}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number, 0 or more; got {value!r}")
    return number


def _describe(value: object) -> str:
    return f"{type(value).__name__} {value!r}"
