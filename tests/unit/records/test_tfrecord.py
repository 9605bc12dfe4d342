"""TFRecord framing: round trips, files from an independent writer (the `tfrecord`
package, test data only), corruption at random offsets in fail and skip modes, truncation,
GZIP and ZLIB, resuming at an offset, the index, and records over the size limit refused
before they are read."""

from __future__ import annotations

import gzip
import io
import json
import struct
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import numpy as np
import pytest
from PIL import Image

from neuron_rtd.neff import TensorSpec
from neuron_rtd.proto import tf_pb
from neuron_rtd.records.features import (
    DecodeError,
    FeatureSpec,
    SpecMismatch,
    check_specs,
    decode_batch,
    decode_record,
    example_of,
    output_examples,
    parse_feature,
)
from neuron_rtd.records.features import _bytes_values as bytes_values
from neuron_rtd.records.tfrecord import (
    MAX_RECORD_BYTES,
    CorruptRecord,
    OnCorrupt,
    ReadStats,
    Record,
    RecordTooLarge,
    Writer,
    build_index,
    frame,
    is_whole,
    masked_crc,
    read_file,
    read_index,
)
from neuron_rtd.tools.stream.sources import (
    Interleave,
    ManifestWeights,
    Shard,
    StorageError,
    epoch_order,
    expand,
    read_manifest,
    shard_records,
)


def payloads(count: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(int(rng.integers(0, 300))) for _ in range(count)]


def write(path: Path, records: list[bytes]) -> Path:
    with Writer(path) as writer:
        for data in records:
            writer.write(data)
    return path


def test_masked_crc_of_known_values() -> None:
    # CRC32C("123456789") is 0xE3069283 (the standard check value), masked as the format does
    crc = 0xE3069283
    assert masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_round_trip_with_offsets_and_index(tmp_path: Path) -> None:
    records = payloads(40)
    path = write(tmp_path / "a.tfrecord", records)
    stats = ReadStats()
    got = list(read_file(path, stats=stats))
    assert [r.data for r in got] == records
    assert (stats.records, stats.bytes, stats.skipped) == (40, sum(map(len, records)), 0)
    index = build_index(path)
    assert [offset for offset, _ in index] == [r.offset for r in got]
    assert sum(length for _, length in index) == path.stat().st_size
    resumed = list(read_file(path, start=index[25][0]))  # resume at the 26th record
    assert [r.data for r in resumed] == records[25:]
    assert resumed[0].key == f"{path}@{index[25][0]}"


def test_files_of_an_independent_writer_read_and_index_alike(tmp_path: Path) -> None:
    tfrecord = pytest.importorskip("tfrecord")
    from tfrecord import example_pb2
    from tfrecord.tools.tfrecord2idx import create_index

    path = tmp_path / "theirs.tfrecord"
    writer = tfrecord.TFRecordWriter(str(path))
    rows = [(f"image-{i}".encode(), [float(i), i / 2]) for i in range(30)]
    for name, values in rows:
        writer.write({"name": (name, "byte"), "values": (values, "float")})
    writer.close()
    got = list(read_file(path))
    assert len(got) == 30
    for record, (name, values) in zip(got, rows, strict=True):
        example = tf_pb.Example()  # our schema reads their Example's bytes
        example.ParseFromString(record.data)
        features = example.features.feature
        assert features["name"].bytes_list.value == [name]
        assert list(features["values"].float_list.value) == pytest.approx(values)
        theirs = example_pb2.Example()  # and theirs reads ours, unchanged
        theirs.ParseFromString(example.SerializeToString())
        assert theirs.features.feature["name"].bytes_list.value == [name]
    create_index(str(path), str(tmp_path / "theirs.index"))
    assert read_index(tmp_path / "theirs.index") == build_index(path)


@pytest.mark.parametrize("mode", ["fail", "skip"])
def test_corruption_at_random_offsets_is_caught(tmp_path: Path, mode: str) -> None:
    records = payloads(20, seed=1)
    clean = write(tmp_path / "clean.tfrecord", records).read_bytes()
    index = build_index(tmp_path / "clean.tfrecord")
    rng = np.random.default_rng(2)
    for trial in range(60):
        at = int(rng.integers(0, len(clean)))
        broken = bytearray(clean)
        broken[at] ^= 1 << int(rng.integers(0, 8))
        path = tmp_path / f"broken{trial}.tfrecord"
        path.write_bytes(broken)
        hit = max(i for i, (offset, _) in enumerate(index) if offset <= at)
        if mode == "fail":
            with pytest.raises(CorruptRecord) as caught:
                list(read_file(path))
            assert caught.value.offset == index[hit][0] and caught.value.path == str(path)
        else:
            stats = ReadStats()
            got = [r.data for r in read_file(path, on_corrupt="skip", stats=stats)]
            assert got == records[:hit] + records[hit + 1 :], (trial, at, hit)
            assert stats.skipped == 1 and stats.corrupt[0][:2] == (str(path), index[hit][0])


def test_a_truncated_file_is_corrupt_not_short(tmp_path: Path) -> None:
    records = payloads(10, seed=3)
    data = write(tmp_path / "t.tfrecord", records).read_bytes()
    index = build_index(tmp_path / "t.tfrecord")
    cut = index[7][0] + 5  # inside the 8th record's header
    (tmp_path / "cut.tfrecord").write_bytes(data[:cut])
    with pytest.raises(CorruptRecord, match="ends inside a record's header"):
        list(read_file(tmp_path / "cut.tfrecord"))
    stats = ReadStats()
    got = list(read_file(tmp_path / "cut.tfrecord", on_corrupt="skip", stats=stats))
    assert [r.data for r in got] == records[:7] and stats.skipped == 1


def test_gzip_and_zlib_files(tmp_path: Path) -> None:
    records = payloads(25, seed=4)
    write(tmp_path / "a.tfrecord.gz", records)
    assert gzip.decompress((tmp_path / "a.tfrecord.gz").read_bytes())[:12] == frame(records[0])[:12]
    plain = b"".join(frame(r) for r in records)
    (tmp_path / "a.tfrecord.zz").write_bytes(zlib.compress(plain))
    for name in ("a.tfrecord.gz", "a.tfrecord.zz"):
        got = list(read_file(tmp_path / name))
        assert [r.data for r in got] == records
        offsets = [r.offset for r in got]  # in the uncompressed stream: resumable
        assert [r.data for r in read_file(tmp_path / name, start=offsets[20])] == records[20:]


@pytest.mark.parametrize("name", ["b.tfrecord.gz", "b.tfrecord.zz"])
def test_a_broken_compressed_stream_is_corrupt_in_both_modes(tmp_path: Path, name: str) -> None:
    """Cut short (in its data, or in its end marker) or a byte changed: a CorruptRecord,
    never a short read taken for the end nor another error; skipped, what is given are
    whole records of the file, in order, and the break is counted."""
    records = payloads(40, seed=8)
    plain = b"".join(frame(r) for r in records)
    packed = gzip.compress(plain) if name.endswith(".gz") else zlib.compress(plain)
    middle = len(packed) // 2
    flipped = packed[:middle] + bytes([packed[middle] ^ 0xFF]) + packed[middle + 1 :]
    for broken in (packed[:middle], packed[:-3], flipped):
        path = tmp_path / name
        path.write_bytes(broken)
        with pytest.raises(CorruptRecord, match=r"corrupt record at offset \d+"):
            list(read_file(path))
        stats = ReadStats()
        got = iter(records)
        for record in read_file(path, on_corrupt="skip", stats=stats):
            assert record.data in got  # a record of the file, after the one before it
        assert stats.skipped >= 1
    assert "the compressed stream is corrupt" in stats.corrupt[-1][2]


def header(length: int) -> bytes:
    """A frame's header claiming `length` bytes of data, its CRC right."""
    packed = struct.pack("<Q", length)
    return packed + struct.pack("<I", masked_crc(packed))


def peak_bytes_allocated(read: Callable[[], None]) -> int:
    """The most memory Python held at once while `read()` ran, over what it held before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        read()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("mode", ["fail", "skip"])
def test_a_record_over_the_limit_is_refused_before_it_is_read(
    tmp_path: Path, mode: OnCorrupt
) -> None:
    """A small gzip shard whose one record claims 2 GiB (64 MiB of it there): refused from
    its header, naming the shard, the offset and the size, in either mode, none of it
    buffered (reading it whole first took a 2 GiB record's memory)."""
    records = payloads(3, seed=9)
    offset = sum(len(frame(r)) for r in records)
    plain = b"".join(frame(r) for r in records) + header(2 << 30) + bytes(64 << 20)
    shard = tmp_path / "huge.tfrecord.gz"
    shard.write_bytes(gzip.compress(plain, compresslevel=1))
    assert shard.stat().st_size < 1 << 20
    got: list[bytes] = []

    def read() -> None:
        with pytest.raises(RecordTooLarge) as caught:
            got.extend(r.data for r in shard_records(Shard(str(shard)), on_corrupt=mode))
        assert str(caught.value) == (
            f"{shard}: the record at offset {offset} is 2147483648 bytes (2048 MiB), over the "
            "limit of 256 MiB: refused unread"
        )

    assert peak_bytes_allocated(read) < 4 << 20
    assert got == records  # the records before it are given
    assert MAX_RECORD_BYTES == 256 << 20


def test_the_record_limit_is_the_caller_s(tmp_path: Path) -> None:
    path = write(tmp_path / "a.tfrecord", [b"x" * 2000])
    with pytest.raises(RecordTooLarge, match="at offset 0 is 2000 bytes"):
        list(read_file(path, max_record_bytes=1999))
    assert [len(r.data) for r in read_file(path, max_record_bytes=2000)] == [2000]


def test_a_frame_claiming_more_than_the_file_holds_costs_what_it_holds(tmp_path: Path) -> None:
    """Under the limit, a record's data is read a chunk at a time: a header claiming 200 MiB
    in a file of 1 MiB holds 1 MiB, not 200, before the file is found cut short."""
    path = tmp_path / "cut.tfrecord"
    path.write_bytes(header(200 << 20) + bytes(1 << 20))

    def read() -> None:
        with pytest.raises(CorruptRecord, match="ends inside a record of 209715200 bytes"):
            list(read_file(path))

    assert peak_bytes_allocated(read) < 4 << 20


def test_a_record_of_many_chunks_is_crc_checked_whole(tmp_path: Path) -> None:
    """The CRC summed chunk by chunk is the record's: a byte changed in its last chunk is
    caught, and the record read back is the one written."""
    data = np.random.default_rng(10).bytes((3 << 20) + 7)
    path = write(tmp_path / "big.tfrecord", [data, b"after"])
    assert [r.data for r in read_file(path)] == [data, b"after"]
    broken = bytearray(path.read_bytes())
    broken[12 + len(data) - 2] ^= 1
    path.write_bytes(broken)
    with pytest.raises(CorruptRecord, match="at offset 0: the data's CRC does not match"):
        list(read_file(path))


def test_a_whole_file_is_told_from_one_cut_short_without_reading_its_data(
    tmp_path: Path,
) -> None:
    data = write(tmp_path / "a.tfrecord", payloads(20, seed=11)).read_bytes()
    assert is_whole(tmp_path / "a.tfrecord")
    assert is_whole(write(tmp_path / "empty.tfrecord", []))
    for broken in (data[:-1], data[: len(data) // 2], data + b"\0", data[:5]):
        (tmp_path / "b.tfrecord").write_bytes(broken)
        assert not is_whole(tmp_path / "b.tfrecord")


def test_a_malformed_index_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "x.index").write_text("0 20\n20\n")
    with pytest.raises(ValueError, match=r"x.index:2: expected 'offset length'"):
        read_index(tmp_path / "x.index")


# --- features: Example -> model inputs -------------------------------------------------


def test_feature_specs_parse_or_say_what_is_wrong() -> None:
    spec = parse_feature("image:uint8:32,32,3:image")
    assert (spec.name, spec.dtype, spec.shape, spec.decode) == (
        "image",
        np.dtype("uint8"),
        (32, 32, 3),
        "image",
    )
    assert parse_feature("x:float32:4").decode == "raw"
    mapped = parse_feature("image=input:uint8:3,8,8:image")  # feature image feeds input
    assert (mapped.name, mapped.input_name) == ("image", "input")
    for bad, why in (
        ("x:float32", "expected NAME:DTYPE"),
        ("x=:float32:4", "FEATURE=INPUT"),
        ("x:floaty:4", "not a dtype"),
        ("x:float32:4,a", "is not D0,D1"),
        ("x:float32:0", "positive sizes"),
        ("x:float32:4:zip", "decode 'zip'"),
        ("x:uint8:4:image", "HxW or HxWxC"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_feature(bad)


def test_raw_list_and_image_features_decode_to_the_model_inputs() -> None:
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (8, 6, 3), dtype=np.uint8)
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, format="PNG")
    x = rng.standard_normal((2, 3)).astype(np.float32)
    example = tf_pb.Example()
    features = example.features.feature
    features["x"].bytes_list.value.append(x.tobytes())
    features["ids"].int64_list.value.extend([3, 1, 4, 1])
    features["img"].bytes_list.value.append(png.getvalue())
    specs = [
        parse_feature("x:float32:2,3"),
        parse_feature("ids:int32:4:list"),
        parse_feature("img:float32:8,6,3:image"),
    ]
    got = decode_record(example.SerializeToString(), "f@0", specs)
    np.testing.assert_array_equal(got["x"], x)
    assert got["ids"].dtype == np.int32 and got["ids"].tolist() == [3, 1, 4, 1]
    np.testing.assert_array_equal(got["img"], pixels.astype(np.float32))
    chw = decode_record(
        example.SerializeToString(), "f@0", [parse_feature("img:uint8:3,8,6:image")]
    )
    np.testing.assert_array_equal(chw["img"], pixels.transpose(2, 0, 1))  # channels first
    for spec, why in (
        ("y:float32:2", r"f@0: no feature 'y' \(the record has ids, img, x\)"),
        ("x:float32:7", "has 24 bytes, not 28"),
        ("ids:int32:5:list", "has 4 values, not 5"),
        ("x:float32:2,3:list", "is a bytes_list, not a float or int64 list"),
        ("img:uint8:4,4,3:image", r"the image is \(8, 6, 3\), not \(4, 4, 3\)"),
        ("x:uint8:2,3:image", "not an image Pillow reads"),
    ):
        with pytest.raises(DecodeError, match=why):
            decode_record(example.SerializeToString(), "f@0", [parse_feature(spec)])
    with pytest.raises(DecodeError, match=r"f@9: not a tf\.train\.Example"):
        decode_record(b"\xff\xff\xff", "f@9", specs)


def _varint(value: int, pad: int = 0) -> bytes:
    """A varint, padded with `pad` redundant continuation bytes (valid, non-minimal)."""
    out = bytearray()
    while True:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
        if not value:
            break
    out.extend([0x80] * pad)
    out[-1] &= 0x7F
    return bytes(out)


def _field(number: int, payload: bytes, pad: int = 0) -> bytes:
    return bytes([number << 3 | 2]) + _varint(len(payload), pad) + payload


def _entry(key: bytes, feature: bytes) -> bytes:
    return _field(1, _field(1, key) + _field(2, feature))


def _bytes_feature(*values: bytes) -> bytes:
    return _field(1, b"".join(_field(1, v) for v in values))


def _decodes(data: bytes, specs: list[FeatureSpec], in_place: bool) -> dict[str, np.ndarray] | str:
    """One record's inputs, or its DecodeError's message."""
    try:
        decoded = decode_batch([(data, "k")], specs, 1, in_place=in_place)
    except DecodeError as exc:
        return str(exc)
    return {name: array[0] for name, array in decoded.items()}


def test_raw_features_read_in_place_decode_as_protobuf_s_parse() -> None:
    """decode_batch copies raw values straight from the record's bytes; whatever the
    record (protobuf's own, merged or repeated parts, unknown fields, non-minimal varints,
    broken bytes), it gives what protobuf's parse gives, or the same error."""
    specs = [parse_feature("x:float32:2,3"), parse_feature("y=z:uint8:5")]
    x, y = np.arange(6, dtype=np.float32).tobytes(), b"abcde"
    example = tf_pb.Example()
    example.features.feature["x"].bytes_list.value.append(x)
    example.features.feature["y"].bytes_list.value.append(y)
    example.features.feature["label"].int64_list.value.extend([7, 8])
    plain = example.SerializeToString()
    spans = bytes_values(plain)
    assert spans is not None and spans["label"] is None  # read in place: the fast way
    assert spans["x"] is not None and plain[slice(*spans["x"])] == x
    entries = [_entry(b"x", _bytes_feature(x)), _entry(b"y", _bytes_feature(y))]
    one, other = _field(1, entries[0]), _field(1, entries[1])
    crafted = {
        "plain": plain,
        "two parts, merged": one + other,
        "a key twice, the last wins": _field(1, _entry(b"x", _bytes_feature(y))) + one + other,
        "padded lengths": _field(
            1, _field(1, _field(1, b"x", 2) + _field(2, _bytes_feature(x), 1)), 3
        )
        + other,
        "value before key": _field(1, _field(1, _field(2, _bytes_feature(x)) + _field(1, b"x")))
        + other,
        "an unknown field": one + other + b"\x18\x01",
        "two bytes values": _field(1, _entry(b"x", _bytes_feature(x, x))) + other,
        "a value in two parts": _field(1, _entry(b"x", _bytes_feature(x) + _bytes_feature(x)))
        + other,
        "a float list": _field(1, _entry(b"x", _field(2, b"\x0a\x00"))) + other,
        "a key not UTF-8": _field(1, _entry(b"\xff", _bytes_feature(x))) + one + other,
        "a key only": _field(1, _field(1, _field(1, b"x"))) + other,
        "a short value": _field(1, _entry(b"x", _bytes_feature(x[:-1]))) + other,
        "empty": b"",
    }
    for why, data in crafted.items():
        want, got = _decodes(data, specs, False), _decodes(data, specs, True)
        if isinstance(want, str):
            assert got == want, why
        else:
            assert isinstance(got, dict) and got.keys() == want.keys(), why
            for name in want:
                np.testing.assert_array_equal(got[name], want[name], err_msg=why)
    rng = np.random.default_rng(11)
    for data in crafted.values():
        cuts = [data[:n] for n in range(0, len(data), 3)]
        flips = []
        for _ in range(40):
            flipped = bytearray(data or b"\x00")
            flipped[int(rng.integers(len(flipped)))] ^= 1 << int(rng.integers(8))
            flips.append(bytes(flipped))
        for broken in cuts + flips:
            want, got = _decodes(broken, specs, False), _decodes(broken, specs, True)
            if isinstance(want, str) or isinstance(got, str):
                assert got == want, broken
            else:
                assert all(np.array_equal(got[n], want[n]) for n in want), broken


def test_feature_specs_are_checked_against_the_model_inputs() -> None:
    image = TensorSpec("image", np.dtype(np.float32), (4, 3, 8, 8))
    mask = TensorSpec("mask", np.dtype(np.int64), (4, 10), dynamic=(1,))
    specs = [parse_feature("png=image:uint8:3,8,8:image"), parse_feature("mask:int64:7:list")]
    assert check_specs(specs, [image, mask]) == 4  # the model's batch
    assert check_specs(specs, [image, mask], 4) == 4
    for given, inputs, batch, why in (
        (specs[:1], [image, mask], None, r"input\(s\) mask are fed by no --feature"),
        ([*specs, parse_feature("x=mask:int64:10:list")], [image, mask], None, "fed already"),
        ([parse_feature("png:uint8:3,8,8:image")], [image], None, "has no input 'png'"),
        ([parse_feature("png=image:uint8:8,8,3")], [image], None, "a record is 3,8,8, not 8,8,3"),
        ([parse_feature("mask:int64:11")], [mask], None, "a record is <=10, not 11"),
        (specs, [image, mask], 8, "--batch 8: the model takes batches of 4"),
    ):
        with pytest.raises(SpecMismatch, match=why):
            check_specs(given, inputs, batch)
    # a varying batch axis takes batches up to its bound, an unbounded one needs --batch
    ragged = TensorSpec("x", np.dtype(np.float32), (16, 3), dynamic=(0,))
    free = TensorSpec("x", np.dtype(np.float32), (0, 3), dynamic=(0,))
    spec = [parse_feature("x:float32:3")]
    assert check_specs(spec, [ragged], 5) == 5
    with pytest.raises(SpecMismatch, match="batches of up to 16"):
        check_specs(spec, [ragged], 17)
    with pytest.raises(SpecMismatch, match=r"has no bound.*give --batch N"):
        check_specs(spec, [free])
    assert check_specs(spec, [free], 64) == 64
    # a batch of scalars takes records of one value
    scalars = TensorSpec("s", np.dtype(np.float32), (8,))
    assert check_specs([parse_feature("s:float32:1:list")], [scalars]) == 8


def test_an_output_example_carries_its_input_key() -> None:
    out = example_of({"probs": np.array([0.25, 0.75], np.float32), "top": np.array([1])}, "a@12")
    features = tf_pb.Example.FromString(out.SerializeToString()).features.feature
    assert features["key"].bytes_list.value == [b"a@12"]
    assert list(features["probs"].float_list.value) == [0.25, 0.75]
    assert list(features["top"].int64_list.value) == [1]


def test_a_batch_of_output_examples_is_each_row_s_example() -> None:
    rng = np.random.default_rng(3)
    outputs: dict[str, np.ndarray] = {
        "probs": rng.random((3, 2, 4), np.float32),  # rows of several axes, flattened
        "top": rng.integers(-5, 1 << 40, (3, 2)),
        "half": rng.random((3, 1)).astype(np.float16),
    }
    keys = ["a@0", "a@30", "b@0"]
    written = output_examples(keys, outputs)
    for row, (key, record) in enumerate(zip(keys, written, strict=True)):
        one = {name: array[row] for name, array in outputs.items()}
        assert tf_pb.Example.FromString(record) == example_of(one, key)
    assert output_examples([], {"probs": np.zeros((0, 4), np.float32)}) == []


# --- sources: shards, epochs, manifests, weighted interleave ----------------------------


def test_shards_from_paths_globs_and_fsspec_urls(tmp_path: Path) -> None:
    records = payloads(12, seed=6)
    for i in range(3):
        write(tmp_path / f"part-{i}.tfrecord", records[i * 4 : i * 4 + 4])
    shards = expand([str(tmp_path / "part-*.tfrecord")])
    assert [Path(s.url).name for s in shards] == [f"part-{i}.tfrecord" for i in range(3)]
    got = [r.data for s in shards for r in shard_records(s)]
    assert got == records
    fs = fsspec.filesystem("memory")  # a URL, read through fsspec in ranged requests
    fs.pipe("/bucket/a.tfrecord.gz", gzip.compress(b"".join(frame(r) for r in records)))
    (remote,) = expand(["memory://bucket/*.tfrecord.gz"])
    assert [r.data for r in shard_records(remote, read_ahead=64)] == records
    offset = next(r.offset for i, r in enumerate(shard_records(remote)) if i == 5)
    assert [r.data for r in shard_records(remote, start=offset)] == records[5:]
    with pytest.raises(ValueError, match=r"--input .*nothing-\*: no file there"):
        expand([str(tmp_path / "nothing-*")])
    # a store that cannot be asked, and a shard gone by the time it is read: named
    with pytest.raises(StorageError, match="--input nope://x: ValueError: Protocol not known"):
        expand(["nope://x"])
    fs.rm("/bucket/a.tfrecord.gz")
    with pytest.raises(StorageError, match=r"memory:///bucket/a\.tfrecord\.gz: FileNotFoundError"):
        list(shard_records(remote))


def test_epochs_shuffle_shards_repeatably() -> None:
    shards = [Shard(f"s{i}") for i in range(10)]
    assert epoch_order(shards, None, 3) == shards  # no seed: as given
    one, two = epoch_order(shards, 7, 0), epoch_order(shards, 7, 1)
    assert (
        one == epoch_order(shards, 7, 0)
        and one != two
        and sorted(one, key=lambda s: s.url) == sorted(shards, key=lambda s: s.url)
    )


def test_manifests_in_both_styles(tmp_path: Path) -> None:
    write(tmp_path / "cat.tfrecord", payloads(2))
    write(tmp_path / "dog.tfrecord", payloads(2))
    (tmp_path / "m.json").write_text(
        json.dumps(
            {
                "classes": {
                    "cat": {"weight": 3, "shards": [str(tmp_path / "cat.tfrecord")]},
                    "dog": {"shards": [str(tmp_path / "dog.tfrecord")]},
                }
            }
        )
    )
    manifest = read_manifest(tmp_path / "m.json")
    assert manifest.weights == {"cat": 3.0, "dog": 1.0}
    assert manifest.shards["dog"] == [Shard(str(tmp_path / "dog.tfrecord"), "dog")]
    lines = [
        {"source-ref": str(tmp_path / "cat.tfrecord"), "class": "cat", "weight": 0.5},
        {"source-ref": str(tmp_path / "dog.tfrecord"), "class": "dog"},
    ]
    (tmp_path / "m.manifest").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert read_manifest(tmp_path / "m.manifest").weights == {"cat": 0.5, "dog": 1.0}
    (tmp_path / "bad.manifest").write_text('{"source-ref": 3}\n')
    with pytest.raises(ValueError, match=r"bad.manifest:1: expected \{\"source-ref\""):
        read_manifest(tmp_path / "bad.manifest")
    cat = str(tmp_path / "cat.tfrecord")
    for doc, why in (
        ({"a": {"weight": 0, "shards": [cat]}}, "every class's weight is 0"),
        ({"a": {"weight": 1, "shards": []}}, "class 'a': names no shard"),
        ({"a": {"shards": [cat + ".gone"]}}, r"class 'a': shard .*\.gone: no file there"),
    ):
        (tmp_path / "bad.json").write_text(json.dumps({"classes": doc}))
        with pytest.raises(ValueError, match=why):
            read_manifest(tmp_path / "bad.json")
    # read again during a run: the weights only, no shard looked for (on s3, a request each)
    (tmp_path / "later.json").write_text(json.dumps({"classes": {"a": {"shards": ["s3://x/*"]}}}))
    assert read_manifest(tmp_path / "later.json", resolve=False).weights == {"a": 1.0}


def test_manifest_weights_read_again_keep_the_last_through_a_bad_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "m.json"

    def weigh(text: str) -> dict[str, float]:
        path.write_text(text)
        return weights()

    weights = ManifestWeights(path, {"a": 1.0, "b": 1.0})
    shards = ["x.tfrecord"]
    ok = {"classes": {"a": {"weight": 2, "shards": shards}, "b": {"weight": 5, "shards": shards}}}
    assert weigh(json.dumps(ok)) == {"a": 2.0, "b": 5.0}
    assert weigh('{"classes": {"a": {"weight": 0, "shards": ["x"]}}}') == {"a": 2.0, "b": 5.0}
    assert weigh('{"classes": ') == {"a": 2.0, "b": 5.0}  # half written
    path.unlink()
    assert weights() == {"a": 2.0, "b": 5.0}
    assert len([r for r in caplog.records if "the last weights stay" in r.message]) == 3
    ok["classes"]["b"]["weight"] = 0
    assert weigh(json.dumps(ok)) == {"a": 2.0, "b": 0.0}


def endless(label: str) -> Iterator[Record]:
    count = 0
    while True:
        yield Record(label.encode(), label, count)
        count += 1


def test_interleave_follows_the_weights_and_a_changed_weight() -> None:
    weights = {"a": 3.0, "b": 1.0}
    mixed = Interleave({"a": endless("a"), "b": endless("b")}, lambda: weights, seed=1)
    drawn = iter(mixed)
    first = [next(drawn).path for _ in range(4000)]
    share = first.count("a") / len(first)
    # binomial: 4000 draws at p = 0.75 have a standard deviation of 0.0068; 5 of them
    assert abs(share - 0.75) < 0.035, share
    weights["a"], weights["b"] = 1.0, 4.0  # boosting b mid-run: read again between batches
    later = [next(drawn).path for _ in range(4000)][100:]  # after the next re-read
    assert abs(later.count("b") / len(later) - 0.8) < 0.035
    finite = Interleave(
        {"a": iter([Record(b"1", "a", 0)]), "b": iter([Record(b"2", "b", 0)] * 3)},
        lambda: {"a": 1.0, "b": 1.0},
        seed=2,
    )
    assert sorted(r.path for r in finite) == ["a", "b", "b", "b"]  # a class ends, b goes on
