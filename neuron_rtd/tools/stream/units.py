"""The units a run's work is cut into, one per shard and epoch (or per chunk of a
manifest's interleave), named stably across runs: what the checkpoint records done and
what each output file is named after."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from neuron_rtd.tools.stream.sources import Shard, redact

OutputFormat = Literal["tfrecord", "npy"]


@dataclass(frozen=True)
class WorkUnit:
    epoch: int
    shard: Shard | None  # None: a chunk of a manifest's interleave
    chunk: int = 0

    @property
    def name(self) -> str:
        """Stable across runs: the epoch and the shard's URL without its credentials (or
        the chunk's index)."""
        if self.shard is None:
            return f"e{self.epoch:03d}-mix-{self.chunk:05d}"
        url = redact(self.shard.url)
        digest = hashlib.sha1(url.encode()).hexdigest()[:8]
        base = Path(url.split("://", 1)[-1]).name
        for suffix in (".gz", ".zz", ".zlib", ".tfrecord", ".tfrecords"):
            base = base.removesuffix(suffix)
        return f"e{self.epoch:03d}-{digest}-{base}"

    def output_name(self, fmt: OutputFormat) -> str:
        return f"{self.name}{'.tfrecord' if fmt == 'tfrecord' else '.npz'}"
