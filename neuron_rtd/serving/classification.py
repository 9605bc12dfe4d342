"""The classification extension, as Triton answers it: an output asked for with
`classification: N` comes back as a BYTES tensor of its top N classes per row instead of
its values, each element "score:index", or "score:index:label" when the output's
`label_filename` (a file beside config.pbtxt, one label per line) has a label there.

Triton's rules, kept: the rows are axis 0 when the model batches (`max_batch_size` > 0),
else the whole tensor is one row; a row of fewer than N values answers them all (shape
[rows, min(N, row)], or [min(N, size)]); scores are written as C's `%f` writes them
(`0.734000`; integer types as integers) and the index is the value's position in its row;
the types ranked are the integers, FP32 and FP64 (not FP16, BF16, BOOL or BYTES); a row
past a million values is refused; an index with no label, or an empty line, gives no
label. Ties, which Triton's unstable sort leaves in no promised order, go by index
(lowest first); NaN ranks below every number.

Label files are read when the version loads, as data (`read_data_file`: regular, no
symbolic link, at most `LABELS_MAX_BYTES`), from the model's folder only: a
`label_filename` is a plain file name, and a missing or unreadable one fails the load.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from neuron_rtd.proto import model_config_pb
from neuron_rtd.serving.api import InferResponse, ServingError, Status
from neuron_rtd.serving.config import NAME_MAX_BYTES, read_data_file
from neuron_rtd.serving.datatypes import config_type_name

ModelConfig = model_config_pb.ModelConfig
Labels = Mapping[str, tuple[bytes, ...]]  # output name -> its labels, by class index

LABELS_MAX_BYTES = 16 << 20  # a label file (ImageNet's 1000 labels take 30 KB)
MAX_ROW_ELEMENTS = 1_000_000  # Triton's bound on the values one row ranks
_RANKED = frozenset(
    model_config_pb.DataType.Value(name)
    for name in (
        "TYPE_UINT8",
        "TYPE_UINT16",
        "TYPE_UINT32",
        "TYPE_UINT64",
        "TYPE_INT8",
        "TYPE_INT16",
        "TYPE_INT32",
        "TYPE_INT64",
        "TYPE_FP32",
        "TYPE_FP64",
    )
)


def _invalid(message: str) -> ServingError:
    return ServingError(Status.INVALID_ARGUMENT, message)


def read_labels(model_dir: Path, config: ModelConfig, what: str) -> Labels:
    """The labels of each output whose config names a `label_filename`, read from
    `model_dir`; ServingError saying why one cannot be (the version does not load)."""
    labels: dict[str, tuple[bytes, ...]] = {}
    for output in config.output:
        filename = output.label_filename
        if not filename:
            continue
        where = f"{what}: output '{output.name}' label_filename {filename!r}"
        size = len(filename.encode("utf-8", "surrogatepass"))
        if "/" in filename or "\0" in filename or filename in (".", "..") or size > NAME_MAX_BYTES:
            raise _invalid(
                f"{where} is not a plain file name (no '/', not '.' or '..', no NUL, at most "
                f"{NAME_MAX_BYTES} bytes): it names a file beside config.pbtxt"
            )
        path = model_dir / filename
        try:
            data = read_data_file(path, LABELS_MAX_BYTES, "a label file")
        except FileNotFoundError:
            raise ServingError(
                Status.UNAVAILABLE,
                f"{where}: no such file in {model_dir}, or the daemon may not read it",
            ) from None
        except OSError as exc:
            reason = exc.strerror.lower() if exc.strerror else str(exc)
            raise ServingError(
                Status.UNAVAILABLE, f"{where}: cannot read {path}: {reason}"
            ) from None
        except ValueError as exc:
            raise _invalid(f"{where}: cannot read {path}: {exc}") from None
        lines = data.split(b"\n")
        if lines[-1] == b"":  # the newline that ends the last line starts no label
            lines.pop()
        labels[output.name] = tuple(lines)
    return labels


def check_classification(config: ModelConfig, classification: Mapping[str, int]) -> None:
    """Before the inference runs: each output asked for as classes is one of the model's,
    of a type whose values rank."""
    types = {output.name: output.data_type for output in config.output}
    for name in classification:
        data_type = types.get(name)
        if data_type is None:
            continue  # the request's own check names the unknown output
        if data_type not in _RANKED:
            shown = config_type_name(data_type).removeprefix("TYPE_")
            raise _invalid(
                f"output '{name}': class result not available for output due to unsupported "
                f"type '{shown}' (classification ranks integer, FP32 and FP64 outputs)"
            )


def classify(
    response: InferResponse, classification: Mapping[str, int], batched: bool, labels: Labels
) -> InferResponse:
    """`response` with each output of `classification` answered as its top classes."""
    outputs = dict(response.outputs)
    for name, count in classification.items():
        if name in outputs:
            outputs[name] = top_classes(outputs[name], count, batched, labels.get(name, ()), name)
    response.outputs = outputs
    return response


def top_classes(
    array: np.ndarray, count: int, batched: bool, labels: tuple[bytes, ...], name: str = ""
) -> np.ndarray:
    """The top `count` classes of each row of `array` (axis 0 when `batched`, else one row
    of all of it), as "score:index[:label]" bytes elements, best first."""
    rows = array.reshape(array.shape[0] if batched and array.ndim else 1, -1)
    width = rows.shape[1]
    if width > MAX_ROW_ELEMENTS:
        raise _invalid(
            f"output '{name}': classification output tensor too large ({width} values a row, "
            f"at most {MAX_ROW_ELEMENTS})"
        )
    # Descending, ties by index: a stable ascending sort of a key that reverses the order
    # (-x for floats, whose NaN sorts last; ~x for integers, which cannot overflow).
    key = -rows if rows.dtype.kind == "f" else ~rows
    taken = min(count, width)
    order = np.argsort(key, axis=1, kind="stable")[:, :taken]
    floats = rows.dtype.kind == "f"
    out = np.empty((rows.shape[0], taken), dtype=object)
    for row, indices in enumerate(order):
        for place, index in enumerate(indices.tolist()):
            value = rows[row, index].item()
            text = f"{value:f}:{index}" if floats else f"{value}:{index}"
            element = text.encode()
            if index < len(labels) and labels[index]:
                element += b":" + labels[index]
            out[row, place] = element
    return out if batched and array.ndim else out.reshape(taken)
