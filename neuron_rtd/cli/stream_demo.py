"""`python -m neuron_rtd.cli.stream_demo`: a sample data set streamed through a ResNet.

Writes 8 TFRecord shards of PNG images (64x64), compiles a small ResNet-18-style model
(batch 4), starts the daemon on a private simulated machine, and runs `neuron-batch` over
the shards on 2 NeuronCore Groups, as a user would, printing its progress and throughput;
then the first output record.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.compiler import compile_model
from neuron_rtd.help_format import PlainHelp
from neuron_rtd.models import resnet
from neuron_rtd.proto import tf_pb
from neuron_rtd.tools.stream.sample import image_shards
from neuron_rtd.tools.stream.tfrecord import read_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m neuron_rtd.cli.stream_demo",
        description="A sample data set of PNG images streamed through a ResNet on the daemon "
        "with neuron-batch; prints throughput.",
        formatter_class=PlainHelp,
    )
    parser.add_argument("--images", type=int, default=512, help="records (default 512)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stream-demo-") as tmp:
        work = Path(tmp)
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
            print("$ neuron-batch " + " ".join(command[3:]))
            done = subprocess.run(command, text=True)
            if done.returncode != 0:
                return done.returncode
        first = next(read_file(sorted((work / "out").glob("*.tfrecord"))[0]))
        features = tf_pb.Example.FromString(first.data).features.feature
        probs = list(features["probs"].float_list.value)
        key = features["key"].bytes_list.value[0].decode()
        best = max(range(len(probs)), key=probs.__getitem__)
        print(f"first output: {key.rsplit('/', 1)[-1]} -> class {best} ({probs[best]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
