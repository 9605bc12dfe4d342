"""Write the fuzz harnesses' seed corpora (valid inputs, kept in the repository):

    python fuzz/make_corpus.py

fuzz/corpus/neff_reader/: small valid NEFFs (one node, two nodes with a CPU node, gzip,
two stages), each with the leading byte that asks the harness to fit the header.
fuzz/corpus/wire_requests/: call sequences a client makes (load and infer, an NCG with posted
inferences, the streamed infer, counters and the version).
fuzz/corpus/example_records/: tf.train.Example records with the features the harness
decodes (x, y) and one it does not (label), as protobuf writes them and in two parts, and
one whose y is a float list; fuzz/regressions/example_records/: a record whose label (a
feature not decoded) is malformed, which reading in place once took.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

from records import call, join  # fuzz/records.py (a script's folder is on its path)

from neuron_rtd.neff import HEADER_SIZE
from neuron_rtd.neff.archive import pack_members
from neuron_rtd.neff.header import parse_header
from neuron_rtd.neff.samples import build_mlp, build_relu
from neuron_rtd.proto import pb, tf_pb

HERE = Path(__file__).parent
METHOD = {m.name: i for i, m in enumerate(pb.DESCRIPTOR.services_by_name["nmgr_v1"].methods)}
INFER_STREAM = len(METHOD)


def neffs() -> dict[str, bytes]:
    return {
        "relu": build_relu((1, 8)),
        "mlp_cpu_softmax": build_mlp((4, 6, 3), neuron_nodes=1, cpu_softmax=True).neff,
        "mlp_gzip": build_mlp((4, 6, 3), gzip=True).neff,
        "mlp_two_stages": build_mlp((4, 5, 5, 3), neuron_nodes=1, stages_per_node=2).neff,
    }


def unary(name: str, message: object) -> bytes:
    return call(METHOD[name], message.SerializeToString())  # type: ignore[attr-defined]


def load(neff: bytes, *head: object) -> bytes:
    parts = [m.SerializeToString() for m in head]  # type: ignore[attr-defined]
    parts += [
        pb.load_request(neff_size=len(neff)).SerializeToString(),
        pb.load_request(neff_chunk=pb.file_chunk(chunk=neff)).SerializeToString(),
    ]
    return call(METHOD["load"], join(parts))


def sequences() -> dict[str, bytes]:
    relu = build_relu((1, 8))
    x = bytes(range(32))
    infer = pb.infer_request(h_nn=pb.h_nn(id=1), ifmap=[pb.infer_io(name="x", buf=x)])
    ncg = pb.h_eg(id=1)
    return {
        "load_infer_unload": load(relu)
        + unary("infer", infer)
        + unary("stop", pb.stop_request(h_nn=pb.h_nn(id=1)))
        + unary("start", pb.start_request(h_nn=pb.h_nn(id=1)))
        + unary("unload", pb.unload_request(h_nn=pb.h_nn(id=1))),
        "ncg_post_wait": unary("create_eg", pb.create_eg_request(nc_count=2))
        + load(relu, pb.load_request(h_eg=ncg), pb.load_request(model_params=pb.model_params()))
        + unary("start", pb.start_request(h_nn=pb.h_nn(id=1)))
        + unary("infer_post", infer)
        + unary("infer_check_completion", pb.infer_check_completion_request())
        + unary("infer_wait", pb.infer_wait_request(cookie=1))
        + unary("list_egs", pb.empty())
        + unary("destroy_eg", pb.destroy_eg_request(h_eg=ncg)),
        "stream": load(relu) + call(INFER_STREAM, join([infer.SerializeToString()] * 2)),
        "counters": load(relu)
        + unary("read_all_counters", pb.read_all_counters_request())
        + unary("read_all_metrics", pb.read_all_metrics_request())
        + unary("read_nc_counters", pb.read_nc_counters_request())
        + unary("get_all_hw_counters", pb.empty())
        + unary("get_version", pb.get_version_request()),
    }


def examples() -> dict[str, bytes]:
    example = tf_pb.Example()
    features = example.features.feature
    features["x"].bytes_list.value.append(bytes(range(24)))
    features["y"].bytes_list.value.append(b"abcde")
    plain = example.SerializeToString()
    features["label"].int64_list.value.extend([7, 300])
    labelled = example.SerializeToString()
    parts = [tf_pb.Example(), tf_pb.Example()]
    parts[0].features.feature["x"].bytes_list.value.append(bytes(24))
    parts[1].features.feature["y"].bytes_list.value.append(b"vwxyz")
    floats = tf_pb.Example()
    floats.CopyFrom(example)
    floats.features.feature["y"].float_list.value.extend([1.0, 2.0])
    return {
        "x_y": plain,
        "x_y_label": labelled,
        "two_parts": b"".join(p.SerializeToString() for p in parts),  # merged by protobuf
        "y_floats": floats.SerializeToString(),
    }


def example_regressions() -> dict[str, bytes]:
    example = tf_pb.Example()
    example.features.feature["x"].bytes_list.value.append(bytes(24))
    example.features.feature["y"].bytes_list.value.append(b"abcde")
    # an entry "label" whose Int64List holds a varint cut short (its last byte continues)
    label = b"\x0a\x05label" + b"\x12\x05" + b"\x1a\x03" + b"\x0a\x01\x80"
    entries = example.features.SerializeToString() + b"\x0a" + bytes([len(label)]) + label
    return {"malformed_label": b"\x0a" + bytes([len(entries)]) + entries}


def regressions() -> dict[str, bytes]:
    """NEFFs of the kinds refused since the harness began (regressions/neff_reader): a
    decompression bomb, and archive members that are a link and a climbing name."""
    relu = build_relu((1, 8))
    header = parse_header(relu)
    with tarfile.open(fileobj=io.BytesIO(relu[HEADER_SIZE:])) as tar:
        files = [(info, tar.extractfile(info)) for info in tar.getmembers()]
        members = {info.name: f.read() for info, f in files if f is not None}

    def neff(data: bytes, *, gzipped: bool = False) -> bytes:
        fitted = dataclasses.replace(
            header,
            data_size=len(data),
            sha256=hashlib.sha256(data).digest(),
            features=int(gzipped),
        )
        return fitted.pack() + data

    def with_member(extra: tarfile.TarInfo) -> bytes:
        return neff(pack_members(members, extra=[extra]))

    link = tarfile.TarInfo("nodes/link.bin")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    climb = tarfile.TarInfo("../climb.bin")
    climb.size = 4
    padded = pack_members({**members, "pad.bin": bytes(80 << 20)})
    return {
        "gzip_bomb_80MiB": neff(gzip.compress(padded, compresslevel=9), gzipped=True),
        "symlink_member": with_member(link),
        "climbing_member": with_member(climb),
    }


def write(folder: Path, items: dict[str, bytes], prefix: Callable[[bytes], bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in items.items():
        (folder / name).write_bytes(prefix(data))


if __name__ == "__main__":
    write(HERE / "corpus" / "neff_reader", neffs(), lambda d: b"\x01" + d)
    write(HERE / "corpus" / "wire_requests", sequences(), lambda d: d)
    write(HERE / "corpus" / "example_records", examples(), lambda d: d)
    write(HERE / "regressions" / "example_records", example_regressions(), lambda d: d)
    write(HERE / "regressions" / "neff_reader", regressions(), lambda d: b"\x00" + d)
    print(f"wrote {HERE / 'corpus'} and {HERE / 'regressions' / 'neff_reader'}")
