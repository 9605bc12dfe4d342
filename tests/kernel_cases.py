"""The ONNX backend node test cases of one op, run straight through its NC kernel.

`node_cases(op)` gives the generated cases whose graph is that single op (the onnx wheel
defines them; generating all 1884 takes a few seconds, done once per test process).
`run_kernel(op, *inputs, **attrs)` runs one kernel as the runtime calls it.
`run_case(case)` either returns None (the kernel ran it and every output matched with the
case's own rtol/atol, dtype and shape), returns the reason the kernel refuses it at
compile time (op version, attribute or dtype it does not implement: the compiler sends
such a node to a CPU node), or raises AssertionError for wrong numbers.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import onnx
import onnx.defs

from driver_sim import KERNELS
from neuron_rtd.compiler.onnx_attrs import UnsupportedAttr, node_attrs


def run_kernel(op: str, *inputs: np.ndarray | None, **attrs: Any) -> Any:
    """The kernel of `op` on `inputs` (None: an absent input) with `attrs`, as the runtime
    calls it (after its attribute parsing and support check)."""
    kern = KERNELS[op]
    values = kern.parse_attrs(attrs)
    kern.check_support([a.dtype for a in inputs if a is not None], values)
    return kern.bind(values)(*inputs)


@functools.cache
def _all_cases() -> tuple[Any, ...]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(collect_testcases())


def node_cases(op: str) -> list[Any]:
    """The generated cases whose model is a single `op` node of the default domain."""
    return [
        case
        for case in _all_cases()
        if len(case.model.graph.node) == 1
        and case.model.graph.node[0].op_type == op
        and case.model.graph.node[0].domain in ("", "ai.onnx")
    ]


def op_version(model: onnx.ModelProto, node: onnx.NodeProto) -> int:
    """The since_version of the schema `node` has under the model's opset import."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return int(onnx.defs.get_schema(node.op_type, opset, "").since_version)


def run_case(case: Any) -> str | None:
    node = case.model.graph.node[0]
    kern = KERNELS[node.op_type]
    version = op_version(case.model, node)
    if kern.since is not None and version not in kern.since:
        return f"op version {version} (implemented: {kern.since})"
    try:
        values = kern.parse_attrs(node_attrs(node))
    except (UnsupportedAttr, ValueError) as exc:
        return f"attributes: {exc}"
    (inputs, expected), *_ = case.data_sets
    feeds = dict(zip([i.name for i in case.model.graph.input], inputs, strict=True))
    args = [feeds[name] if name else None for name in node.input]
    dtypes = [np.asarray(a).dtype for a in args if a is not None]
    try:
        kern.check_support(dtypes, values)
    except ValueError as exc:
        return f"check: {exc}"
    with np.errstate(all="ignore"):
        result = kern.bind(values)(*args)
    results = result if kern.multi_output else (result,)
    # The expected values are the graph's outputs, by name: a node may leave an output
    # out ("") before one it names (an LSTM's Y before Y_h).
    wanted = dict(zip([o.name for o in case.model.graph.output], expected, strict=False))
    for k, name in enumerate(node.output):
        if name not in wanted:
            continue
        got = np.asarray(results[k])
        want = np.asarray(wanted[name])
        where = f"{case.name} output {k} ({name})"
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype}, expected {want.dtype}"
        assert got.shape == want.shape, f"{where}: shape {got.shape}, expected {want.shape}"
        np.testing.assert_allclose(
            got.astype(np.float64) if got.dtype.kind in "biuf" else got,
            want.astype(np.float64) if want.dtype.kind in "biuf" else want,
            rtol=case.rtol,
            atol=case.atol,
            err_msg=where,
        )
    return None
