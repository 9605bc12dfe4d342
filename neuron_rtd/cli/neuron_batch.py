"""`neuron-batch`: stream TFRecord shards through a model on the daemon, outputs in order.

    neuron-batch --neff MODEL.neff --input 'data/train-*.tfrecord' \\
        --feature image:float32:3,224,224 --output out/ [--ncgs 2] [--resume | --overwrite]

The exit codes are in EXIT_CODES, which --help prints.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.text import Text

from neuron_rtd.arguments import positive, unreadable
from neuron_rtd.client import NrtClientError
from neuron_rtd.client.address import AddressError, default_address, grpc_target
from neuron_rtd.command_line import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SIGTERM,
    EXIT_USAGE,
    add_address,
    add_cast,
    add_json_output,
    add_version,
    entry,
    signal_exit_code,
)
from neuron_rtd.errors import NrtError
from neuron_rtd.help_format import PlainHelp
from neuron_rtd.neff import read_neff
from neuron_rtd.records.features import (
    FEATURE_METAVAR,
    DecodeError,
    SpecMismatch,
    check_specs,
    feature_argument,
)
from neuron_rtd.records.tfrecord import CorruptRecord, RecordTooLarge
from neuron_rtd.tools.stream.checkpoint import CHECKPOINT, BadCheckpoint, Checkpoint
from neuron_rtd.tools.stream.output_folder import UnsafeOutput, prepare
from neuron_rtd.tools.stream.pipeline import Options, Pipeline
from neuron_rtd.tools.stream.sources import expand, read_manifest, redact

PROG = "neuron-batch"
EXIT_CODES = (
    "Exit codes: 0 every record answered (or skipped under --on-corrupt skip); 1 the data, "
    "the storage or the daemon failed the run (a corrupt record under fail: which and where; "
    "a record over --max-record-mb); 2 a usage error (also a --feature or --batch the model "
    "does not take, an --output folder refused or used by a run already without --resume or "
    "--overwrite, a checkpoint --resume cannot read); 130 or 143 stopped by Ctrl-C or "
    "SIGTERM (--resume goes on)."
)


def _cores_busy(figures: dict[str, float]) -> str:
    """The host's cores busy on average, and the daemon's share of them: CPU time is
    counted in ticks of 10 ms, so a short run's may read above the cores there are."""
    cores = figures["host_cpus"]
    host, daemon = (
        min(figures[k] / figures["seconds"], cores) for k in ("host_cpu_s", "daemon_cpu_s")
    )
    return f"host CPU {host:.1f} of {cores:.0f} cores busy, the daemon {daemon:.1f}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Stream TFRecord shards (local paths, globs or fsspec URLs such as "
        "s3:// or https://) through a model loaded on M NeuronCore Groups of the daemon, and "
        "write the outputs in order, each with its input record's key. A run is resumable.",
        epilog=EXIT_CODES,
        formatter_class=PlainHelp,
    )
    p.add_argument("--neff", required=True, help="the compiled model")
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="PATH|GLOB|URL",
        help="TFRecord shards (repeatable; .gz and .zz are decompressed)",
    )
    p.add_argument(
        "--manifest",
        type=Path,
        metavar="FILE",
        help="instead of --input: classes of shards with weights (JSON, or augmented-manifest "
        "lines), their records interleaved by weight; the file is read again every batch, so "
        "a changed weight takes effect during the run",
    )
    p.add_argument(
        "--feature",
        action="append",
        required=True,
        type=feature_argument,
        metavar=FEATURE_METAVAR,
        help="the Example feature NAME to the model input of that name (or to INPUT), as "
        "one record's dtype and shape, decoded raw (default), from a list, or as an image "
        "(repeatable: one per input)",
    )
    add_cast(
        p,
        "a record's values the feature's dtype cannot hold, a feature's dtype the "
        "model's input cannot",
    )
    p.add_argument(
        "--output",
        required=True,
        type=Path,
        help="the folder of the outputs: made (0755 at most) if it is not there; one another "
        "user owns, or others than its owner may write in, is refused",
    )
    p.add_argument(
        "--format",
        choices=("tfrecord", "npy"),
        default="tfrecord",
        help="of the outputs (default tfrecord: Examples with the input's key; npy: an npz "
        "per shard)",
    )
    p.add_argument(
        "--ncgs", type=positive, default=1, help="copies of the model, one NCG each (default 1)"
    )
    p.add_argument("--channels", type=positive, default=2, help="shards read at once (default 2)")
    p.add_argument(
        "--ninfer", type=positive, default=4, help="batches in flight per NCG (default 4)"
    )
    p.add_argument("--batch", type=positive, help="records a batch (default: the model's batch)")
    p.add_argument(
        "--on-corrupt",
        choices=("fail", "skip"),
        default="fail",
        help="a record whose CRC or frame is wrong fails the run, or is skipped, counted "
        "and logged (default fail)",
    )
    p.add_argument(
        "--shuffle", type=int, metavar="SEED", help="shuffle the shards each epoch with this seed"
    )
    p.add_argument("--epochs", type=positive, default=1, help="passes over the data (default 1)")
    p.add_argument(
        "--decode-workers",
        type=int,
        default=0,
        metavar="N",
        help="processes that decode batches, off the reading threads (default 0: the "
        "channels decode, Pillow and numpy mostly off the interpreter lock). Each batch "
        "then crosses between processes pickled: on a 2-core host that cost more than it "
        "saved (PNG images, 1 or 2 workers: a third slower); try it where cores are spare",
    )
    p.add_argument(
        "--timeout",
        type=positive,
        default=60,
        metavar="SECONDS",
        help="how long one batch's inference may take (default 60)",
    )
    p.add_argument(
        "--max-record-mb",
        type=positive,
        default=256,
        metavar="MIB",
        help="a record longer than this is refused (exit 1) from its header, before it is read "
        "(default 256)",
    )
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="skip the shards a killed run finished (one whose output is missing is done again)",
    )
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in an --output folder a run used: the outputs its checkpoint lists "
        "and the checkpoint are removed first",
    )
    add_json_output(p, "progress as JSON lines on stdout")
    add_address(p)
    add_version(p)
    return p


def used_before(output: Path) -> str | None:
    """What a run left in `output` (its checkpoint), said for a run that would start over
    there; None when no run did."""
    if not (output / CHECKPOINT).exists():
        return None
    try:
        done = f"{len(Checkpoint(output, resume=True).done)} shard(s) done"
    except BadCheckpoint:
        done = "unreadable"
    return f"a run used it already (its checkpoint {output / CHECKPOINT}: {done})"


def start_over(output: Path) -> None:
    """Remove what an earlier run left in `output`: the outputs of the units its checkpoint
    lists (their own names only, never another file) and the checkpoint."""
    try:
        done = Checkpoint(output, resume=True).done
    except BadCheckpoint:
        done = set()
    for name in done:
        if "/" in name or name.startswith("."):
            continue  # not a name a run gives its outputs
        for suffix in (".tfrecord", ".npz"):
            (output / f"{name}{suffix}").unlink(missing_ok=True)
    (output / CHECKPOINT).unlink()


@entry(PROG)
def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The run the parsed arguments ask for; the exit code."""

    def error(text: str) -> None:
        """An error line on stderr, with no credentials of any URL in it."""
        print(f"{PROG}: error: {redact(text, *args.input)}", file=sys.stderr)

    if args.cast:  # every feature converted as numpy's unsafe cast does
        args.feature = [dataclasses.replace(spec, cast=True) for spec in args.feature]
    why = unreadable(args.neff)
    if why:
        error(f"--neff {args.neff}: {why}")
        return EXIT_USAGE
    try:
        neff = read_neff(Path(args.neff).read_bytes())
    except (NrtError, OSError, ValueError) as exc:
        error(f"--neff {args.neff}: {exc}")
        return EXIT_USAGE
    try:  # now, before the inputs are looked for (the run checks it again, for the API)
        check_specs(args.feature, neff.inputs, args.batch)
    except SpecMismatch as exc:
        error(str(exc))
        return EXIT_USAGE
    if bool(args.input) == (args.manifest is not None):
        error("give --input (one or more) or --manifest")
        return EXIT_USAGE
    try:
        shards = expand(args.input) if args.input else []
        if args.manifest is not None:
            read_manifest(args.manifest)  # checked now, read again during the run
    except (ValueError, OSError) as exc:
        error(str(exc))
        return EXIT_USAGE
    try:  # read as every tool reads an address (client/address.py)
        address = grpc_target(args.address) if args.address else default_address()
    except AddressError as exc:
        error(str(exc))
        return EXIT_USAGE
    try:
        prepare(args.output)
    except UnsafeOutput as exc:
        error(f"--output {exc}")
        return EXIT_USAGE
    except OSError as exc:
        why = "a file is there" if args.output.is_file() else exc.strerror
        error(f"--output {args.output}: cannot make the folder ({why})")
        return EXIT_USAGE
    used = None if args.resume else used_before(args.output)
    if used and not args.overwrite:
        error(
            f"--output {args.output}: {used}: give --resume to go on with that run, "
            "--overwrite to start over in it, or another folder"
        )
        return EXIT_USAGE
    if used:
        start_over(args.output)
    options = Options(
        neff=neff,
        shards=shards,
        features=args.feature,
        output=args.output,
        address=address,
        format=args.format,
        ncgs=args.ncgs,
        channels=args.channels,
        ninfer=args.ninfer,
        batch=args.batch,
        on_corrupt=args.on_corrupt,
        shuffle=args.shuffle,
        epochs=args.epochs,
        resume=args.resume,
        timeout_s=args.timeout,
        manifest=args.manifest,
        decode_workers=max(0, args.decode_workers),
        max_record_bytes=args.max_record_mb << 20,
    )

    console = Console(stderr=True)
    live = Live(Text("starting"), console=console, transient=True)
    shown = not args.json and console.is_terminal

    def report(figures: dict[str, float]) -> None:
        if args.json:
            print(json.dumps(figures), flush=True)
        elif shown:
            live.update(
                Text(
                    f"{figures['records']:.0f} records  {figures['records_per_s']:.0f}/s  "
                    f"{figures['mb_per_s']:.1f} MB/s  {figures['units_done']:.0f} shard(s) done  "
                    f"waiting on storage {figures['storage_wait_share']:.0%}, "
                    f"on the NCs {figures['nc_wait_share']:.0%}  "
                    f"NCs {figures['nc_busy_share']:.0%} busy  {_cores_busy(figures)}"
                )
            )

    try:  # SIGTERM stops the run as Ctrl-C does (`entry`): the shards done are kept
        with live if shown else contextlib.nullcontext():
            totals = Pipeline(options, report).run()
    except KeyboardInterrupt as stopped:
        code = signal_exit_code(stopped)
        resume = "--resume in place of --overwrite" if args.overwrite else "--resume"
        print(
            f"{PROG}: stopped by {'SIGTERM' if code == EXIT_SIGTERM else 'SIGINT'}; the shards "
            f"done are kept in {args.output}: run the same command with {resume} to go on",
            file=sys.stderr,
        )
        return code
    except (UnsafeOutput, BadCheckpoint) as exc:
        error(str(exc))
        return EXIT_USAGE
    except RecordTooLarge as exc:
        error(f"{exc} (--max-record-mb raises the limit)")
        return EXIT_FAILED
    except NrtClientError as exc:
        error(f"the daemon: {exc}")
        return EXIT_FAILED
    except (CorruptRecord, DecodeError, NrtError, OSError) as exc:
        error(str(exc))
        return EXIT_FAILED
    if not args.json:
        figures = totals.snapshot()
        print(
            f"{PROG}: {figures['records']:.0f} records in {figures['seconds']:.1f} s "
            f"({figures['records_per_s']:.0f}/s, {figures['mb_per_s']:.1f} MB/s, NCs "
            f"{figures['nc_busy_share']:.0%} busy, {_cores_busy(figures)}), "
            f"{figures['skipped']:.0f} skipped; {figures['units_done']:.0f} shard(s) written to "
            f"{args.output}, {figures['units_skipped']:.0f} done before",
            file=sys.stderr if shown else sys.stdout,
        )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
