"""A stage program (`nodes/<node>/stage<j>.json`) and its weights blob.

The weights become read-only numpy views into the blob, never copies. Instructions are
checked in order: each input must be a stage input, a weight or an earlier output.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping

import numpy as np

from neuron_rtd.errors import NeffInvalid
from neuron_rtd.neff import jsonfields as jf
from neuron_rtd.neff.dtypes import is_string
from neuron_rtd.neff.model import Instruction, Stage

WEIGHT_ALIGNMENT = 64
# Auto-cast, as the field's compiler names it: which fp32 ops compute in a 16-bit type
# (matrix multiplies only, or all), and the type.
AUTO_CAST_MODES = ("none", "matmult", "all")
AUTO_CAST_TYPES = ("bf16", "fp16")


def parse_stage(doc: object, blob: memoryview, where: str) -> Stage:
    """The stage described by a parsed program JSON, its weights viewing `blob`."""
    obj = jf.as_object(doc, where)
    inputs = jf.as_names(jf.get(obj, "inputs", where), f"{where} inputs")
    stage = Stage(
        inputs=inputs,
        outputs=jf.as_names(jf.get(obj, "outputs", where), f"{where} outputs"),
        instructions=_instructions(jf.get(obj, "instructions", where), where),
        weights=_weights(jf.get(obj, "weights", where), blob, where),
        opset=_opset(obj.get("opset"), where),
        auto_cast=_choice(obj.get("auto_cast", "none"), AUTO_CAST_MODES, f"{where} auto_cast"),
        auto_cast_type=_choice(
            obj.get("auto_cast_type", "bf16"), AUTO_CAST_TYPES, f"{where} auto_cast_type"
        ),
    )
    _check_dataflow(stage, where)
    return stage


def _choice(value: object, allowed: tuple[str, ...], where: str) -> str:
    text = jf.as_str(value, where)
    if text not in allowed:
        raise NeffInvalid(f"{where}: {text!r} is not one of {', '.join(allowed)}")
    return text


def _opset(value: object, where: str) -> int | None:
    """The optional ONNX opset of a stage's ops; an int from 1 to 1000."""
    if value is None:
        return None
    opset = jf.as_int(value, f"{where} opset")
    if not 1 <= opset <= 1000:
        raise NeffInvalid(f"{where} opset: {opset} is not an ONNX opset version")
    return opset


def _weights(value: object, blob: memoryview, where: str) -> Mapping[str, np.ndarray]:
    table = jf.as_object(value, f"{where} weights")
    views: dict[str, np.ndarray] = {}
    for name, entry in table.items():
        jf.as_name(name, f"{where} weight")
        views[name] = _weight_view(entry, blob, f"{where} weight {name!r}")
    return types.MappingProxyType(views)


def _weight_view(value: object, blob: memoryview, where: str) -> np.ndarray:
    obj = jf.as_object(value, where)
    offset = jf.as_int(jf.get(obj, "offset", where), f"{where} offset")
    nbytes = jf.as_int(jf.get(obj, "nbytes", where), f"{where} nbytes")
    dtype = jf.get_dtype(obj, where)
    if is_string(dtype):
        raise NeffInvalid(
            f"{where}: a weight holds numbers only (a CPU node's string constants are in its "
            "ONNX sub-model)"
        )
    shape = jf.get_shape(obj, where)
    count = math.prod(shape)
    if nbytes != dtype.itemsize * count:
        raise NeffInvalid(
            f"{where}: nbytes is {nbytes} but {dtype.name} {shape} takes {dtype.itemsize * count}"
        )
    if offset < 0 or offset % WEIGHT_ALIGNMENT:
        raise NeffInvalid(f"{where}: offset {offset} is not a multiple of {WEIGHT_ALIGNMENT}")
    if offset + nbytes > len(blob):
        raise NeffInvalid(
            f"{where}: bytes {offset} to {offset + nbytes} lie outside the weights blob "
            f"of {len(blob)} bytes"
        )
    view = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).reshape(shape)
    view.flags.writeable = False
    return view


def _instructions(value: object, where: str) -> tuple[Instruction, ...]:
    items = jf.as_list(value, f"{where} instructions")
    return tuple(_instruction(item, f"{where} instruction {k}") for k, item in enumerate(items))


def _instruction(value: object, where: str) -> Instruction:
    obj = jf.as_object(value, where)
    op = jf.as_name(jf.get(obj, "op", where), f"{where} op")
    where = f"{where} ({op})"
    inputs = jf.as_list(jf.get(obj, "inputs", where), f"{where} inputs")
    return Instruction(
        op=op,
        # "" leaves an optional input out (ONNX's convention), as in Clip(x, "", max).
        inputs=tuple(jf.as_str(x, f"{where} inputs[{i}]") for i, x in enumerate(inputs)),
        outputs=jf.as_names(jf.get(obj, "outputs", where), f"{where} outputs"),
        attrs=types.MappingProxyType(jf.as_object(jf.get(obj, "attrs", where), f"{where} attrs")),
    )


def _check_dataflow(stage: Stage, where: str) -> None:
    """Inputs and weights are distinct; each instruction uses only what is defined before
    it and defines new names; every stage output is some instruction's output."""
    defined = set(stage.inputs)
    for name in stage.weights:
        if name in defined:
            raise NeffInvalid(f"{where}: weight {name!r} has the name of a stage input")
    defined.update(stage.weights)
    produced: set[str] = set()
    for k, ins in enumerate(stage.instructions):
        at = f"{where} instruction {k} ({ins.op})"
        for name in ins.inputs:
            if name and name not in defined:
                raise NeffInvalid(f"{at}: input {name!r} is not defined before use")
        for name in ins.outputs:
            if name in defined:
                raise NeffInvalid(f"{at}: output {name!r} is already defined")
        defined.update(ins.outputs)
        produced.update(ins.outputs)
    for name in stage.outputs:
        if name not in produced:
            raise NeffInvalid(f"{where}: output {name!r} is produced by no instruction")
