"""Typed JSON checking: whether parsed JSON has the keys and the value types a schema
expects, each fault named by where it is (`where`: a file, a key path, a NEFF's node).

Shared by every layer and importing none. Its callers keep their schemas and say which
exception a fault is: the daemon's config file (`neuron_rtd/daemon/config.py`) and
neuron-monitor's (`neuron_rtd/tools/monitor/config.py`) raise ConfigError, the NEFF's
graph (`neuron_rtd/neff/jsonfields.py`) NeffInvalid.

Types are Python's as `json.loads` gives them (dict, list, str, int, float, bool,
type(None)); `object` is any value. A boolean is not an integer (nor a number), though
Python's bool is an int. Faults name the JSON types: object, array, string, ...
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

T = TypeVar("T")

Expected = type | tuple[type, ...]
"""What a value may be: a type, or any of several (e.g. `(str, type(None))`)."""

ErrorClass = Callable[[str], Exception]
"""The exception a fault raises, made from its message."""


class ConfigError(ValueError):
    """A config file or flag that cannot be used; the message says which and why."""


_NAMES: dict[type, str] = {
    dict: "object",
    list: "array",
    str: "string",
    bool: "boolean",
    type(None): "null",
}
_EXPECTED: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
    object: "anything",
}


def type_name(value: object) -> str:
    """The JSON type of a parsed value: object, array, string, boolean, null, int, float."""
    return _NAMES.get(type(value), type(value).__name__)


def expected_name(expected: Expected) -> str:
    """`expected` in words: "an integer", "a string or null"."""
    kinds = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(_EXPECTED.get(kind, kind.__name__) for kind in kinds)


def is_a(value: object, expected: Expected) -> bool:
    """Whether `value` is of (one of) `expected`; a bool only where bool (or object) is."""
    kinds = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, bool):
        return bool in kinds or object in kinds
    return isinstance(value, kinds)


@overload
def expect(value: object, expected: type[T], where: str, *, error: ErrorClass = ...) -> T: ...
@overload
def expect(
    value: object, expected: tuple[type, ...], where: str, *, error: ErrorClass = ...
) -> object: ...
def expect(
    value: object, expected: Expected, where: str, *, error: ErrorClass = ConfigError
) -> object:
    """`value`, if it is of `expected`; else `error`("WHERE: expected an X, got Y")."""
    if not is_a(value, expected):
        raise error(f"{where}: expected {expected_name(expected)}, got {type_name(value)}")
    return value


UNKNOWN_KEY = "{where}: unknown key {key!r} (known: {known})"
"""The default message for a key the schema does not name (fields: where, key, known)."""


def check_object(
    value: object,
    where: str,
    schema: Mapping[str, Expected],
    *,
    error: ErrorClass = ConfigError,
    comments: bool = False,
    unknown_key: str = UNKNOWN_KEY,
) -> dict[str, Any]:
    """`value` as an object whose every key `schema` names, with a value of the type it
    gives there (keys may be missing: what is required is the caller's to say). With
    `comments`, keys starting with `_` are comments, unchecked. `unknown_key` is the
    message for a key the schema does not name."""
    obj = expect(value, dict, where, error=error)
    for key, item in obj.items():
        if comments and key.startswith("_"):
            continue
        if key not in schema:
            raise error(unknown_key.format(where=where, key=key, known=", ".join(schema)))
        if not is_a(item, schema[key]):
            raise error(
                f"{where}: {key!r} must be {expected_name(schema[key])}, got {json.dumps(item)}"
            )
    return obj
