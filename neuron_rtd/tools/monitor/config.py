"""neuron-monitor's configuration file: which runtimes, which metric groups, how often.

The original's format (a JSON object), as its neuron-rtd era had it:

    {"period": "1s",
     "neuron_runtimes": [{"address": "unix:/run/neuron.sock",
                          "metrics": [{"type": "neuroncore_counters"},
                                      {"type": "hw_counters", "period": "2s"}]}],
     "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"}]}

A runtime is named by its `address` (a socket path, `unix:/path` or `host:port`, as every
tool takes one). A `period` may stand at the root, on a runtime
and on a metric group; the nearest one applies, else 5 seconds. A period is a number of
seconds or a string with a unit: "500ms", "1s", "1.5m", "1h". Anything else is refused
with the key that is wrong (a typo is not ignored).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_rtd.client.address import DEFAULT_ADDRESS, AddressError, grpc_target
from neuron_rtd.typed_json import ConfigError, check_object, expect

RUNTIME_GROUPS = (
    "neuroncore_counters",
    "inference_stats",
    "memory_used",
    "hw_counters",
    "neuron_runtime_vcpu_usage",
)
SYSTEM_GROUPS = ("vcpu_usage", "memory_info")
DEFAULT_PERIOD_S = 5.0

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PERIOD = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")


@dataclass(frozen=True)
class GroupConfig:
    type: str
    period_s: float


@dataclass(frozen=True)
class RuntimeConfig:
    address: str
    groups: tuple[GroupConfig, ...]


@dataclass(frozen=True)
class MonitorConfig:
    runtimes: tuple[RuntimeConfig, ...]
    system: tuple[GroupConfig, ...]


def parse_period(value: object, where: str) -> float:
    """Seconds from a config `period` (a number of seconds, or "<number><ms|s|m|h>")."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{where}: a period is a number of seconds or a string like '1s'")
    if isinstance(value, str):
        match = _PERIOD.match(value)
        if match is None:
            raise ConfigError(
                f"{where}: {value!r} is not a period (a number and a unit: ms, s, m or h, "
                "e.g. '500ms', '1s', '2m')"
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        seconds = float(value)
    if not seconds > 0:
        raise ConfigError(f"{where}: the period must be more than 0, not {value!r}")
    return seconds


def _object(value: object, where: str, allowed: Sequence[str]) -> dict[str, Any]:
    if isinstance(value, dict) and "tag_filter" in value:
        raise ConfigError(
            f"{where}.tag_filter: not supported: this monitor does not discover "
            "runtimes; name each one by its gRPC 'address'"
        )
    return check_object(
        value,
        where,
        dict.fromkeys(allowed, object),  # each value is checked where it is read
        unknown_key="{where}.{key}: unknown key (known here: {known})",
    )


def _array(value: object, where: str) -> list[Any]:
    return expect(value, list, where)


def _groups(
    value: object, where: str, known: Sequence[str], period_s: float
) -> tuple[GroupConfig, ...]:
    groups: list[GroupConfig] = []
    for i, item in enumerate(_array(value, where)):
        at = f"{where}[{i}]"
        entry = _object(item, at, ("type", "period"))
        kind = entry.get("type")
        if kind is None:
            raise ConfigError(f"{at}.type: missing (one of {', '.join(known)})")
        if kind not in known:
            raise ConfigError(
                f"{at}.type: unknown metric group {kind!r} (one of {', '.join(known)})"
            )
        if any(g.type == kind for g in groups):
            raise ConfigError(f"{at}.type: {kind!r} is named twice")
        period = parse_period(entry["period"], f"{at}.period") if "period" in entry else period_s
        groups.append(GroupConfig(kind, period))
    return tuple(groups)


def from_document(doc: object) -> MonitorConfig:
    """The configuration a parsed JSON document states, or ConfigError."""
    root = _object(doc, "config", ("period", "neuron_runtimes", "system_metrics"))
    period = parse_period(root["period"], "period") if "period" in root else DEFAULT_PERIOD_S
    runtimes = []
    for i, item in enumerate(_array(root.get("neuron_runtimes", []), "neuron_runtimes")):
        at = f"neuron_runtimes[{i}]"
        entry = _object(item, at, ("address", "period", "metrics"))
        address = entry.get("address")
        if not isinstance(address, str) or not address.strip():
            raise ConfigError(
                f"{at}.address: missing or empty (the runtime's gRPC address, "
                f"e.g. {DEFAULT_ADDRESS})"
            )
        if "metrics" not in entry:
            raise ConfigError(f"{at}.metrics: missing (the metric groups to collect)")
        runtime_period = (
            parse_period(entry["period"], f"{at}.period") if "period" in entry else period
        )
        groups = _groups(entry["metrics"], f"{at}.metrics", RUNTIME_GROUPS, runtime_period)
        try:  # read as every tool reads an address (client/address.py)
            target = grpc_target(address.strip())
        except AddressError as exc:
            raise ConfigError(f"{at}.address: {exc}") from None
        runtimes.append(RuntimeConfig(target, groups))
    system = _groups(root.get("system_metrics", []), "system_metrics", SYSTEM_GROUPS, period)
    if not system and not any(r.groups for r in runtimes):
        raise ConfigError(
            "config: nothing to collect: neither neuron_runtimes nor system_metrics names "
            "a metric group"
        )
    return MonitorConfig(tuple(runtimes), system)


def load(path: str | Path) -> MonitorConfig:
    """The configuration in file `path`; ConfigError says what is wrong, and where."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return from_document(doc)


def everything(addresses: Sequence[str], period_s: float = DEFAULT_PERIOD_S) -> MonitorConfig:
    """Every metric group of the runtimes at `addresses` and of the system."""
    groups = tuple(GroupConfig(kind, period_s) for kind in RUNTIME_GROUPS)
    return MonitorConfig(
        tuple(RuntimeConfig(address, groups) for address in addresses),
        tuple(GroupConfig(kind, period_s) for kind in SYSTEM_GROUPS),
    )
