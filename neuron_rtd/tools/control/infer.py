"""`neuron-cli infer ID --inputs in.npz [--outputs out.npz] [--shm]`: one inference on a
loaded model, its inputs checked against the model before anything is sent."""

from __future__ import annotations

import argparse
import math
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from neuron_rtd.arguments import unreadable
from neuron_rtd.client import Client
from neuron_rtd.command_line import add_cast
from neuron_rtd.errors import BadInput as RefusedInput
from neuron_rtd.errors import Nerr
from neuron_rtd.neff import TensorSpec, as_input, shape_problem
from neuron_rtd.neff.casting import shape_text
from neuron_rtd.records.npz import NpzUnreadable, npz_arrays
from neuron_rtd.tools.control.command import Answer, Command, Failure, UnusableInput
from neuron_rtd.tools.control.models import model_id

SHOWN_VALUES = 6  # values of each output printed without --outputs


def read_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an npz file by name (no pickled objects); UnusableInput saying why not."""
    why = unreadable(path)
    if why:
        raise UnusableInput(f"{path}: {why}")
    try:
        return npz_arrays(path)
    except NpzUnreadable as exc:
        if exc.cause is None:
            raise UnusableInput(f"{path}: not an npz file (numpy.savez writes one)") from None
        raise UnusableInput(f"{path}: not a readable npz file ({exc.cause})") from None


def write_npz(path: str, arrays: Mapping[str, np.ndarray]) -> None:
    """The arrays into an npz file by name (as np.savez writes it, whatever the names)."""
    try:
        with zipfile.ZipFile(path, "w") as archive:
            for name, array in arrays.items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)
    except OSError as exc:
        raise Failure(f"{path}: cannot write the outputs ({exc})") from None


def mismatches(
    arrays: Mapping[str, np.ndarray],
    specs: Sequence[TensorSpec],
    where: str,
    model: int,
    cast: bool = False,
) -> list[str]:
    """What does not fit between the npz's arrays and the model's inputs, one line each:
    dtypes under the one dtype policy and shapes by the one shape check
    (`neuron_rtd.neff.casting`; `cast`: any dtype), then what the model takes of the
    inputs no line stated already (a shape's line states it: said once)."""
    problems = []
    by_name = {spec.name: spec for spec in specs}
    missing = [name for name in by_name if name not in arrays]
    extra = sorted(set(arrays) - set(by_name))
    if missing:
        problems.append(f"{where} has no array named {', '.join(map(repr, missing))}")
    if extra:
        names = ", ".join(map(repr, extra))
        problems.append(f"{where} has arrays the model does not take: {names}")
    stated = set()
    for name, array in arrays.items():
        spec = by_name.get(name)
        if spec is None:
            continue
        try:
            as_input(array, spec.dtype, name, cast=cast, option="--cast")
        except RefusedInput as exc:
            problems.append(f"{where}: {exc}")
        shape = shape_problem(array.shape, spec)
        if shape is not None:
            problems.append(f"{where}: {shape}")
            stated.add(name)
    rest = [s for s in specs if s.name not in stated]
    if problems and (rest or not specs):
        takes = ", ".join(f"{s.name}: {s.describe()}" for s in rest) or "no inputs"
        problems.append(f"model {model} takes {takes}")
    return problems


def summary(name: str, array: np.ndarray) -> dict[str, Any]:
    """An output for --json: dtype, shape, first values, and for numbers min, max and mean
    of the finite values and how many are not finite (NaN or infinite: null in JSON)."""
    flat = array.reshape(-1)
    head = flat[:SHOWN_VALUES].tolist()
    first = [v if not isinstance(v, float) or math.isfinite(v) else None for v in head]
    doc: dict[str, Any] = {
        "name": name,
        "dtype": array.dtype.name,
        "shape": list(array.shape),
        "first": first,
    }
    if array.dtype != np.bool_:
        values = flat.astype(np.float64)
        finite = values[np.isfinite(values)]
        stats = (finite.min(), finite.max(), finite.mean()) if finite.size else (None,) * 3
        doc.update(zip(("min", "max", "mean"), map(_number, stats), strict=True))
        doc["nonfinite"] = int(values.size - finite.size)
    return doc


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def summary_line(name: str, array: np.ndarray) -> str:
    """`probs: float32 (1, 10)  min ...  max ...  mean ...` and the first values."""
    doc = summary(name, array)
    line = f"{name}: {array.dtype.name} {shape_text(array.shape)}"
    if doc.get("min") is not None:
        line += f"  min {doc['min']:.6g}  max {doc['max']:.6g}  mean {doc['mean']:.6g}"
    if doc.get("nonfinite"):
        line += f"  ({doc['nonfinite']} NaN or infinite)"
    head = array.reshape(-1)[:SHOWN_VALUES].tolist()
    shown = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in head)
    more = ", ..." if array.size > SHOWN_VALUES else ""
    return f"{line}\n  [{shown}{more}]"


class Infer(Command):
    """`neuron-cli infer ID --inputs in.npz [--outputs out.npz] [--shm] [--cast]`: one
    inference.

    The npz holds one array per input of the model, by the input's name, in the shape the
    model takes and its dtype, or another whose values that dtype holds (int32 for int64,
    float64 values float32 holds exactly; --cast converts any, as numpy's unsafe cast
    does); neuron-cli list-model --json shows them. Anything that does not fit is named
    before anything is sent. The model must be READY (neuron-cli start).
    --outputs writes the outputs to an npz, by name; without it each output's dtype,
    shape, min, max, mean and first values are printed. --shm sends the tensors through
    POSIX shared memory instead of inline in the gRPC messages."""

    hints = {Nerr.INVALID: "compare the inputs with what the model takes (list-model --json)"}

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("model_id", metavar="ID", type=model_id, help="the model's id")
        parser.add_argument(
            "--inputs", required=True, metavar="in.npz", help="the inputs, one array per name"
        )
        parser.add_argument("--outputs", metavar="out.npz", help="write the outputs here")
        parser.add_argument(
            "--shm", action="store_true", help="send the tensors through shared memory"
        )
        add_cast(parser)

    def shm(self, args: argparse.Namespace) -> bool:
        return bool(args.shm)

    def check(self, args: argparse.Namespace) -> None:
        why = unreadable(args.inputs)
        if why:
            raise UnusableInput(f"{args.inputs}: {why}")
        if not zipfile.is_zipfile(args.inputs):
            raise UnusableInput(f"{args.inputs}: not an npz file (numpy.savez writes one)")

    def execute(self, args: argparse.Namespace, client: Client) -> Answer:
        arrays = read_npz(args.inputs)
        model = client.attach(args.model_id)
        problems = mismatches(arrays, model.inputs, args.inputs, args.model_id, args.cast)
        if problems:
            raise UnusableInput("; ".join(problems))
        outputs = model.infer(arrays, cast=args.cast)
        transport = "through shared memory" if client.shm_enabled else "inline"
        docs = [summary(name, array) for name, array in outputs.items()]
        data: dict[str, Any] = {
            "model_id": args.model_id,
            "transport": "shm" if client.shm_enabled else "inline",
            "outputs": docs,
            "file": None,
        }
        head = f"model {args.model_id} ({model.signature.name}), tensors {transport}"
        if args.outputs:
            write_npz(args.outputs, outputs)
            data["file"] = str(Path(args.outputs).resolve())
            shapes = ", ".join(f"{d['name']} {d['dtype']} {shape_text(d['shape'])}" for d in docs)
            return Answer(f"{head}: wrote {shapes} to {args.outputs}", data)
        lines = [f"{head}:"]
        lines += [summary_line(name, array) for name, array in outputs.items()]
        return Answer("\n".join(lines), data)
