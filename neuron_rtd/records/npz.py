"""npz files of named arrays, as numpy.savez writes them: `neuron-cli infer`'s and
`validate`'s inputs, `neuron-cc quantize`'s calibration samples. Read one way (no pickled
objects; what a broken archive raises caught whole); each command says the failure in its
own words."""

from __future__ import annotations

import os
import zipfile

import numpy as np


class NpzUnreadable(ValueError):
    """A file numpy cannot read as an npz archive. `cause` is what reading it raised, None
    when the file is no zip archive at all."""

    def __init__(self, path: str | os.PathLike[str], cause: Exception | None) -> None:
        self.path = path
        self.cause = cause
        super().__init__(f"{path}: not an npz archive" + (f" ({cause})" if cause else ""))


def npz_arrays(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of the npz file at `path` by name; NpzUnreadable when it is none."""
    if not zipfile.is_zipfile(path):
        raise NpzUnreadable(path, None)
    try:
        with np.load(path, allow_pickle=False) as loaded:  # a zip: always an NpzFile
            return {key: loaded[key] for key in loaded.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise NpzUnreadable(path, exc) from None
