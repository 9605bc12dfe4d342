"""Values and comparison: a data set's values as numpy, outputs compared the way onnx's
backend test runner does (`compare_outputs`), and the one-line reasons a case's outcome
is given (clipped, onnxruntime's source locations dropped)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

REASON_LIMIT = 400  # characters of a reason kept
# onnxruntime's source location and C++ signature before its message: dropped
_ORT_WHERE = re.compile(
    r"/onnxruntime_src/\S+:\d+ [^()]*\([^()]*\)(?: const)?(?:::<lambda\(\)>)? ?"
)


def _value(item: Any) -> Any:
    """A data-set value as numpy (TensorProto and numpy scalars converted; lists of
    values converted element by element; None stays None)."""
    if isinstance(item, onnx.TensorProto):
        return numpy_helper.to_array(item)
    if isinstance(item, list | tuple):
        return [_value(x) for x in item]
    if item is None or isinstance(item, dict):
        return item
    return np.asarray(item)


def _first_line(text: str, fallback: str = "") -> str:
    for line in str(text).splitlines():
        if line.strip():
            return _clip(_ORT_WHERE.sub("", line.strip()))
    return fallback


def _clip(text: str) -> str:
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 3] + "..."


def _error_text(exc: BaseException) -> str:
    return _first_line(str(exc), type(exc).__name__)


def _allclose_text(exc: AssertionError) -> str:
    """assert_allclose's message without the arrays, on one line."""
    lines: list[str] = []
    where = False  # the first mismatching element kept, the others dropped
    for raw in str(exc).splitlines():
        line = raw.strip()
        if line.startswith(("ACTUAL:", "DESIRED:", "x:", "y:")):
            break
        if not line or line.startswith(("First ", "Mismatch at ind")):
            continue
        if line.startswith("["):
            if where:
                continue
            where, line = True, f"first at {line}"
        lines.append(line)
    return _clip("; ".join(lines)) or "values differ"


def compare_outputs(got: Sequence[Any], expected: Sequence[Any], rtol: float, atol: float) -> None:
    """AssertionError (one line: which output, what differs) unless `got` matches
    `expected` as onnx's backend runner requires."""
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} outputs, expected {len(expected)}")
    for index, (out, ref) in enumerate(zip(got, expected, strict=True)):
        _compare_one(f"output {index}", out, ref, rtol, atol)


def _compare_one(where: str, out: Any, ref: Any, rtol: float, atol: float) -> None:
    if ref is None or out is None:
        if ref is not out:
            raise AssertionError(f"{where}: got {_kind(out)}, expected {_kind(ref)}")
        return
    if isinstance(ref, list | tuple) or isinstance(out, list | tuple):
        if not isinstance(ref, list | tuple) or not isinstance(out, list | tuple):
            raise AssertionError(f"{where}: got {_kind(out)}, expected {_kind(ref)}")
        if len(out) != len(ref):
            raise AssertionError(f"{where}: a sequence of {len(out)}, expected {len(ref)}")
        for k, (o, r) in enumerate(zip(out, ref, strict=True)):
            _compare_one(f"{where}[{k}]", o, r, rtol, atol)
        return
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape:
        raise AssertionError(f"{where}: shape {out.shape}, expected {ref.shape}")
    if ref.dtype == object or out.dtype == object:
        # a NEFF's string outputs are bytes (UTF-8, as the wire carries them), ONNX's str
        if not np.array_equal(_as_text(out), _as_text(ref)):
            raise AssertionError(f"{where}: values differ")
        return
    if out.dtype != ref.dtype:
        raise AssertionError(f"{where}: dtype {out.dtype}, expected {ref.dtype}")
    tolerance = rtol
    if out.dtype.name == "bfloat16":  # as onnx's runner: two bfloat16 ulps, via float32
        tolerance = max(rtol, 2**-6)
        out, ref = out.astype(np.float32), ref.astype(np.float32)
    try:
        np.testing.assert_allclose(out, ref, rtol=tolerance, atol=atol)
    except AssertionError as exc:
        raise AssertionError(f"{where}: {_allclose_text(exc)}") from None
    except TypeError as exc:  # dtypes numpy cannot compare with a float
        if not np.array_equal(out, ref):
            raise AssertionError(f"{where}: values differ ({exc})") from None


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, list | tuple):
        return f"a sequence of {len(value)}"
    array = np.asarray(value)
    return f"{array.dtype} {array.shape}"


DISTRIBUTION_SIGMAS = 5.0  # how far apart two samples' means may be, in standard errors


def compare_by_distribution(got: Sequence[Any], expected: Sequence[Any]) -> None:
    """AssertionError unless each output of `got` could come from the distribution the
    matching expected output was drawn from: the outputs of random ops (other draws of
    the same distribution, so their values cannot match). Same dtype and shape; finite
    values; where the expected draws are all 0 or 1 (Bernoulli), so are these; and the
    two samples' means within `DISTRIBUTION_SIGMAS` standard errors of each other."""
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} outputs, expected {len(expected)}")
    for index, (out, ref) in enumerate(zip(got, expected, strict=True)):
        where = f"output {index}"
        out, ref = np.asarray(out), np.asarray(ref)
        if out.shape != ref.shape or out.dtype != ref.dtype:
            raise AssertionError(f"{where}: {_kind(out)}, expected {_kind(ref)}")
        if out.size == 0:
            continue
        ours, theirs = out.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
        if not np.all(np.isfinite(ours)):
            raise AssertionError(f"{where}: values that are not finite")
        if np.all((theirs == 0) | (theirs == 1)) and not np.all((ours == 0) | (ours == 1)):
            raise AssertionError(f"{where}: values other than 0 and 1")
        spread = max(float(np.std(ours)), float(np.std(theirs)), 0.5 / np.sqrt(ours.size))
        error = spread * np.sqrt(2.0 / ours.size)
        gap = abs(float(np.mean(ours)) - float(np.mean(theirs)))
        if gap > DISTRIBUTION_SIGMAS * error:
            raise AssertionError(
                f"{where}: mean {np.mean(ours):.4g}, expected {np.mean(theirs):.4g} "
                f"(more than {DISTRIBUTION_SIGMAS:g} standard errors apart)"
            )


def _as_text(array: np.ndarray) -> np.ndarray:
    """`array` with its bytes elements read as UTF-8 text (others as they are)."""
    if array.dtype != object:
        return array
    flat = [e.decode("utf-8", "replace") if isinstance(e, bytes) else e for e in array.flat]
    return np.array(flat, dtype=object).reshape(array.shape)
