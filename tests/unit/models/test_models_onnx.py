"""The ONNX test models (neuron_rtd.models): valid exports that onnxruntime runs as meant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from neuron_rtd import onnxrt
from neuron_rtd.models import (
    MODELS,
    bert,
    count_parameters,
    metadata,
    op_types,
    random_inputs,
    resnet,
    ssd,
)
from neuron_rtd.models.__main__ import main as models_main


def session(model: onnx.ModelProto | bytes) -> Any:
    return onnxrt.session(model, threads=2)


def dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def count_ops(model: onnx.ModelProto, op_type: str) -> int:
    return sum(node.op_type == op_type for node in model.graph.node)


@pytest.fixture(scope="module")
def small_resnet() -> onnx.ModelProto:
    return resnet.build(**resnet.SMALL)


@pytest.fixture(scope="module")
def small_bert() -> onnx.ModelProto:
    return bert.build(**bert.SMALL)


@pytest.fixture(scope="module")
def small_ssd() -> onnx.ModelProto:
    return ssd.build(**ssd.SMALL)


@pytest.fixture(scope="module")
def models(
    small_resnet: onnx.ModelProto, small_bert: onnx.ModelProto, small_ssd: onnx.ModelProto
) -> dict[str, onnx.ModelProto]:
    return {"resnet": small_resnet, "bert": small_bert, "ssd": small_ssd}


# -- every family ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
def test_checker_and_header(models: dict[str, onnx.ModelProto], name: str) -> None:
    model = models[name]
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version in (8, 9)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert metadata(model)["family"] == name
    assert name.lower() in model.doc_string.lower() or model.doc_string
    # every node is named, every name unique
    names = [n.name for n in model.graph.node]
    assert all(names) and len(set(names)) == len(names)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_same_seed_same_model(name: str) -> None:
    small = {"resnet": resnet.SMALL, "bert": bert.SMALL, "ssd": ssd.SMALL}[name]
    a = MODELS[name](**small, seed=3).SerializeToString()
    assert a == MODELS[name](**small, seed=3).SerializeToString()
    assert a != MODELS[name](**small, seed=4).SerializeToString()


def test_random_inputs(small_bert: onnx.ModelProto, small_resnet: onnx.ModelProto) -> None:
    feeds = random_inputs(small_bert, seed=1, B=3, S=20, valid_lengths=[20, 5, 0])
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.dtype == mask.dtype == np.int64 and ids.shape == mask.shape == (3, 20)
    assert ids.min() >= 0 and ids.max() < bert.SMALL["vocab"]
    assert mask.sum(axis=1).tolist() == [20, 5, 0]
    assert random_inputs(small_bert, B=1, S=4)["attention_mask"].tolist() == [[1, 1, 1, 1]]

    image = random_inputs(small_resnet, N=2)["input"]
    assert image.shape == (2, 3, 64, 64) and image.dtype == np.float32
    # ImageNet-normalised: [0, 1) pixels become roughly [-2.1, 2.7)
    assert image.min() < -1.5 and image.max() > 2.0

    with pytest.raises(ValueError, match="symbolic dim S"):
        random_inputs(small_bert, B=1)
    with pytest.raises(ValueError, match="unknown dims"):
        random_inputs(small_bert, B=1, S=2, T=3)


def test_cli_writes_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bert.onnx"
    rc = models_main(["bert", "-o", str(out), "--small", "--set", "layers=1", "--set", "seq=16"])
    assert rc == 0
    model = onnx.load(out)
    assert metadata(model)["layers"] == "1"
    assert dims(model.graph.input[0]) == ["B", 16]
    assert "LayerNormalization" in capsys.readouterr().out

    assert models_main(["ssd", "-o", str(tmp_path / "x.onnx"), "--set", "nope=1"]) == 2
    assert not (tmp_path / "x.onnx").exists()


# -- resnet ----------------------------------------------------------------------------


def test_resnet_structure(small_resnet: onnx.ModelProto) -> None:
    m = small_resnet
    required = {"Conv", "BatchNormalization", "Add", "MaxPool", "GlobalAveragePool", "Gemm"}
    assert required | {"Softmax", "Relu", "Flatten"} <= op_types(m)
    # ResNet-18 layout: stem + 8 blocks x 2 convs + 3 downsamples; BN not folded
    assert count_ops(m, "Conv") == count_ops(m, "BatchNormalization") == 20
    assert count_ops(m, "Add") == 8
    assert dims(m.graph.input[0]) == ["N", 3, 64, 64]
    assert [o.name for o in m.graph.output] == ["probs"]
    assert dims(m.graph.output[0]) == ["N", 100]
    (gemm,) = [n for n in m.graph.node if n.op_type == "Gemm"]
    assert {a.name: a.i for a in gemm.attribute}["transB"] == 1
    for node in m.graph.node:
        if node.op_type == "BatchNormalization":
            assert len(node.output) == 1  # inference mode, after calibration
            var = next(i for i in m.graph.initializer if i.name == node.input[4])
            assert (onnx.numpy_helper.to_array(var) > 0).all()


def test_resnet_runs_at_several_batches(small_resnet: onnx.ModelProto) -> None:
    sess = session(small_resnet)
    three = random_inputs(small_resnet, seed=5, N=3)
    probs3 = onnxrt.run(sess, three)["probs"]
    probs1 = onnxrt.run(sess, {"input": three["input"][:1]})["probs"]
    assert probs3.shape == (3, 100) and probs1.shape == (1, 100)
    assert np.isfinite(probs3).all()
    np.testing.assert_allclose(probs3.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(probs1[0], probs3[0], rtol=1e-4, atol=1e-6)
    # well-scaled activations: peaked, never one-hot, never uniform
    assert (probs3.max(axis=1) < 0.95).all()
    assert (probs3.max(axis=1) > 5 / 100).all()


def test_resnet18_full_size() -> None:
    m = resnet.build()
    onnx.checker.check_model(m)
    assert dims(m.graph.input[0]) == ["N", 3, 224, 224]
    assert dims(m.graph.output[0]) == ["N", 1000]
    # torchvision's resnet18: 11,689,512 parameters, + 9,600 BN running statistics
    assert count_parameters(m) == 11_689_512 + 9_600
    probs = onnxrt.run(session(m), random_inputs(m, N=1))["probs"]
    assert probs.shape == (1, 1000) and np.isfinite(probs).all()
    assert 0.005 < probs.max() < 0.95


def test_resnet_static_batch_and_depth() -> None:
    m = resnet.build((1, 1, 1, 1), num_classes=10, batch=2, width=8, image=32)
    onnx.checker.check_model(m, full_check=True)
    assert dims(m.graph.input[0]) == [2, 3, 32, 32]
    assert count_ops(m, "Conv") == 1 + 4 * 2 + 3
    probs = onnxrt.run(session(m), random_inputs(m))["probs"]
    assert probs.shape == (2, 10) and np.isfinite(probs).all()


# -- bert ------------------------------------------------------------------------------


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def test_bert_structure(small_bert: onnx.ModelProto) -> None:
    m = small_bert
    ops = op_types(m)
    assert {"Erf", "LayerNormalization", "Softmax", "Transpose", "Range"} <= ops
    assert {"Gather", "Shape", "MatMul", "Reshape", "Unsqueeze", "Cast", "Tanh"} <= ops
    layers = bert.SMALL["layers"]
    assert count_ops(m, "LayerNormalization") == 1 + 2 * layers
    assert count_ops(m, "Erf") == layers
    assert [o.name for o in m.graph.input] == ["input_ids", "attention_mask"]
    assert [dims(v) for v in m.graph.input] == [["B", "S"], ["B", "S"]]
    assert [o.name for o in m.graph.output] == ["last_hidden_state", "pooler_output"]
    assert [dims(v) for v in m.graph.output] == [["B", "S", 64], ["B", 64]]
    # positions: Shape(input_ids) -> Gather -> Range -> Gather(position table)
    producers = _producers(m)
    (rng,) = [n for n in m.graph.node if n.op_type == "Range"]
    limit = producers[rng.input[1]]
    assert limit.op_type == "Gather" and producers[limit.input[0]].op_type == "Shape"
    assert producers[limit.input[0]].input[0] == "input_ids"
    # the Reshapes use 0 (copy) dims so they work for any B and S
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    shapes = [consts[n.input[1]].tolist() for n in m.graph.node if n.op_type == "Reshape"]
    assert [0, 0, 4, 16] in shapes and [0, 0, 64] in shapes
    perms = {tuple(n.attribute[0].ints) for n in m.graph.node if n.op_type == "Transpose"}
    assert perms == {(0, 2, 1, 3), (0, 2, 3, 1)}


@pytest.mark.parametrize("seq", [8, 17])
def test_bert_runs_at_several_lengths(small_bert: onnx.ModelProto, seq: int) -> None:
    out = onnxrt.run(session(small_bert), random_inputs(small_bert, seed=seq, B=2, S=seq))
    hidden, pooled = out["last_hidden_state"], out["pooler_output"]
    assert hidden.shape == (2, seq, 64) and pooled.shape == (2, 64)
    assert np.isfinite(hidden).all() and np.isfinite(pooled).all()
    # LayerNormalization last: each position roughly zero-mean, unit-variance
    assert np.abs(hidden.mean(axis=-1)).max() < 0.1
    assert np.abs(hidden.std(axis=-1) - 1).max() < 0.1
    assert (np.abs(pooled) < 1).all() and pooled.std() > 1e-3


def test_bert_padding_leaves_real_positions_unchanged(small_bert: onnx.ModelProto) -> None:
    sess = session(small_bert)
    real = random_inputs(small_bert, seed=7, B=2, S=100)
    padded = random_inputs(small_bert, seed=8, B=2, S=128, valid_lengths=100)
    padded["input_ids"][:, :100] = real["input_ids"]
    a, b = onnxrt.run(sess, real), onnxrt.run(sess, padded)
    assert b["last_hidden_state"].shape == (2, 128, 64)
    np.testing.assert_allclose(
        b["last_hidden_state"][:, :100], a["last_hidden_state"], atol=1e-5, rtol=0
    )
    np.testing.assert_allclose(b["pooler_output"], a["pooler_output"], atol=1e-5, rtol=0)
    # and the mask is what does it: attending to the padding changes the outputs
    padded["attention_mask"][:] = 1
    c = onnxrt.run(sess, padded)
    assert np.abs(c["pooler_output"] - a["pooler_output"]).max() > 1e-4


def test_bert_base_4_layers() -> None:
    m = bert.build()  # BERT-base sizes, 4 layers
    data = m.SerializeToString()  # 211 MB: serialise once, for the checker and the session
    onnx.checker.check_model(data, full_check=True)
    assert count_ops(m, "LayerNormalization") == 9
    assert count_ops(m, "MatMul") == 4 * (4 + 2 + 2)  # Q, K, V, out; scores, context; FFN
    # HF BertModel(bert-base config, 4 layers): 23.4M word + 0.4M position embeddings,
    # 4 x 7.09M layers, 0.59M pooler
    assert count_parameters(m) == 52_779_264
    emb = next(i for i in m.graph.initializer if i.name == "embeddings.word_embeddings.weight")
    assert list(emb.dims) == [30522, 768]
    weights = onnx.numpy_helper.to_array(emb)
    assert abs(float(weights.std()) - 0.02) < 1e-3
    shapes = {
        tuple(onnx.numpy_helper.to_array(i).tolist())
        for i in m.graph.initializer
        if i.data_type == onnx.TensorProto.INT64 and len(i.dims) == 1
    }
    assert (0, 0, 12, 64) in shapes and (0, 0, 768) in shapes
    out = onnxrt.run(session(data), random_inputs(m, B=1, S=8))
    assert out["last_hidden_state"].shape == (1, 8, 768)
    assert out["pooler_output"].shape == (1, 768)
    assert np.isfinite(out["last_hidden_state"]).all()


def test_bert_static_dims() -> None:
    m = bert.build(layers=1, hidden=32, heads=2, intermediate=64, vocab=50, batch=1, seq=6)
    onnx.checker.check_model(m, full_check=True)
    assert [dims(v) for v in m.graph.input] == [[1, 6], [1, 6]]
    out = onnxrt.run(session(m), random_inputs(m))
    assert out["last_hidden_state"].shape == (1, 6, 32)
    with pytest.raises(ValueError, match="multiple of heads"):
        bert.build(hidden=30, heads=4)


# -- ssd -------------------------------------------------------------------------------


def test_ssd_structure(small_ssd: onnx.ModelProto) -> None:
    m = small_ssd
    ops = op_types(m)
    assert {"TopK", "NonMaxSuppression", "Gather", "Where", "Resize", "If", "Loop"} <= ops
    assert {"Conv", "Exp", "Sigmoid", "ReduceMax", "ArgMax", "Concat"} <= ops
    assert dims(m.graph.input[0]) == [1, 3, 128, 128]
    assert [(o.name, dims(o)) for o in m.graph.output] == [
        ("boxes", ["D", 4]),
        ("scores", ["D"]),
        ("classes", ["D"]),
    ]
    assert [o.type.tensor_type.elem_type for o in m.graph.output] == [
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.INT64,
    ]
    (nms,) = [n for n in m.graph.node if n.op_type == "NonMaxSuppression"]
    assert {a.name: a.i for a in nms.attribute}["center_point_box"] == 0
    assert len(nms.input) == 5
    anchors = next(i for i in m.graph.initializer if i.name == "anchors")
    assert list(anchors.dims) == [(16 * 16 + 8 * 8) * 3, 4]


def test_ssd_detections_vary_with_the_image(small_ssd: onnx.ModelProto) -> None:
    sess = session(small_ssd)
    meta = metadata(small_ssd)
    max_det, classes = int(meta["max_detections"]), int(meta["num_classes"])
    threshold = float(meta["score_threshold"])
    counts = []
    clipped = False
    for seed in range(6):
        out = onnxrt.run(sess, random_inputs(small_ssd, seed=seed))
        boxes, scores, labels = out["boxes"], out["scores"], out["classes"]
        d = len(scores)
        counts.append(d)
        assert boxes.shape == (d, 4) and labels.shape == (d,)
        assert boxes.dtype == scores.dtype == np.float32 and labels.dtype == np.int64
        assert 0 <= d <= max_det
        if d:
            assert (scores > threshold).all() and (np.diff(scores) <= 0).all()
            assert ((labels >= 0) & (labels < classes)).all()
            # Where clamps below 0, the Loop clips to the image
            assert boxes.min() >= 0 and boxes.max() <= 128
            assert (boxes[:, 2:] >= boxes[:, :2]).all()
            clipped = clipped or bool((boxes == 128).any())
    assert any(0 < d < max_det for d in counts), counts
    assert len(set(counts)) > 1, counts
    assert clipped


def test_ssd_nothing_selected_gives_empty_outputs() -> None:
    m = ssd.build(**ssd.SMALL, score_threshold=0.9999)
    out = onnxrt.run(session(m), random_inputs(m))
    assert out["boxes"].shape == (0, 4)
    assert out["scores"].shape == (0,) and out["classes"].shape == (0,)
    assert out["classes"].dtype == np.int64


def test_ssd_other_sizes() -> None:
    m = ssd.build(image=64, num_classes=3, max_detections=5, seed=2, width=4)
    onnx.checker.check_model(m, full_check=True)
    out = onnxrt.run(session(m), random_inputs(m, seed=1))
    assert len(out["scores"]) <= 5 and out["boxes"].shape == (len(out["scores"]), 4)
    with pytest.raises(ValueError, match="multiple of 16"):
        ssd.build(image=100)
