"""A unit's outputs: written in the order of its records under a temporary name,
renamed into place when the unit is whole (TFRecord Examples or an npz), and whether an
earlier run's are there and whole."""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from neuron_rtd.records.features import output_examples
from neuron_rtd.records.tfrecord import Writer, is_whole
from neuron_rtd.tools.stream.output_folder import Temporary
from neuron_rtd.tools.stream.units import OutputFormat, WorkUnit


def _is_written(path: Path, fmt: OutputFormat) -> bool:
    """Whether a unit's output is there and whole, as far as a cheap look tells: a
    TFRecord file's frames end where it does; an npz's zip directory (at its end) reads."""
    try:
        if fmt == "tfrecord":
            return is_whole(path)
        with zipfile.ZipFile(path):
            return True
    except (OSError, zipfile.BadZipFile):
        return False


class _Outputs:
    """One unit's outputs, written in order under a temporary name."""

    def __init__(self, output: Path, unit: WorkUnit, fmt: OutputFormat) -> None:
        self.temporary = Temporary(output, unit.output_name(fmt))
        self.fmt = fmt
        self._writer = (
            Writer(self.temporary.path, self.temporary.file) if fmt == "tfrecord" else None
        )
        self._keys: list[str] = []
        self._arrays: dict[str, list[np.ndarray]] = {}

    def add(self, keys: Sequence[str], outputs: dict[str, np.ndarray]) -> None:
        if self._writer is not None:
            for record in output_examples(keys, outputs):
                self._writer.write(record)
            return
        self._keys.extend(keys)
        for name, array in outputs.items():
            self._arrays.setdefault(name, []).extend(array)

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
        else:
            arrays: dict[str, np.ndarray] = {
                name: np.stack(rows) for name, rows in self._arrays.items()
            }
            arrays["keys"] = np.array(self._keys)
            np.savez(self.temporary.file, **arrays)  # type: ignore[arg-type]
        self.temporary.commit()

    def abandon(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self.temporary.discard()
