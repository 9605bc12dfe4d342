"""Fuzz the NEFF reader (header, gzip, tar, graph JSON, programs, weights) with atheris.

    python fuzz/neff_reader.py fuzz/corpus/neff_reader [libFuzzer flags: -runs=N,
        -max_total_time=S, -timeout=S ...]

A NEFF is untrusted input: whatever the bytes, `read_neff` answers a parsed NEFF or an
nerr error (NrtError), within the time limit, never another exception. An input whose
first byte is odd has its header's size and hash fitted to the rest before reading, so
that mutations reach past the hash check into the archive and the graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import sys

import atheris

with atheris.instrument_imports(include=["neuron_rtd.neff"]):
    from neuron_rtd.errors import NrtError
    from neuron_rtd.neff import HEADER_SIZE, read_neff
    from neuron_rtd.neff.header import parse_header

MAX_UNPACKED = 64 << 20  # a decompression bomb is refused past this


def fitted(data: bytes) -> bytes:
    """`data` with its header's data size and hash made to fit its payload (if it has a
    header that parses at all)."""
    try:
        header = parse_header(data)
    except NrtError:
        return data
    payload = data[HEADER_SIZE:]
    header = dataclasses.replace(
        header, data_size=len(payload), sha256=hashlib.sha256(payload).digest()
    )
    return header.pack() + payload


def one_input(data: bytes) -> None:
    if not data:
        return
    neff = fitted(data[1:]) if data[0] & 1 else data[1:]
    with contextlib.suppress(NrtError):  # a refusal is the right answer
        read_neff(neff, max_unpacked=MAX_UNPACKED)


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
