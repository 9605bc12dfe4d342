"""The checkpoint: the units a run has done, in `output/.checkpoint.json`, written whole
after each unit (replaced atomically) and read back, validated, by a run that resumes
(`BadCheckpoint` for a file it cannot resume from)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from neuron_rtd.tools.stream.output_folder import write_whole
from neuron_rtd.tools.stream.units import WorkUnit

CHECKPOINT = ".checkpoint.json"


class BadCheckpoint(ValueError):
    """A checkpoint a run cannot resume from: which file, and what is wrong with it."""


class Checkpoint:
    """The units done, in `output/.checkpoint.json`, each write atomic."""

    def __init__(self, output: Path, *, resume: bool) -> None:
        self.folder = output
        self.path = output / CHECKPOINT
        self._lock = threading.Lock()
        self.done: set[str] = set()
        # a manifest run's weights, per epoch, as its interleave read them: replayed
        self.weights: dict[str, list[dict[str, float]]] = {}
        if resume and self.path.exists():
            self.done, self.weights = _read_checkpoint(self.path)

    def mark(self, unit: WorkUnit, weights: list[dict[str, float]] | None = None) -> None:
        with self._lock:
            self.done.add(unit.name)
            if weights is not None:
                self.weights[str(unit.epoch)] = weights
            saved = {"done": sorted(self.done), "weights": self.weights}
            write_whole(self.folder, CHECKPOINT, json.dumps(saved).encode())


def _read_checkpoint(path: Path) -> tuple[set[str], dict[str, list[dict[str, float]]]]:
    """The units done and the weights a checkpoint file holds; BadCheckpoint for one that
    cannot be read, or is not what `Checkpoint.mark` writes."""

    def bad(why: str) -> BadCheckpoint:
        return BadCheckpoint(f"{path}: cannot resume from it ({why}); remove it to start over")

    try:
        saved = json.loads(path.read_bytes())
    except OSError as exc:
        raise bad(exc.strerror or type(exc).__name__) from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise bad(f"not JSON: {' '.join(str(exc).split())}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("done"), list):
        raise bad('expected {"done": [UNIT, ...], "weights": {...}}')
    done, weights = saved["done"], saved.get("weights", {})
    if not all(isinstance(name, str) for name in done):
        raise bad('"done" must list unit names (strings)')
    if not isinstance(weights, dict) or not all(
        isinstance(turns, list) and all(_is_weights(turn) for turn in turns)
        for turns in weights.values()
    ):
        raise bad('"weights" must map each epoch to a list of {CLASS: WEIGHT}')
    return set(done), weights


def _is_weights(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(weight, int | float) and not isinstance(weight, bool)
        for weight in value.values()
    )
