"""The compiler's command line: `neuron-cc compile model.onnx -o model.neff [options]`,
and `neuron-cc quantize model.onnx -o model.int8.onnx --calibration samples.npz` (a float
model into a QDQ int8 one that `compile` takes: neuron_rtd/compiler/quantize.py), or
`--calibration 'shards/*.tfrecord' --feature image:float32:3,224,224` (Example records,
read as neuron-batch reads them: neuron_rtd/compiler/calibration.py).

Exit codes: 0 done (the summary printed), 1 the model cannot be compiled or quantized (the
message names the node, op and reason, or onnxruntime's quantizer's; also a file that is
not an ONNX model; no file is written), 2 bad arguments (also a model or calibration file
that is not there or not readable, calibration samples that do not fit the model's inputs,
a corrupt calibration record, an output that cannot be written), 130 Ctrl-C, 143 SIGTERM.

`neuron-cc --help` shows each command's options too (its manual page is made from it).

On a terminal, progress per phase (and per bucket, per calibration sample) goes to stderr
(none with -q, --json, or when stderr is not a terminal); `--json` prints the summary as
JSON on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from neuron_rtd.arguments import parse_shape, positive, unreadable
from neuron_rtd.command_line import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_cast,
    add_json_output,
    add_version,
    entry,
)
from neuron_rtd.compiler import quantize
from neuron_rtd.compiler.buckets import bucket_ranges
from neuron_rtd.compiler.calibration import read_calibration
from neuron_rtd.compiler.compile import CompileResult, compile_model
from neuron_rtd.compiler.compile import Progress as ProgressFn
from neuron_rtd.compiler.errors import CompileError
from neuron_rtd.compiler.partition import LARGEST_MACHINE_NCS, SMALLEST_MACHINE_NCS
from neuron_rtd.help_format import PlainHelp
from neuron_rtd.neff import write_neff
from neuron_rtd.neff.program import AUTO_CAST_MODES, AUTO_CAST_TYPES
from neuron_rtd.records.features import FEATURE_METAVAR, feature_argument


def _range(text: str) -> tuple[int, int, str]:
    """LOW:HIGH[:SCHEME] or HIGH (low 1); SCHEME as `bucket_ranges` takes it."""
    parts = text.split(":", 2)
    try:
        if len(parts) == 1:
            return 1, int(parts[0]), "log2"
        scheme = parts[2] if len(parts) == 3 else "log2"
        return int(parts[0]), int(parts[1]), scheme
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected HIGH or LOW:HIGH[:log2|uniform:K|single|B1,B2,...], got {text!r}"
        ) from None


def _dynamic(text: str) -> tuple[str, tuple[int, int, str]]:
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected SYMBOL=LOW:HIGH[:SCHEME], got {text!r}")
    return name, _range(rest)


class _Compiler(argparse.ArgumentParser):
    """neuron-cc's parser: its help ends with each command's, options and all."""

    command_parsers: list[argparse.ArgumentParser]

    def format_help(self) -> str:
        helps = [super().format_help(), *(p.format_help() for p in self.command_parsers)]
        return "\n".join(helps)


def _percentile(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(
            f"expected a percentile above 0 and at most 100 (e.g. 99.99), got {text!r}"
        )
    return value


def parser() -> argparse.ArgumentParser:
    top = _Compiler(
        prog="neuron-cc", description="Compile ONNX models to NEFF.", formatter_class=PlainHelp
    )
    add_version(top)
    commands = top.add_subparsers(
        dest="command", required=True, parser_class=argparse.ArgumentParser
    )
    cmd = commands.add_parser(
        "compile",
        help="compile an ONNX model into a NEFF",
        description="Compile an ONNX model into a NEFF: the summary on stdout, progress on a "
        "terminal's stderr.",
        formatter_class=PlainHelp,
    )
    cmd.add_argument("model", help="the ONNX model file")
    cmd.add_argument("-o", "--output", required=True, help="the NEFF file to write")
    cmd.add_argument(
        "--num-neuroncores",
        type=int,
        metavar="N",
        help="split the Neuron part into N pipeline stages and take at most N NCs, Neuron "
        f"nodes sharing them if need be (default: 1 stage, at most {SMALLEST_MACHINE_NCS} "
        f"NCs, the smallest machine's; N is at most {LARGEST_MACHINE_NCS}, the largest's)",
    )
    cmd.add_argument(
        "--input-shape",
        type=functools.partial(parse_shape, example="input=1,3,224,224"),
        action="append",
        default=[],
        metavar="NAME=DIMS",
        help="fix an input's shape, e.g. input=1,3,224,224 (repeatable)",
    )
    cmd.add_argument(
        "--dynamic-batch",
        type=_range,
        metavar="[LOW:]HIGH[:SCHEME]",
        help="axis 0 of every input is dynamic: buckets over LOW..HIGH "
        "(SCHEME log2 (default), uniform:K, single, or bounds B1,B2,...)",
    )
    cmd.add_argument(
        "--dynamic",
        type=_dynamic,
        action="append",
        default=[],
        metavar="SYMBOL=LOW:HIGH[:SCHEME]",
        help="buckets for a symbolic input dimension, e.g. S=1:128:16,32,64,128",
    )
    cmd.add_argument(
        "--auto-cast",
        choices=AUTO_CAST_MODES,
        default="none",
        help="fp32 ops the NCs compute in --auto-cast-type, accumulating in fp32: none (fp32, "
        "exact), matmult (matrix multiplies and convolutions), all (default none)",
    )
    cmd.add_argument(
        "--auto-cast-type",
        choices=AUTO_CAST_TYPES,
        default="bf16",
        help="the 16-bit type of --auto-cast (default bf16)",
    )
    cmd.add_argument("--name", help="the model name in the NEFF (default: the ONNX graph name)")
    cmd.add_argument("--gzip", action="store_true", help="compress the NEFF archive")
    cmd.add_argument("-q", "--quiet", action="store_true", help="print no summary and no progress")
    add_json_output(cmd, "print the summary as JSON (and no progress)")
    top.command_parsers = [cmd, _quantize_parser(commands)]
    return top


def _quantize_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    cmd = commands.add_parser(
        "quantize",
        help="quantize a float ONNX model to int8 (QDQ), calibrated on sample inputs",
        description="Quantize a float ONNX model to int8 in QDQ form (activations and weights "
        "int8), its activation ranges calibrated on sample inputs, with onnxruntime's "
        "quantizer: the model that neuron-cc compile takes. The summary on stdout, progress "
        "on a terminal's stderr.",
        formatter_class=PlainHelp,
    )
    cmd.add_argument("model", help="the float ONNX model file")
    cmd.add_argument("-o", "--output", required=True, help="the int8 ONNX file to write")
    cmd.add_argument(
        "--calibration",
        required=True,
        nargs="+",
        action="extend",
        metavar="PATH",
        help="the calibration samples: an npz with one array per model input, named as the "
        "input, its samples along axis 0 in front of the input's axes (or along the input's "
        "own batch axis); or TFRecord shards of tf.train.Example records (local files or "
        "globs, .gz and .zz decompressed), a record per sample, with --feature",
    )
    cmd.add_argument(
        "--feature",
        action="append",
        default=[],
        type=feature_argument,
        metavar=FEATURE_METAVAR,
        help="with TFRecord shards: the Example feature NAME to the model input of that name "
        "(or to INPUT), as one record's dtype and shape (the input's, or the input's without "
        "its batch axis), decoded raw (default), from a list, or as an image (repeatable: one "
        "per input; neuron-batch's --feature)",
    )
    cmd.add_argument(
        "--method",
        choices=tuple(quantize.METHODS),
        default="minmax",
        help="how activation ranges are calibrated: minmax (the samples' extremes), entropy "
        "(the least KL divergence), percentile (default minmax)",
    )
    cmd.add_argument(
        "--percentile",
        type=_percentile,
        metavar="P",
        help=f"the percentile method's range: the P-th percentile of magnitudes (default "
        f"{quantize.DEFAULT_PERCENTILE:g})",
    )
    scales = cmd.add_mutually_exclusive_group()
    scales.add_argument(
        "--per-channel",
        dest="per_channel",
        action="store_true",
        default=True,
        help="a weight scale per output channel (the default)",
    )
    scales.add_argument(
        "--per-tensor",
        dest="per_channel",
        action="store_false",
        help="one weight scale per tensor",
    )
    cmd.add_argument(
        "--samples",
        type=positive,
        metavar="N",
        help="calibrate on the first N samples (default all; of TFRecord shards, no more "
        "records are read)",
    )
    add_cast(cmd)
    cmd.add_argument("-q", "--quiet", action="store_true", help="print no summary and no progress")
    add_json_output(cmd, "print the summary as JSON (and no progress)")
    return cmd


@contextlib.contextmanager
def progress_bar(shown: bool) -> Iterator[ProgressFn | None]:
    """A progress bar on stderr while compiling, when `shown` (also the torch plugin's)."""
    if not shown:
        yield None
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with bar:
        task = bar.add_task("starting", total=None)

        def update(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)
            bar.refresh()  # each step drawn, however short (a few per compile)

        yield update


def _unwritable(output: str) -> str | None:
    """Why `output` cannot be written, checked before the compile (None: it can)."""
    path = Path(output)
    folder = path.parent
    if path.is_dir():
        return "it is a directory"
    if not folder.is_dir():
        return f"there is no directory {folder}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"directory {folder} is not writable"
    return None


@entry("neuron-cc")
def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    unusable = unreadable(args.model, "ONNX file")
    if unusable:
        print(f"neuron-cc: error: {args.model}: {unusable}", file=sys.stderr)
        return EXIT_USAGE
    why = _unwritable(args.output)
    if why:
        print(f"neuron-cc: error: cannot write {args.output}: {why}", file=sys.stderr)
        return EXIT_USAGE
    shown = not (args.quiet or args.json) and sys.stderr.isatty()
    if args.command == "quantize":
        return _quantize(args, shown)
    try:
        with progress_bar(shown) as progress:
            result = compile_from_args(args, progress)
    except CompileError as exc:
        print(f"neuron-cc: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        write_neff(args.output, result.neff)
    except OSError as exc:
        print(f"neuron-cc: error: cannot write {args.output}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps({**result.summary.as_json(), "output": args.output}, indent=2))
    elif not args.quiet:
        print(result.summary)
        print(f"wrote {args.output}")
    return EXIT_OK


def _quantize(args: argparse.Namespace, shown: bool) -> int:
    """`neuron-cc quantize`: the int8 model written, or the reason it is not."""
    if args.percentile is not None and args.method != "percentile":
        print(
            f"neuron-cc: error: --percentile applies to --method percentile, not {args.method}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        model = quantize.load_float_model(args.model)
    except CompileError as exc:
        print(f"neuron-cc: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        samples, given = read_calibration(
            args.calibration,
            args.feature,
            quantize.model_inputs(model),
            limit=args.samples,
            cast=args.cast,
        )
    except quantize.CalibrationError as exc:
        print(f"neuron-cc: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    options = quantize.QuantizeOptions(
        method=args.method,
        percentile=quantize.DEFAULT_PERCENTILE if args.percentile is None else args.percentile,
        per_channel=args.per_channel,
    )
    try:
        with progress_bar(shown) as progress:
            result = quantize.quantize_model(model, samples, options, progress)
    except CompileError as exc:
        print(f"neuron-cc: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        _write_whole(args.output, result.model)
    except OSError as exc:
        print(f"neuron-cc: error: cannot write {args.output}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    summary = result.summary
    if args.json:
        doc = {**summary.as_json(), "samples_given": given, "output": args.output}
        print(json.dumps(doc, indent=2))
    elif not args.quiet:
        print(summary)
        print(f"wrote {args.output}")
    return EXIT_OK


def _write_whole(output: str, data: bytes) -> None:
    """`data` into `output`, or no file there when that fails or is interrupted."""
    try:
        Path(output).write_bytes(data)
    except BaseException:
        Path(output).unlink(missing_ok=True)
        raise


def compile_from_args(
    args: argparse.Namespace,
    progress: ProgressFn | None,
    model: str | bytes | onnx.ModelProto | None = None,
) -> CompileResult:
    """Compile as `compile`'s options in `args` say: `args.model`, or `model` when given
    (the torch plugin hands its exported model over in memory, with its own options)."""
    return compile_model(
        args.model if model is None else model,
        num_neuroncores=args.num_neuroncores,
        input_shapes=dict(args.input_shape),
        dynamic={sym: bucket_ranges(*spec) for sym, spec in args.dynamic},
        dynamic_batch=None if args.dynamic_batch is None else bucket_ranges(*args.dynamic_batch),
        name=args.name,
        gzip=args.gzip,
        auto_cast=args.auto_cast,
        auto_cast_type=args.auto_cast_type,
        progress=progress,
    )


if __name__ == "__main__":
    sys.exit(main())
