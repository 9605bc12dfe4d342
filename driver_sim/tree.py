"""The sysfs-like state tree through which processes see the simulated devices.

    <root>/machine.json          {"instance_type", "device_count", "format": 1}
    <root>/dev/neuron<N>         empty files standing for the device nodes
    <root>/neuron<N>/bdf         PCI address, e.g. 0000:00:1c.0
    <root>/neuron<N>/core_count  NeuronCores on the device
    <root>/neuron<N>/memory_size device DRAM in bytes
    <root>/neuron<N>/connected_devices  comma-separated indices of the linked devices
    <root>/neuron<N>/owner       JSON {"pid", "create_time", "address", "version"} while owned
    <root>/neuron<N>/owner.lock  the flock target of a claim
    <root>/neuron<N>/stats       binary counters (layout in `driver_sim.stats`)
    <root>/neuron<N>/inject      fault specs, one a line (syntax in `driver_sim.faults`)

The tree is built in a temporary directory beside the root and renamed into place, so a
reader sees either no tree or a whole one.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from driver_sim.errors import DriverError
from driver_sim.presets import (
    DEVICE_MEMORY_BYTES,
    NC_PER_DEVICE,
    InstancePreset,
    chain_neighbours,
)
from driver_sim.stats import create_stats_file

TREE_FORMAT = 1


@dataclass(frozen=True)
class TreePaths:
    """Where things live in a tree rooted at `root`."""

    root: pathlib.Path

    @property
    def machine_json(self) -> pathlib.Path:
        return self.root / "machine.json"

    def device_node(self, index: int) -> pathlib.Path:
        return self.root / "dev" / f"neuron{index}"

    def device_dir(self, index: int) -> pathlib.Path:
        return self.root / f"neuron{index}"

    def bdf(self, index: int) -> pathlib.Path:
        return self.device_dir(index) / "bdf"

    def core_count(self, index: int) -> pathlib.Path:
        return self.device_dir(index) / "core_count"

    def memory_size(self, index: int) -> pathlib.Path:
        return self.device_dir(index) / "memory_size"

    def connected_devices(self, index: int) -> pathlib.Path:
        return self.device_dir(index) / "connected_devices"

    def owner(self, index: int) -> pathlib.Path:
        return self.device_dir(index) / "owner"

    def owner_lock(self, index: int) -> pathlib.Path:
        return self.device_dir(index) / "owner.lock"

    def stats(self, index: int) -> pathlib.Path:
        return self.device_dir(index) / "stats"

    def inject(self, index: int) -> pathlib.Path:
        return self.device_dir(index) / "inject"


def read_machine_json(paths: TreePaths) -> dict[str, Any] | None:
    """The tree's machine description, or None when there is no tree yet."""
    try:
        text = paths.machine_json.read_text()
    except FileNotFoundError:
        return None
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != TREE_FORMAT:
        raise DriverError(f"{paths.machine_json}: not a format-{TREE_FORMAT} simulator tree")
    return data


def read_text(path: pathlib.Path) -> str:
    return path.read_text().strip()


def parse_connected(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def _write_device(paths: TreePaths, index: int, bdf: str, device_count: int) -> None:
    paths.device_node(index).touch()
    paths.device_dir(index).mkdir()
    neighbours = chain_neighbours(index, device_count)
    paths.bdf(index).write_text(f"{bdf}\n")
    paths.core_count(index).write_text(f"{NC_PER_DEVICE}\n")
    paths.memory_size(index).write_text(f"{DEVICE_MEMORY_BYTES}\n")
    paths.connected_devices(index).write_text(",".join(map(str, neighbours)) + "\n")
    paths.owner_lock(index).touch()
    paths.inject(index).touch()
    create_stats_file(paths.stats(index))


def _write_tree(paths: TreePaths, preset: InstancePreset) -> None:
    (paths.root / "dev").mkdir()
    for index, bdf in enumerate(preset.bdfs):
        _write_device(paths, index, bdf, preset.device_count)
    description = {
        "instance_type": preset.name,
        "device_count": preset.device_count,
        "format": TREE_FORMAT,
    }
    paths.machine_json.write_text(json.dumps(description, indent=2) + "\n")


def build_tree(root: pathlib.Path, preset: InstancePreset) -> None:
    """Create the tree for `preset` at `root` atomically.

    `root` may be missing or an empty directory. When another process builds it first,
    its tree stays and ours is thrown away; the caller then reads theirs.
    """
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{root.name}.building-", dir=root.parent))
    try:
        _write_tree(TreePaths(staging), preset)
        staging.chmod(0o755)
        os.rename(staging, root)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        if not TreePaths(root).machine_json.exists():
            raise DriverError(
                f"{root} exists and is not a simulator tree (no machine.json)"
            ) from exc
