"""`python -m neuron_rtd.cli.stream_demo`: a sample data set streamed through a ResNet.

Writes 8 TFRecord shards of PNG images (64x64), compiles a small ResNet-18-style model
(batch 4), starts the daemon on a private simulated machine, and runs `neuron-batch` over
the shards on 2 NeuronCore Groups, as a user would, printing its progress and throughput;
then the first output record. Its files go in a temporary folder removed at the end, or
in `--work DIR`, kept (the daemon stops either way: the command it prints then runs again
against a daemon of one's own, given by `-a`).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.command_line import EXIT_OK, add_version, entry
from neuron_rtd.compiler import compile_model
from neuron_rtd.help_format import PlainHelp
from neuron_rtd.models import resnet
from neuron_rtd.proto import tf_pb
from neuron_rtd.records.tfrecord import read_file
from neuron_rtd.tools.stream.checkpoint import CHECKPOINT
from neuron_rtd.tools.stream.sample import image_shards

PROG = "python -m neuron_rtd.cli.stream_demo"


@contextlib.contextmanager
def work_folder(kept: Path | None) -> Iterator[Path]:
    """`kept` (made if need be, left at the end), or a temporary folder removed at the end."""
    if kept is not None:
        kept.mkdir(parents=True, exist_ok=True)
        yield kept
        return
    with tempfile.TemporaryDirectory(prefix="stream-demo-") as tmp:
        yield Path(tmp)


@entry(PROG)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A sample data set of PNG images streamed through a ResNet on the daemon "
        "with neuron-batch; prints throughput.",
        formatter_class=PlainHelp,
    )
    parser.add_argument("--images", type=int, default=512, help="records (default 512)")
    parser.add_argument(
        "--work",
        type=Path,
        metavar="DIR",
        help="write the shards, the model and the outputs here and keep them (default: a "
        "temporary folder, removed at the end)",
    )
    add_version(parser)
    args = parser.parse_args(argv)
    with work_folder(args.work) as work:
        shards = image_shards(work / "data", shards=8, per_shard=max(1, args.images // 8), size=64)
        neff = work / "resnet.neff"
        neff.write_bytes(
            compile_model(resnet.build(**resnet.SMALL), input_shapes={"input": [4, 3, 64, 64]}).neff
        )
        print(f"{len(shards)} shards of PNG images in {work / 'data'}; the ResNet: {neff.name}")
        with DaemonProcess(sim_root=work / "sim") as daemon:
            command = [
                sys.executable, "-m", "neuron_rtd.cli.neuron_batch",
                "--neff", str(neff), "--input", str(work / "data" / "*.tfrecord"),
                "--feature", "image=input:float32:3,64,64:image",
                "--output", str(work / "out"), "--ncgs", "2", "-a", daemon.address,
            ]  # fmt: skip
            if (work / "out" / CHECKPOINT).exists():  # a kept --work DIR's earlier run
                command.append("--overwrite")
            print("$ neuron-batch " + " ".join(command[3:]))
            print(
                f"(its files stay in {work}; the daemon it names stops with the demo: to run it "
                "again, give -a your own daemon's address)"
                if args.work
                else "(its files are in a temporary folder, removed when the demo ends: "
                "--work DIR keeps them)"
            )
            done = subprocess.run(command, text=True)
            if done.returncode != 0:
                return done.returncode
        first = next(read_file(sorted((work / "out").glob("*.tfrecord"))[0]))
        features = tf_pb.Example.FromString(first.data).features.feature
        probs = list(features["probs"].float_list.value)
        key = features["key"].bytes_list.value[0].decode()
        best = max(range(len(probs)), key=probs.__getitem__)
        print(f"first output: {key.rsplit('/', 1)[-1]} -> class {best} ({probs[best]:.3f})")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
