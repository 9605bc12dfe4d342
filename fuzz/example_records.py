"""Fuzz reading tf.train.Example records in place, against protobuf, with atheris.

    python fuzz/example_records.py fuzz/corpus/example_records [libFuzzer flags: -runs=N,
        -max_total_time=S, -timeout=S ...]

A record is untrusted input. Whatever its bytes, `decode_batch` (which copies raw values
straight from them where its own reader finds them plainly laid out) gives what it gives
with every record parsed by protobuf: the same arrays, or the same DecodeError. Never
another exception, never a record read differently.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["neuron_rtd.records.features"]):
    from neuron_rtd.records.features import DecodeError, decode_batch, parse_feature

# the seeds' features: x (6 float32s), y (5 bytes, fed to input z); label is an int64 list
SPECS = [parse_feature("x:float32:2,3"), parse_feature("y=z:uint8:5")]


def outcome(data: bytes, in_place: bool) -> dict[str, bytes] | str:
    try:
        decoded = decode_batch([(data, "k")], SPECS, 1, in_place=in_place)
    except DecodeError as exc:
        return str(exc)
    return {name: array.tobytes() for name, array in decoded.items()}


def one_input(data: bytes) -> None:
    want, got = outcome(data, False), outcome(data, True)
    if got != want:
        raise AssertionError(f"read in place: {got!r}; protobuf's parse: {want!r}")


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
