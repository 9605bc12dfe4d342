"""Every way a NEFF can be refused: the error class and a message with the key facts.

Malformed graphs are made by rewriting one member of a valid NEFF's archive and packing
it again with a correct header (size and hash), so only the intended fault remains.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import re
import struct
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from neuron_rtd.errors import NeffInvalid, Nerr, UnsupportedVersion
from neuron_rtd.neff import (
    HEADER_SIZE,
    NeffBuilder,
    NeffHeader,
    StageSpec,
    build_mlp,
    read_neff,
    read_neff_file,
)
from neuron_rtd.neff import header as header_module
from neuron_rtd.neff.archive import pack_members
from neuron_rtd.neff.header import parse_header

Json = Any
Mutation = Callable[[Json], object]

# -- helpers ----------------------------------------------------------------------------


def base_neff() -> bytes:
    """x -> neuron0 (stages: act0, logits) -> softmax (cpu) -> probs."""
    return build_mlp((4, 6, 3), neuron_nodes=1, stages_per_node=2, cpu_softmax=True).neff


def unpack(neff: bytes) -> tuple[NeffHeader, dict[str, bytes]]:
    header = parse_header(neff)
    data = neff[HEADER_SIZE:]
    if header.gzip:
        data = gzip.decompress(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {}
        for info in tar.getmembers():
            file = tar.extractfile(info)
            assert file is not None
            members[info.name] = file.read()
    return header, members


def repack(header: NeffHeader, data: bytes, **changes: Any) -> bytes:
    """`data` behind `header`, with data_size and sha256 made to fit, then `changes`."""
    fitted = dataclasses.replace(
        header, data_size=len(data), sha256=hashlib.sha256(data).digest(), **changes
    )
    return fitted.pack() + data


def with_members(neff: bytes, change: Callable[[dict[str, bytes]], object]) -> bytes:
    header, members = unpack(neff)
    change(members)
    return repack(header, pack_members(members), features=0)


def with_json(neff: bytes, path: str, mutate: Mutation) -> bytes:
    def change(members: dict[str, bytes]) -> None:
        doc = json.loads(members[path])
        mutate(doc)
        members[path] = json.dumps(doc).encode()

    return with_members(neff, change)


def set_field(neff: bytes, fmt: str, offset: int, value: Any) -> bytes:
    raw = bytearray(neff)
    struct.pack_into(fmt, raw, offset, value)
    return bytes(raw)


def refuse(data: bytes, cls: type[Exception], *fragments: str) -> str:
    with pytest.raises(cls) as info:
        read_neff(data)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.fixture(scope="module")
def neff() -> bytes:
    return base_neff()


def test_the_base_neff_and_its_repack_are_valid(neff: bytes) -> None:
    assert read_neff(with_members(neff, lambda m: None)).nc_count == 2
    assert read_neff(with_json(neff, "neff.json", lambda g: None)).nc_count == 2


# -- container --------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [0, 1, 100, 1023])
def test_truncated_inside_the_header(neff: bytes, cut: int) -> None:
    refuse(neff[:cut], NeffInvalid, f"NEFF is truncated: {cut} bytes, a header alone is 1024")


@pytest.mark.parametrize("data", [b"not a model", b"NEFX", b"{}\n"])
def test_a_short_file_that_is_no_neff_is_not_called_truncated(data: bytes) -> None:
    refuse(data, NeffInvalid, "not a NEFF: the data does not begin with the NEFF magic")


@pytest.mark.parametrize("keep", [0, 1, 600, 2048, -1])
def test_truncated_inside_the_data(neff: bytes, keep: int) -> None:
    declared = len(neff) - HEADER_SIZE
    present = declared - 1 if keep == -1 else keep
    refuse(
        neff[: HEADER_SIZE + present],
        NeffInvalid,
        f"NEFF is truncated: header declares {declared} data bytes, {present} present",
    )


def test_trailing_bytes(neff: bytes) -> None:
    refuse(neff + b"\0" * 3, NeffInvalid, "3 trailing bytes", f"{len(neff) - HEADER_SIZE}")


@pytest.mark.parametrize("where", [HEADER_SIZE, HEADER_SIZE + 700, -1])
def test_flipped_data_byte_is_a_hash_mismatch(neff: bytes, where: int) -> None:
    raw = bytearray(neff)
    raw[where] ^= 0x01
    good = hashlib.sha256(neff[HEADER_SIZE:]).hexdigest()
    bad = hashlib.sha256(raw[HEADER_SIZE:]).hexdigest()
    refuse(
        bytes(raw),
        NeffInvalid,
        f"NEFF data hash mismatch: header says {good}, data hashes to {bad}",
    )


def test_bad_magic(neff: bytes) -> None:
    message = refuse(b"PK\x03\x04XXXX" + neff[8:], NeffInvalid, "magic", "NEFF\\x00RTD")
    assert "PK" not in message  # the data itself is never echoed (it may be any file)


def test_wrong_header_size(neff: bytes) -> None:
    refuse(set_field(neff, "<Q", 16, 512), NeffInvalid, "header size is 512, expected 1024")


def test_unknown_package_version(neff: bytes) -> None:
    refuse(set_field(neff, "<Q", 8, 7), UnsupportedVersion, "package version 7")


def test_unknown_feature_bits(neff: bytes) -> None:
    refuse(set_field(neff, "<Q", 420, 0b110), NeffInvalid, "unknown feature bits 0x6")


@pytest.mark.parametrize("version", [(3, 0), (1, 0), (2, 1)])
def test_unsupported_versions(version: tuple[int, int]) -> None:
    data = _built_with(version)
    text = f"{version[0]}.{version[1]}"
    message = refuse(data, UnsupportedVersion, f"NEFF version {text} is not supported")
    assert message == (
        f"NEFF version {text} is not supported: this runtime runs versions 2.0 to 2.0"
    )
    assert UnsupportedVersion("x").code == Nerr.UNSUPPORTED_VERSION


def _built_with(version: tuple[int, int]) -> bytes:
    header, members = unpack(build_mlp((4, 3)).neff)
    return repack(header, pack_members(members), major=version[0], minor=version[1])


def test_builder_version_override_makes_unsupported_neffs() -> None:
    builder = NeffBuilder("v")
    builder.add_input("x", "float32", (1,))
    builder.add_output("y", "float32", (1,))
    builder.add_node("n", "cpu", ["x"], ["y"], [StageSpec([("Relu", ["x"], ["y"])])])
    refuse(builder.build(version=(3, 0)), UnsupportedVersion, "NEFF version 3.0")
    refuse(builder.build(version=(1, 0)), UnsupportedVersion, "NEFF version 1.0")


def test_version_range_is_compared_generally(neff: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(header_module, "SUPPORTED_VERSIONS", ((1, 5), (2, 3)))
    header, members = unpack(neff)
    data = pack_members(members)
    for ok in [(1, 5), (1, 99), (2, 0), (2, 3)]:
        assert read_neff(repack(header, data, major=ok[0], minor=ok[1])).header.version == ok
    for bad in [(1, 4), (2, 4), (0, 9), (3, 0)]:
        refuse(
            repack(header, data, major=bad[0], minor=bad[1]),
            UnsupportedVersion,
            f"NEFF version {bad[0]}.{bad[1]} is not supported",
            "versions 1.5 to 2.3",
        )


def test_empty_and_short_files(tmp_path: Path) -> None:
    for size in (0, 10, 1023):
        path = tmp_path / f"short{size}.neff"
        path.write_bytes(b"N" * size)
        with pytest.raises(NeffInvalid, match="is not a NEFF: it is shorter than a NEFF header"):
            read_neff_file(path)


def test_truncated_file(tmp_path: Path, neff: bytes) -> None:
    path = tmp_path / "cut.neff"
    path.write_bytes(neff[:-10])
    with pytest.raises(NeffInvalid, match="NEFF is truncated: header declares"):
        read_neff_file(path)


def test_corrupt_tar(neff: bytes) -> None:
    header = parse_header(neff)
    refuse(repack(header, b"\x07" * 4096, features=0), NeffInvalid, "not a valid tar archive")


def test_corrupt_gzip(neff: bytes) -> None:
    header = parse_header(neff)
    data = gzip.compress(b"hello")[:-6] + b"junkjunk"
    refuse(repack(header, data, features=1), NeffInvalid, "flagged gzip", "does not decompress")


def test_gzip_flag_on_plain_tar(neff: bytes) -> None:
    header = parse_header(neff)
    refuse(repack(header, neff[HEADER_SIZE:], features=1), NeffInvalid, "flagged gzip")


def tar_with(members: dict[str, bytes], extra: tarfile.TarInfo) -> bytes:
    """A tar of `members` (regular files) plus one more member `extra`."""
    return pack_members(members, extra=[extra])


def member(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "") -> Any:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, link
    return info


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (member("nodes/w.bin", tarfile.SYMTYPE, link="/etc/passwd"), ["symbolic link"]),
        (member("nodes/h.bin", tarfile.LNKTYPE, link="neff.json"), ["hard link"]),
        (member("dev", tarfile.CHRTYPE), ["character device"]),
        (member("disk", tarfile.BLKTYPE), ["block device"]),
        (member("pipe", tarfile.FIFOTYPE), ["FIFO"]),
        (member("../escape.bin", size=4), ["'../escape.bin'", "not a plain relative name"]),
        (member("nodes/../../x", size=4), ["not a plain relative name"]),
        (member("/etc/cron.d/x", size=4), ["'/etc/cron.d/x'", "not a plain relative name"]),
    ],
)
def test_archive_members_other_than_plain_files_are_refused(
    neff: bytes, extra: Any, fragments: list[str]
) -> None:
    header, members = unpack(neff)
    data = tar_with(members, extra)
    refuse(repack(header, data, features=0), NeffInvalid, "NEFF archive member", *fragments)
    # gzip-compressed, the same
    compressed = gzip.compress(data)
    refuse(repack(header, compressed, features=1), NeffInvalid, *fragments)


def test_folders_in_the_archive_are_skipped(neff: bytes) -> None:
    header, members = unpack(neff)
    data = tar_with(members, member("nodes", tarfile.DIRTYPE))
    assert read_neff(repack(header, data, features=0)).nc_count == 2


def test_an_archive_of_too_many_members_is_refused(neff: bytes) -> None:
    from neuron_rtd.neff import archive

    header, members = unpack(neff)
    many = {**members, **{f"pad/{i}": b"" for i in range(200)}}
    limit = len(members) + 100
    original, archive.MAX_MEMBERS = archive.MAX_MEMBERS, limit
    try:
        refuse(repack(header, pack_members(many), features=0), NeffInvalid, f"more than {limit}")
    finally:
        archive.MAX_MEMBERS = original


def test_a_decompression_bomb_is_refused_at_the_limit(neff: bytes) -> None:
    header, members = unpack(neff)
    members["pad.bin"] = bytes(256 << 20)  # 256 MiB of zeros: a 250 KiB gzip stream
    bomb = gzip.compress(pack_members(members), compresslevel=1)
    assert len(bomb) < 2 << 20
    data = repack(header, bomb, features=1)
    with pytest.raises(NeffInvalid, match=f"decompresses to more than {64 << 20} bytes"):
        read_neff(data, max_unpacked=64 << 20)
    assert read_neff(data, max_unpacked=512 << 20).nc_count == 2  # under the limit: read


def test_gzip_with_trailing_bytes_is_refused(neff: bytes) -> None:
    header, members = unpack(neff)
    data = gzip.compress(pack_members(members)) + b"more"
    refuse(repack(header, data, features=1), NeffInvalid, "bytes after its gzip stream")


def test_a_file_that_is_no_neff_is_never_echoed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:the secret\n" * 100)
    with pytest.raises(NeffInvalid) as info:
        read_neff_file(secret)
    message = str(info.value)
    assert "root" not in message and "the secret" not in message
    assert str(secret.stat().st_size) not in message  # nor its size


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe.neff"
    os.mkfifo(fifo)  # opening it to read would block until a writer came
    for path in (fifo, tmp_path, Path("/dev/zero"), Path("/dev/null")):
        with pytest.raises(NeffInvalid, match="is not a regular file"):
            read_neff_file(path)


def test_a_file_read_into_memory_is_no_mapping(tmp_path: Path, neff: bytes) -> None:
    path = tmp_path / "m.neff"
    path.write_bytes(neff)
    sizes: list[int] = []

    def buffer(size: int) -> memoryview:
        sizes.append(size)
        return memoryview(bytearray(size))

    parsed = read_neff_file(path, into=buffer)
    assert sizes == [len(neff)]
    assert parsed.buffer is not None and isinstance(parsed.buffer.obj, bytearray)
    path.write_bytes(b"")  # shrinking the file afterwards cannot reach the Neff
    assert parsed.nc_count == 2


def test_missing_graph(neff: bytes) -> None:
    data = with_members(neff, lambda m: m.pop("neff.json"))
    refuse(data, NeffInvalid, "NEFF archive has no 'neff.json'")


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("nodes/neuron0/stage1.json", "the program of node 'neuron0' stage 1"),
        ("nodes/neuron0/stage0.bin", "the weights of node 'neuron0' stage 0"),
        ("nodes/softmax/stage0.json", "the program of node 'softmax' stage 0"),
    ],
)
def test_missing_stage_files(neff: bytes, path: str, what: str) -> None:
    data = with_members(neff, lambda m: m.pop(path))
    refuse(data, NeffInvalid, f"NEFF archive has no {path!r} ({what})")


def test_header_counts_must_match_the_graph(neff: bytes) -> None:
    header, members = unpack(neff)
    data = pack_members(members)
    refuse(
        repack(header, data, nc_count=5),
        NeffInvalid,
        "nc_count is 5 but the graph's Neuron nodes need 2 NCs",
    )
    refuse(
        repack(header, data, ncs_per_node=1),
        NeffInvalid,
        "ncs_per_node is 1 but the largest Neuron node has 2 NCs",
    )
    refuse(repack(header, data, name="other"), NeffInvalid, "'other'", "'mlp'")


# -- neff.json --------------------------------------------------------------------------


def _node(name: str) -> Callable[[Json], Json]:
    return lambda g: next(n for n in g["nodes"] if n["name"] == name)


neuron0, softmax = _node("neuron0"), _node("softmax")


def _set(get: Callable[[Json], Json], key: str, value: Any) -> Mutation:
    return lambda g: get(g).__setitem__(key, value)


GRAPH_FAULTS: list[tuple[str, Mutation, str]] = [
    ("empty object", lambda g: g.clear(), "neff.json: missing key 'name'"),
    ("missing nodes", lambda g: g.pop("nodes"), "neff.json: missing key 'nodes'"),
    ("name type", _set(lambda g: g, "name", 5), "neff.json name: expected a string, got int"),
    ("inputs type", _set(lambda g: g, "inputs", {}), "model inputs: expected an array, got object"),
    ("tensors type", _set(lambda g: g, "tensors", []), "tensors: expected an object, got array"),
    (
        "input missing dtype",
        lambda g: g["inputs"][0].pop("dtype"),
        "model input 'x': missing key 'dtype'",
    ),
    ("unknown kind", _set(neuron0, "kind", "gpu"), "node 'neuron0': unknown kind 'gpu'"),
    (
        "unknown dtype",
        lambda g: g["tensors"]["act0"].__setitem__("dtype", "float8"),
        "tensor 'act0': unknown dtype 'float8'",
    ),
    (
        "negative dim",
        lambda g: g["inputs"][0].__setitem__("shape", [1, -4]),
        "model input 'x' shape: dimension 1 is negative (-4)",
    ),
    (
        "float dim",
        lambda g: g["tensors"]["act0"].__setitem__("shape", [1, 6.0]),
        "tensor 'act0' shape[1]: expected an integer, got float",
    ),
    (
        "bool dim",
        lambda g: g["tensors"]["act0"].__setitem__("shape", [True, 6]),
        "tensor 'act0' shape[0]: expected an integer, got boolean",
    ),
    (
        "duplicate node",
        _set(softmax, "name", "neuron0"),
        "neff.json nodes: duplicate name 'neuron0'",
    ),
    (
        "duplicate input",
        lambda g: g["inputs"].append(dict(g["inputs"][0])),
        "model inputs: duplicate name 'x'",
    ),
    (
        "duplicate node input",
        _set(softmax, "inputs", ["logits", "logits"]),
        "node 'softmax' inputs: duplicate name 'logits'",
    ),
    ("empty name", _set(neuron0, "name", ""), "node 0 name: a name must not be empty"),
    (
        "not topological",
        lambda g: g["nodes"].reverse(),
        "node 'softmax': input 'logits' is neither a model input nor an output of an earlier node",
    ),
    (
        "unknown node input",
        _set(softmax, "inputs", ["ghost"]),
        "node 'softmax': input 'ghost' is neither a model input",
    ),
    (
        "output nobody produces",
        lambda g: (
            g["outputs"].append({"name": "extra", "dtype": "float32", "shape": [1]}),
            g["tensors"].__setitem__("extra", {"dtype": "float32", "shape": [1]}),
        ),
        "model output 'extra' is produced by no node",
    ),
    (
        "output is an input",
        lambda g: g["outputs"].append(dict(g["inputs"][0])),
        "model output 'x' is produced by no node",
    ),
    (
        "output defined twice",
        _set(softmax, "outputs", ["logits"]),
        "node 'softmax': output 'logits' is already an output of node 'neuron0'",
    ),
    (
        "node output not declared",
        lambda g: g["tensors"].pop("logits"),
        "node 'neuron0' output 'logits' is not declared in \"tensors\"",
    ),
    (
        "stage boundary not declared",
        lambda g: g["tensors"].pop("act0"),
        "node 'neuron0' stage 0 output 'act0' is not declared in \"tensors\"",
    ),
    (
        "model input not declared",
        lambda g: g["tensors"].pop("x"),
        "model input 'x' is not declared in \"tensors\"",
    ),
    (
        "model output disagrees with tensors",
        lambda g: g["tensors"]["probs"].__setitem__("shape", [1, 4]),
        "model output 'probs' is float32 (1, 3) but \"tensors\" declares it float32 (1, 4)",
    ),
    (
        "cpu node with 2 stages",
        lambda g: softmax(g)["stages"].append(dict(softmax(g)["stages"][0])),
        "node 'softmax': a cpu node has exactly 1 stage, this one has 2",
    ),
    (
        "neuron node with 0 stages",
        _set(neuron0, "stages", []),
        "node 'neuron0': a neuron node needs at least 1 stage, it has 0",
    ),
    (
        "stage input not available",
        lambda g: neuron0(g)["stages"].reverse(),
        "node 'neuron0' stage 0: input 'act0' is not available",
    ),
    (
        "node output produced by no stage",
        lambda g: neuron0(g)["stages"].pop(),
        "node 'neuron0': output 'logits' is produced by none of its stages",
    ),
    (
        "stage path type",
        lambda g: neuron0(g)["stages"][0].__setitem__("program", None),
        "node 'neuron0' stage 0 program: expected a string, got null",
    ),
    ("no outputs", _set(softmax, "outputs", []), "node 'softmax': has no outputs"),
]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [(m, e) for _, m, e in GRAPH_FAULTS],
    ids=[name for name, _, _ in GRAPH_FAULTS],
)
def test_malformed_graph(neff: bytes, mutate: Mutation, expected: str) -> None:
    refuse(with_json(neff, "neff.json", mutate), NeffInvalid, expected)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"{not json", "neff.json is not valid JSON"),
        (b"\xff\xfe", "neff.json is not valid JSON"),
        (b"[1, 2]", "neff.json: expected an object, got array"),
        (b'{"name": "a", "name": "b"}', "neff.json is not valid: key 'name' appears twice"),
    ],
)
def test_graph_that_is_not_json(neff: bytes, raw: bytes, expected: str) -> None:
    refuse(with_members(neff, lambda m: m.__setitem__("neff.json", raw)), NeffInvalid, expected)


# -- stage programs ---------------------------------------------------------------------

STAGE0 = "nodes/neuron0/stage0.json"
STAGE1 = "nodes/neuron0/stage1.json"


def _weight(key: str, value: Any) -> Mutation:
    return lambda p: p["weights"]["w0"].__setitem__(key, value)


PROGRAM_FAULTS: list[tuple[str, str, Mutation, str]] = [
    (
        "outside blob",
        STAGE0,
        _weight("offset", 64 * 1000),
        "node 'neuron0' stage 0 weight 'w0': bytes 64000 to 64096 lie outside the weights blob",
    ),
    (
        "nbytes",
        STAGE0,
        _weight("nbytes", 100),
        "node 'neuron0' stage 0 weight 'w0': nbytes is 100 but float32 (4, 6) takes 96",
    ),
    (
        "unaligned",
        STAGE0,
        _weight("offset", 8),
        "node 'neuron0' stage 0 weight 'w0': offset 8 is not a multiple of 64",
    ),
    ("negative offset", STAGE0, _weight("offset", -64), "weight 'w0': offset -64 is not"),
    ("weight dtype", STAGE0, _weight("dtype", "complex64"), "weight 'w0': unknown dtype"),
    (
        "undefined input",
        STAGE0,
        lambda p: p["instructions"][0]["inputs"].__setitem__(0, "nope"),
        "node 'neuron0' stage 0 instruction 0 (MatMul): input 'nope' is not defined before use",
    ),
    (
        "used before defined",
        STAGE0,
        lambda p: p["instructions"].reverse(),
        "node 'neuron0' stage 0 instruction 0 (Relu): input 'pre0' is not defined before use",
    ),
    (
        "redefined",
        STAGE0,
        lambda p: p["instructions"][1].__setitem__("outputs", ["mm0"]),
        "instruction 1 (Add): output 'mm0' is already defined",
    ),
    (
        "output not produced",
        STAGE1,
        lambda p: p["outputs"].append("act9"),
        "node 'neuron0' stage 1: output 'act9' is produced by no instruction",
    ),
    (
        "weight named like an input",
        STAGE1,
        lambda p: p["weights"].__setitem__("act0", p["weights"]["w1"]),
        "node 'neuron0' stage 1: weight 'act0' has the name of a stage input",
    ),
    (
        "missing attrs",
        STAGE1,
        lambda p: p["instructions"][0].pop("attrs"),
        "node 'neuron0' stage 1 instruction 0 (MatMul): missing key 'attrs'",
    ),
    (
        "op type",
        STAGE1,
        lambda p: p["instructions"][0].__setitem__("op", 3),
        "node 'neuron0' stage 1 instruction 0 op: expected a string, got int",
    ),
    (
        "stage input from a later node",
        STAGE1,
        lambda p: p["inputs"].append("probs"),
        "node 'neuron0' stage 1: input 'probs' is not available",
    ),
    (
        "stage output not declared",
        STAGE1,
        lambda p: (
            p["outputs"].append("act0b"),
            p["instructions"].append(
                {"op": "Relu", "inputs": ["act0"], "outputs": ["act0b"], "attrs": {}}
            ),
        ),
        "node 'neuron0' stage 1 output 'act0b' is not declared",
    ),
]


@pytest.mark.parametrize(
    ("path", "mutate", "expected"),
    [(p, m, e) for _, p, m, e in PROGRAM_FAULTS],
    ids=[name for name, _, _, _ in PROGRAM_FAULTS],
)
def test_malformed_stage_program(neff: bytes, path: str, mutate: Mutation, expected: str) -> None:
    refuse(with_json(neff, path, mutate), NeffInvalid, expected)


def test_stage_program_not_json(neff: bytes) -> None:
    data = with_members(neff, lambda m: m.__setitem__(STAGE1, b"]["))
    refuse(data, NeffInvalid, f"node 'neuron0' stage 1 program {STAGE1!r} is not valid JSON")


def test_stage_output_defined_twice_across_nodes(neff: bytes) -> None:
    def rename(members: dict[str, bytes]) -> None:
        program = json.loads(members["nodes/softmax/stage0.json"])
        program["outputs"] = ["probs", "act0"]
        program["instructions"].append(
            {"op": "Relu", "inputs": ["logits"], "outputs": ["act0"], "attrs": {}}
        )
        members["nodes/softmax/stage0.json"] = json.dumps(program).encode()

    refuse(
        with_members(neff, rename),
        NeffInvalid,
        "node 'softmax' stage 0: output 'act0' is already defined elsewhere",
    )


def test_every_refusal_is_invalid_with_its_code(neff: bytes) -> None:
    with pytest.raises(NeffInvalid) as info:
        read_neff(neff[:10])
    assert info.value.code == Nerr.INVALID
    assert re.search(r"\b10 bytes\b", str(info.value))


def test_a_free_model_input_read_by_an_nc_is_refused(neff: bytes) -> None:
    """A model input with free axes (`dynamic`: a size chosen per inference) belongs to
    onnxruntime's CPU nodes; here the Neuron node reads it."""

    def free(graph: Json) -> None:
        graph["inputs"][0]["dynamic"] = [1]
        graph["tensors"]["x"]["dynamic"] = [1]

    refuse(
        with_json(neff, "neff.json", free),
        NeffInvalid,
        "node 'neuron0' stage 0: model input 'x' has free axes [1]",
        "runs on an NC, whose tensors are of fixed sizes",
    )
