"""Typed access to a NEFF's parsed JSON: each helper returns the value or raises NeffInvalid
naming where in the NEFF the fault is (`where`, e.g. "node 'fc' stage 0"). The type checks
are `neuron_rtd/typed_json.py`'s, which the daemon's and neuron-monitor's configs use too."""

from __future__ import annotations

import json

import numpy as np

from neuron_rtd import typed_json
from neuron_rtd.errors import NeffInvalid
from neuron_rtd.neff.dtypes import parse_dtype

JsonObject = dict[str, object]


def load_json(raw: bytes | memoryview, what: str) -> object:
    """Parse `raw`; an object with a key given twice is invalid, not last-one-wins."""
    try:
        return json.loads(bytes(raw), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NeffInvalid(f"{what} is not valid JSON: {exc}") from None
    except _DuplicateKey as exc:
        raise NeffInvalid(
            f"{what} is not valid: key {exc.key!r} appears twice in one object"
        ) from None


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> JsonObject:
    obj: JsonObject = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def as_object(value: object, where: str) -> JsonObject:
    return typed_json.expect(value, dict, where, error=NeffInvalid)


def get(obj: JsonObject, key: str, where: str) -> object:
    if key not in obj:
        raise NeffInvalid(f"{where}: missing key {key!r}")
    return obj[key]


def as_str(value: object, where: str) -> str:
    return typed_json.expect(value, str, where, error=NeffInvalid)


def as_name(value: object, where: str) -> str:
    name = as_str(value, where)
    if not name:
        raise NeffInvalid(f"{where}: a name must not be empty")
    return name


def as_int(value: object, where: str) -> int:
    return typed_json.expect(value, int, where, error=NeffInvalid)


def as_list(value: object, where: str) -> list[object]:
    return typed_json.expect(value, list, where, error=NeffInvalid)


def as_names(value: object, where: str) -> tuple[str, ...]:
    """A list of distinct non-empty strings."""
    names = tuple(as_name(item, f"{where}[{i}]") for i, item in enumerate(as_list(value, where)))
    check_unique(names, where)
    return names


def check_unique(names: tuple[str, ...], where: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise NeffInvalid(f"{where}: duplicate name {name!r}")
        seen.add(name)


def as_shape(value: object, where: str) -> tuple[int, ...]:
    dims = tuple(as_int(d, f"{where}[{i}]") for i, d in enumerate(as_list(value, where)))
    for i, dim in enumerate(dims):
        if dim < 0:
            raise NeffInvalid(f"{where}: dimension {i} is negative ({dim}) in shape {list(dims)}")
    return dims


def get_dtype(obj: JsonObject, where: str) -> np.dtype:
    return parse_dtype(get(obj, "dtype", where), where)


def get_shape(obj: JsonObject, where: str) -> tuple[int, ...]:
    return as_shape(get(obj, "shape", where), f"{where} shape")
