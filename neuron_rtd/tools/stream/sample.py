"""Sample data sets of TFRecord shards, for the stream demo, the bench and the tests:
Examples of PNG images (a ResNet's input) or of raw float32 vectors (an MLP's); and a
local S3-compatible server to stream them from."""

from __future__ import annotations

import contextlib
import io
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from neuron_rtd.proto import tf_pb
from neuron_rtd.records.tfrecord import Writer


def _shards(
    folder: Path,
    name: str,
    shards: int,
    per_shard: int,
    example: Callable[[], tf_pb.Example],
) -> list[Path]:
    """`shards` files `folder/name-NNN` (a .gz name: GZIP) of `per_shard` examples each."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        path = folder / name.replace("NNN", f"{s:03d}")
        with Writer(path) as writer:
            for _ in range(per_shard):
                writer.write(example().SerializeToString())
        paths.append(path)
    return paths


def image_shards(
    folder: Path, *, shards: int, per_shard: int, size: int, seed: int = 0, gzip: bool = False
) -> list[Path]:
    """Shards of Examples with `image`, a PNG of size x size x 3, and `label`."""
    rng = np.random.default_rng(seed)

    def example() -> tf_pb.Example:
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        png = io.BytesIO()
        Image.fromarray(pixels).save(png, format="PNG", compress_level=1)
        made = tf_pb.Example()
        features = made.features.feature
        features["image"].bytes_list.value.append(png.getvalue())
        features["label"].int64_list.value.append(int(rng.integers(0, 10)))
        return made

    name = f"images-NNN.tfrecord{'.gz' if gzip else ''}"
    return _shards(folder, name, shards, per_shard, example)


def vector_shards(
    folder: Path, *, shards: int, per_shard: int, width: int, seed: int = 0
) -> list[Path]:
    """Shards of Examples with `x`, `width` raw float32 values."""
    rng = np.random.default_rng(seed)

    def example() -> tf_pb.Example:
        made = tf_pb.Example()
        x = rng.standard_normal(width).astype(np.float32)
        made.features.feature["x"].bytes_list.value.append(x.tobytes())
        return made

    return _shards(folder, "vectors-NNN.tfrecord", shards, per_shard, example)


@contextlib.contextmanager
def local_s3(log_dir: Path) -> Iterator[dict[str, str]]:
    """A local S3-compatible server (moto's server mode, `pip install moto[server]`) on
    127.0.0.1, for as long as the block runs; the environment that points fsspec's s3 at
    it (set it in os.environ, or pass it to a subprocess)."""
    server = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    if not Path(server).exists():
        raise FileNotFoundError("moto_server is not installed (pip install 'moto[server]')")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log_path = log_dir / "moto.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [server, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                with socket.socket() as probe:
                    if probe.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"moto_server did not listen: {log_path.read_text()}")
                time.sleep(0.1)
            yield {
                "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test",
                "AWS_DEFAULT_REGION": "us-east-1",
                "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            }
        finally:
            proc.terminate()
            proc.wait(30)
