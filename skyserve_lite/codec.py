"""Typed values to JSON and back, driven by their type hints. Pure.

``encode`` turns frozen dataclasses, enums, tuples, lists, dicts with string keys, paths and JSON scalars into
JSON values; ``decode(tp, data)`` builds the value of type ``tp`` again, checking shapes as it goes, so a
message from a different sky-lite version fails with ``ValueError`` naming the field instead of producing
a half-typed value. Only a dataclass's init fields travel: cached properties (``VersionRecord.spec``) are
derived again on the receiving side. ``exact=True`` also refuses a dataclass whose data lacks one of its
fields or has a key that is none of them: data written by another shape of the type (a field added,
renamed or removed since) fails instead of taking defaults.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from functools import cache
from pathlib import Path, PurePath
from typing import Any, TypeVar, Union

T = TypeVar("T")

Json = Any  # None | bool | int | float | str | list[Json] | dict[str, Json]


def encode(value: object) -> Json:
    """``value`` as a JSON value. Raises ``TypeError`` for something the codec does not carry."""
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, PurePath):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, (tuple, list)):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError(f"cannot encode a dict with non-string keys: {value!r}")
        return {key: encode(item) for key, item in value.items()}
    raise TypeError(f"cannot encode a {type(value).__name__}: {value!r}")


def decode(tp: Any, data: Json, where: str = "message", *, exact: bool = False) -> Any:
    """The value of type ``tp`` that ``encode`` turned into ``data``. Raises ``ValueError`` naming the
    field (``where``) whose data does not fit (with ``exact``, also a field missing or a key unknown, at
    every depth)."""
    return _decoder(tp, exact)(data, where)


_Decoder = Callable[[Json, str], Any]


@cache
def _decoder(tp: Any, exact: bool = False) -> _Decoder:
    if tp is Any:
        return lambda data, _where: data
    if tp is type(None) or tp is None:
        return _expect_none
    if tp in (bool, str):
        return _scalar(tp)
    if tp is int:
        return _scalar(int, reject_bool=True)
    if tp is float:
        return _float
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum(tp)
    if tp is Path:
        return lambda data, where: Path(_scalar(str)(data, where))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass(tp, exact)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return _union(args, exact)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _sequence(tuple, _decoder(args[0], exact))
        return _fixed_tuple(tuple(_decoder(a, exact) for a in args))
    if origin is list:
        return _sequence(list, _decoder(args[0], exact))
    if origin is dict and args and args[0] is str:
        item = _decoder(args[1], exact)
        return lambda data, where: {k: item(v, f"{where}.{k}") for k, v in _expect(dict, data, where).items()}
    raise TypeError(f"the codec cannot decode {tp!r}")


def _expect(kind: type, data: Json, where: str) -> Any:
    if not isinstance(data, kind):
        raise ValueError(f"{where}: expected {kind.__name__}, got {type(data).__name__}")
    return data


def _expect_none(data: Json, where: str) -> None:
    if data is not None:
        raise ValueError(f"{where}: expected null, got {type(data).__name__}")


def _scalar(kind: type, reject_bool: bool = False) -> _Decoder:
    def decode_scalar(data: Json, where: str) -> Any:
        if not isinstance(data, kind) or (reject_bool and isinstance(data, bool)):
            raise ValueError(f"{where}: expected {kind.__name__}, got {type(data).__name__}")
        return data
    return decode_scalar


def _float(data: Json, where: str) -> float:
    if isinstance(data, bool) or not isinstance(data, (int, float)):
        raise ValueError(f"{where}: expected a number, got {type(data).__name__}")
    return float(data)


def _enum(tp: type[enum.Enum]) -> _Decoder:
    def decode_enum(data: Json, where: str) -> enum.Enum:
        try:
            return tp(data)
        except ValueError:
            raise ValueError(f"{where}: {data!r} is not a {tp.__name__}") from None
    return decode_enum


def _dataclass(tp: type, exact: bool) -> _Decoder:
    hints = typing.get_type_hints(tp)
    fields = [(f.name, _decoder(hints[f.name], exact), exact or (f.default is dataclasses.MISSING
                                                               and f.default_factory is dataclasses.MISSING))
              for f in dataclasses.fields(tp) if f.init]
    names = frozenset(name for name, _, _ in fields)

    def decode_dataclass(data: Json, where: str) -> Any:
        document = _expect(dict, data, where)
        if exact and (unknown := sorted(set(document) - names)):
            raise ValueError(f"{where}: unknown field {unknown[0]!r}")
        values = {}
        for name, decode_field, required in fields:
            if name in document:
                values[name] = decode_field(document[name], f"{where}.{name}")
            elif required:
                raise ValueError(f"{where}: missing field {name!r}")
        return tp(**values)
    return decode_dataclass


def _union(args: tuple[Any, ...], exact: bool) -> _Decoder:
    decoders = [_decoder(a, exact) for a in args]
    optional = type(None) in args

    def decode_union(data: Json, where: str) -> Any:
        if data is None and optional:
            return None
        problems = []
        for decode_member in decoders:
            try:
                return decode_member(data, where)
            except ValueError as exc:
                problems.append(str(exc))
        raise ValueError(problems[0] if len(problems) == 1 else f"{where}: fits none of {', '.join(problems)}")
    return decode_union


def _sequence(kind: type, item: _Decoder) -> _Decoder:
    def decode_sequence(data: Json, where: str) -> Any:
        return kind(item(v, f"{where}[{i}]") for i, v in enumerate(_expect(list, data, where)))
    return decode_sequence


def _fixed_tuple(items: tuple[_Decoder, ...]) -> _Decoder:
    def decode_tuple(data: Json, where: str) -> tuple[Any, ...]:
        values = _expect(list, data, where)
        if len(values) != len(items):
            raise ValueError(f"{where}: expected {len(items)} items, got {len(values)}")
        return tuple(d(v, f"{where}[{i}]") for i, (d, v) in enumerate(zip(items, values, strict=True)))
    return decode_tuple
