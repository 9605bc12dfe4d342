"""String tensors in process: Triton's encoding (`neuron_rtd/neff/strings.py`), the NEFF's
rule that only onnxruntime's CPU nodes touch one, and models with ONNX's string ops
compiled (every op on a string on the host, the numbers between on the NC) and run on
the simulated machine, compared with onnxruntime on the same inputs; by arrays, by
encoded bytes, and with padded buckets. Shared memory: `test_string_dataplane.py`."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from neuron_rtd import onnxrt
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.errors import BadInput, NeffInvalid
from neuron_rtd.neff import NeffBuilder, read_neff
from neuron_rtd.neff.builder import StageSpec
from neuron_rtd.neff.strings import as_bytes, as_text, decode, encode
from neuron_rtd.runtime import LocalRuntime

STRING = TensorProto.STRING


@pytest.fixture(scope="module")
def local() -> Iterator[LocalRuntime]:
    with LocalRuntime() as runtime:
        yield runtime


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    opset: int = 20,
) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "strings", list(inputs), list(outputs))
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    made.ir_version = 9  # what the installed onnxruntime reads
    return made


def reference(made: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime's outputs, strings as bytes (what callers give and get)."""
    session = onnxrt.session(made.SerializeToString())
    text = {name: as_text(value, name) for name, value in feeds.items()}
    names = [o.name for o in made.graph.output]
    results = session.run(names, text)
    return {
        name: as_bytes(value) if value.dtype.hasobject else value
        for name, value in zip(names, results, strict=True)
    }


def texts(*values: str) -> np.ndarray:
    return np.array([v.encode() for v in values], dtype=object)


# --- the encoding ------------------------------------------------------------------------
def test_encoding_is_tritons() -> None:
    array = np.array([[b"12", b""], ["h\u00e9", b"\xff\x00"]], dtype=object)
    data = encode(array)
    assert data == (
        struct.pack("<I", 2) + b"12" + struct.pack("<I", 0)
        + struct.pack("<I", 3) + "h\u00e9".encode() + struct.pack("<I", 2) + b"\xff\x00"
    )  # fmt: skip
    back = decode(memoryview(data), "t", count=4)
    assert back.tolist() == [b"12", b"", "h\u00e9".encode(), b"\xff\x00"]
    assert decode(data, "t", most=4).tolist() == back.tolist()
    assert encode(np.empty((0, 3), dtype=object)) == b""


@pytest.mark.parametrize(
    ("data", "count", "words"),
    [
        (struct.pack("<I", 1) + b"a\x01\x00\x00", 2, "element 1's 4-byte length is cut short"),
        (struct.pack("<I", 9) + b"abc", 1, "element 0 declares 9 bytes at byte 0, and only 3"),
        (struct.pack("<I", 1) + b"a", 2, "its shape takes 2 string elements, and its 5 bytes"),
        (struct.pack("<I", 0) * 3, 2, "4 bytes past its string element 1, the last"),
        (struct.pack("<I", 0) * 2 + b"\x00\x00\x00\x00\x07", 2, "5 bytes past"),
    ],
)
def test_every_malformed_encoding_says_where(data: bytes, count: int, words: str) -> None:
    with pytest.raises(BadInput, match=r"^input 'q': ") as caught:
        decode(data, "input 'q'", count=count)
    assert words in caught.value.message


def test_text_must_be_utf8() -> None:
    assert as_text(np.array([b"caf\xc3\xa9", "x"], dtype=object), "t").tolist() == ["café", "x"]
    with pytest.raises(BadInput, match="string element 1 is not UTF-8"):
        as_text(np.array([b"ok", b"\xc3"], dtype=object), "t")
    with pytest.raises(BadInput, match="element 0 is int, not a string"):
        as_text(np.array([3], dtype=object), "t")
    with pytest.raises(BadInput, match="takes strings"):
        as_text(np.zeros(2, np.float32), "t")


# --- the NEFF's rule ------------------------------------------------------------------------
def test_a_string_on_an_nc_or_in_a_weight_does_not_read() -> None:
    on_nc = NeffBuilder("bad")
    on_nc.add_input("s", "string", (2,))
    on_nc.add_output("t", "string", (2,))
    on_nc.add_node("n", "neuron", ["s"], ["t"], [StageSpec([("Identity", ["s"], ["t"])])])
    with pytest.raises(NeffInvalid, match="'s' is a string tensor, and the node runs on an NC"):
        read_neff(on_nc.build())
    weighted = NeffBuilder("bad")
    weighted.add_input("x", "float32", (2,))
    weighted.add_output("y", "float32", (2,))
    weights = {"w": np.array(["a", "b"], dtype=object)}
    stage = StageSpec([("Add", ["x", "w"], ["y"])], weights)
    weighted.add_node("n", "neuron", ["x"], ["y"], [stage])
    with pytest.raises(NeffInvalid, match="weight 'w': a weight holds numbers only"):
        read_neff(weighted.build())


# --- models -----------------------------------------------------------------------------
def cast_add_model() -> onnx.ModelProto:
    """Triton's simple_string: strings to int32, added on the NC, back to strings."""
    io = [helper.make_tensor_value_info(n, STRING, ["N", 4]) for n in ("a", "b", "sum")]
    nodes = [
        helper.make_node("Cast", ["a"], ["ia"], to=TensorProto.INT32),
        helper.make_node("Cast", ["b"], ["ib"], to=TensorProto.INT32),
        helper.make_node("Add", ["ia", "ib"], ["total"]),
        helper.make_node("Cast", ["total"], ["sum"], to=STRING),
    ]
    return model(nodes, io[:2], io[2:], opset=13)


def test_string_ops_run_on_the_host_and_numbers_on_the_nc(local: LocalRuntime) -> None:
    made = cast_add_model()
    result = compile_model(made, dynamic_batch=bucket_ranges(1, 4))
    neff = read_neff(result.neff)
    assert {n.kind for n in neff.all_nodes} == {"cpu", "neuron"}
    assert "is a string tensor: the NC holds numbers only" in str(result.summary)
    assert [t.describe() for t in neff.inputs] == ["string (batch<=4, 4)"] * 2
    loaded = local.load(neff)
    for rows in (1, 3):  # 3 rows run in the bucket of 4: the last row repeated, cut off
        a = np.array([[str(r * 10 + i).encode() for i in range(4)] for r in range(rows)], object)
        b = np.full((rows, 4), b"-2", dtype=object)
        got = local.infer(loaded, {"a": a, "b": b})
        np.testing.assert_array_equal(got["sum"], reference(made, {"a": a, "b": b})["sum"])
        assert got["sum"].dtype == object and isinstance(got["sum"][0, 0], bytes)
    # the bytes form, as the nmgr wire and shared memory carry it
    answer = local.runtime.infer(loaded.id, {"a": encode(a[:2]), "b": encode(b[:2])})
    np.testing.assert_array_equal(answer.outputs["sum"], got["sum"][:2])
    not_rows = r"input 'a' .* 3 string elements is not a whole number .* rows of 4"
    with pytest.raises(BadInput, match=not_rows):
        local.runtime.infer(loaded.id, {"a": encode(a.reshape(-1)[:3]), "b": encode(b[:1])})


def test_normalizer_regex_and_concat_as_onnxruntime(local: LocalRuntime) -> None:
    words = helper.make_tensor_value_info("words", STRING, [5])
    outputs = [
        helper.make_tensor_value_info("normal", STRING, ["K"]),  # stopwords leave fewer
        helper.make_tensor_value_info("match", TensorProto.BOOL, [5]),
        helper.make_tensor_value_info("joined", STRING, [5]),
        helper.make_tensor_value_info("count", TensorProto.INT64, []),
    ]
    nodes = [
        helper.make_node(
            "StringNormalizer",
            ["words"],
            ["normal"],
            case_change_action="UPPER",
            stopwords=["the"],
            locale="C",  # (the default, en_US.UTF-8, need not be installed)
        ),
        helper.make_node("RegexFullMatch", ["words"], ["match"], pattern=r"[a-z]+\d?"),
        helper.make_node("StringConcat", ["words", "words"], ["joined"]),
        helper.make_node("Size", ["normal"], ["count"]),
    ]
    made = model(nodes, [words], outputs)
    neff = read_neff(compile_model(made).neff)
    loaded = local.load(neff)
    given = texts("the", "cat9", "Dog", "caf\u00e9", "")
    got = local.infer(loaded, {"words": given})
    want = reference(made, {"words": given})
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert got["normal"].tolist() == [b"CAT9", b"DOG", "CAF\u00e9".encode(), b""]  # C locale
