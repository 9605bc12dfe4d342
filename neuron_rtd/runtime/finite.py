"""Whether an inference's float outputs hold NaN or Inf (its code, OK or
INFER_COMPLETED_WITH_NUM_ERR), checked on the slot in the fastest form for its size: the
check every inference of a model with float outputs pays."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def checked_form(output: np.ndarray) -> np.ndarray | memoryview[float]:
    """A float output as a model's numerical check reads it (`LoadedModel._numerical_code`):
    a handful of float32 or float64 values in place as a memoryview, whose floats Python
    reads with no call into numpy (slow on the caches a run has just had); else the array
    itself, flat when that needs no copy (`all_finite`)."""
    small = 0 < output.size <= _FEW  # (a memoryview of no elements cannot be cast)
    if small and output.flags.c_contiguous and output.dtype in _BLAS_FLOATS:
        items = output.data.cast("B")  # (the dtype is in the host's byte order)
        return items.cast("f") if output.dtype == np.float32 else items.cast("d")
    return output.reshape(-1) if output.flags.c_contiguous else output


def all_finite(*values: np.ndarray | memoryview[float]) -> bool:
    """Whether float arrays (or memoryviews of a handful of floats, `_checked_form`) hold
    no NaN or Inf. A handful of values is summed in Python (`finite_sum`). A float32 or
    float64 array's dot product with itself is finite only if every element is (a NaN or
    Inf makes it NaN or Inf), and BLAS reads the array faster than `isfinite` can; a
    non-finite dot product (also from squares that overflow) is settled elementwise. The
    dot products of all the arrays share one `errstate` (entering it costs as much as a
    dot product of a few thousand values)."""
    dotted = []
    for value in values:
        if type(value) is memoryview:
            if not finite_sum(value.tolist()):
                return False
        elif value.size <= _FEW:
            if not finite_sum(value.reshape(-1).tolist()):
                return False
        elif value.dtype in _BLAS_FLOATS:
            dotted.append(value.reshape(-1))
        elif not np.isfinite(value).all():
            return False
    if dotted:
        with np.errstate(all="ignore"):
            for flat in dotted:
                if not math.isfinite(flat.dot(flat)) and not np.isfinite(flat).all():
                    return False
    return True


def finite_sum(values: Sequence[float]) -> bool:
    """Whether a handful of floats holds no NaN or Inf: summed exactly in Python (an inf
    or a nan stays so)."""
    try:
        return math.isfinite(math.fsum(values))
    except OverflowError:  # finite values whose sum overflows
        return True
    except ValueError:  # inf - inf
        return False


_FEW = 64  # values summed in Python rather than checked by numpy
_BLAS_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
