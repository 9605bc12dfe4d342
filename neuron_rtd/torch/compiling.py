"""An exported module compiled by neuron-cc in this process, `compiler_args` read as its
command line reads them (`neuron-cc compile --help`), its progress bar shown on a terminal
as the command shows it, and its refusals raised as `CompileFailed`."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Sequence

from neuron_rtd.compiler import CompileError, CompileResult
from neuron_rtd.compiler.cli import compile_from_args, parser, progress_bar
from neuron_rtd.torch.errors import CompileFailed

DEFAULT_BATCH_LIMIT = 8  # dynamic batch: buckets 1..max(this, the traced batch) by default


def compiler_options(
    compiler_args: Sequence[str] | None, *, name: str, dynamic_batch: bool, batch: int
) -> argparse.Namespace:
    """neuron-cc's options from `compiler_args` (as `neuron-cc compile` takes them), with
    the model's `name`, and with `dynamic_batch` log2 buckets up to the larger of
    DEFAULT_BATCH_LIMIT and the traced `batch` unless `--dynamic-batch` gives others."""
    given = [str(arg) for arg in compiler_args or ()]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            options = parser().parse_args(["compile", "<traced>", "-o", "<memory>", *given])
    except SystemExit:
        said = errors.getvalue().strip().splitlines()
        why = said[-1].split("error: ", 1)[-1] if said else "not options of neuron-cc compile"
        raise CompileFailed(
            f"compiler_args {given}: {why} (see `neuron-cc compile --help`)"
        ) from None
    if options.dynamic_batch is not None and not dynamic_batch:
        raise CompileFailed(
            "compiler_args --dynamic-batch needs trace(..., dynamic_batch_size=True), which "
            "exports the module with a symbolic batch axis"
        )
    if dynamic_batch and options.dynamic_batch is None:
        options.dynamic_batch = (1, max(DEFAULT_BATCH_LIMIT, batch), "log2")
    options.name = options.name or name
    return options


def compile_exported(onnx_model: bytes, options: argparse.Namespace) -> CompileResult:
    """The NEFF of `onnx_model` and its summary, compiled with `options`."""
    shown = not (options.quiet or options.json) and sys.stderr.isatty()
    try:
        with progress_bar(shown) as progress:
            result = compile_from_args(options, progress, onnx_model)
    except CompileError as exc:
        raise CompileFailed(f"neuron-cc could not compile {options.name}: {exc}") from None
    return result
