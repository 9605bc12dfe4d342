"""The one place onnxruntime sessions are made: CPU nodes, references, validation, models.

Shared by every layer (like `neuron_rtd.errors`), it imports nothing of the project.
A session runs on the CPU provider with one inter-op thread; the caller says how many
intra-op threads, how its pool waits for work (`Spinning`), how quiet it is, and whether
graph optimizations run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ModelSource = onnx.ModelProto | bytes | str | Path

# How a session's intra-op threads wait for work. onnxruntime's default (ALWAYS) lets them
# spin ~45 ms after each run: a session called every 20 ms keeps a core busy for good, taken
# from whatever else runs on a small host. NEVER puts them to sleep whenever they wait, so
# each op of a run wakes them again: 0.25 ms on a 0.6 ms MLP, over 1 ms on a MobileNet's
# hundred small ops. WHILE_BUSY (the runtime's choice) spins between the ops of a run and up
# to SPIN_AFTER_RUN_US after it, then sleeps: calls that come back to back find the threads
# awake (waking them at the start of each run costs 20-70 us, 10-25% of a small model's
# call), and an idle session takes no CPU after that millisecond. IN_RUNS sleeps the moment
# the session's last run in progress returns (`session.force_spinning_stop`): the least CPU
# under steady load, each run paying the wake.
ALWAYS, WHILE_BUSY, IN_RUNS, NEVER = "always", "while-busy", "in-runs", "never"
SPINNING = (WHILE_BUSY, IN_RUNS, ALWAYS, NEVER)
SPIN_AFTER_RUN_US = 1000
Spinning = str  # one of SPINNING


def check_spinning(name: str) -> Spinning:
    """`name` if it names one of the ways in `SPINNING`, else ValueError."""
    if name not in SPINNING:
        raise ValueError(
            f"unknown thread spinning {name!r}: use one of {', '.join(map(repr, SPINNING))}"
        )
    return name


# onnxruntime's log severities: 0 verbose .. 3 error, 4 fatal only
LOG_ERRORS = 3
LOG_SILENT = 4

# onnxruntime's tensor type names, as numpy dtypes
ORT_DTYPES: Mapping[str, np.dtype[Any]] = {
    f"tensor({name})": np.dtype(dtype)
    for name, dtype in {
        "float": np.float32,
        "double": np.float64,
        "float16": np.float16,
        "int8": np.int8,
        "int16": np.int16,
        "int32": np.int32,
        "int64": np.int64,
        "uint8": np.uint8,
        "uint16": np.uint16,
        "uint32": np.uint32,
        "uint64": np.uint64,
        "bool": np.bool_,
    }.items()
}


def session(
    model: ModelSource,
    *,
    threads: int | None = None,
    spinning: Spinning = ALWAYS,
    log_severity: int = LOG_ERRORS,
    optimize: bool = True,
    fuse_qdq: bool = True,
) -> Any:
    """An onnxruntime `InferenceSession` of `model` (a ModelProto, its serialized bytes,
    or a file path). `threads`: intra-op threads (None: onnxruntime's default, the
    machine's cores). `fuse_qdq=False` keeps onnxruntime from fusing DequantizeLinear ->
    op -> QuantizeLinear into its own quantized kernels (whose rounding is its own).
    onnxruntime's own exceptions pass through: callers name the model."""
    import onnxruntime as ort

    check_spinning(spinning)
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry(
        "session.intra_op.allow_spinning", "0" if spinning == NEVER else "1"
    )
    if spinning == IN_RUNS:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    if spinning == WHILE_BUSY:
        options.add_session_config_entry(
            "session.intra_op.spin_duration_us", str(SPIN_AFTER_RUN_US)
        )
    options.log_severity_level = log_severity
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if not fuse_qdq:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    if isinstance(model, onnx.ModelProto):
        data: bytes | str = model.SerializeToString()
    elif isinstance(model, Path):
        data = os.fspath(model)
    else:
        data = model
    return ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])


def run(sess: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of `sess` on `feeds`, by name."""
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds)), strict=True))
