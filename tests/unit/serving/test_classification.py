"""The classification extension's rules (`neuron_rtd/serving/classification.py`), which
the daemon tests drive end to end: scores written as C's %f, integers as integers, ties
by index, NaN last, the extremes of every integer type, rows and shapes, and label files
read as data from the model's folder only."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import model_config_pb
from neuron_rtd.runtime import LocalRuntime
from neuron_rtd.serving import InferRequest, Serving, ServingError, Status
from neuron_rtd.serving.classification import check_classification, read_labels, top_classes


def test_float_scores_ties_and_nan() -> None:
    row = np.array([[0.1, np.nan, 0.1, -np.inf, 3.0, np.inf]], dtype=np.float32)
    got = top_classes(row, 6, batched=True, labels=())
    assert got.tolist() == [
        [b"inf:5", b"3.000000:4", b"0.100000:0", b"0.100000:2", b"-inf:3", b"nan:1"]
    ]
    big = np.array([1e20, -2.5e-7], dtype=np.float64)
    assert top_classes(big, 2, batched=False, labels=()).tolist() == [
        b"100000000000000000000.000000:0",
        b"-0.000000:1",
    ]


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint64"])
def test_integer_extremes_rank_without_overflow(dtype: str) -> None:
    info = np.iinfo(dtype)
    row = np.array([[0, info.max, info.min, 1, info.max]], dtype=dtype)
    got = top_classes(row, 5, batched=True, labels=())
    values = row[0].tolist()  # (unsigned: min is 0, a tie with index 0, which goes first)
    assert got[0].tolist() == [f"{values[i]}:{i}".encode() for i in (1, 4, 3, 0, 2)]


def test_rows_labels_and_counts() -> None:
    scores = np.array([[1.0, 5.0, 3.0], [9.0, 0.0, 4.0]], dtype=np.float32)
    labels = (b"zero", b"", b"two")  # class 1 has an empty line: no label
    batched = top_classes(scores, 2, batched=True, labels=labels)
    assert batched.shape == (2, 2)
    assert batched.tolist() == [
        [b"5.000000:1", b"3.000000:2:two"],
        [b"9.000000:0:zero", b"4.000000:2:two"],
    ]
    whole = top_classes(scores, 10, batched=False, labels=labels)  # one row of all six
    assert whole.shape == (6,)
    assert whole[:2].tolist() == [b"9.000000:3", b"5.000000:1"]  # index 3: past the labels


def test_types_that_do_not_rank_are_refused_before_running() -> None:
    config = model_config_pb.ModelConfig()
    config.output.add(name="h", data_type=model_config_pb.TYPE_FP16)
    config.output.add(name="p", data_type=model_config_pb.TYPE_FP32)
    check_classification(config, {"p": 3, "unknown": 1})
    with pytest.raises(ServingError, match="unsupported type 'FP16'") as caught:
        check_classification(config, {"h": 3})
    assert caught.value.status is Status.INVALID_ARGUMENT


def config_with_labels(filename: str) -> model_config_pb.ModelConfig:
    config = model_config_pb.ModelConfig()
    config.output.add(name="p", data_type=model_config_pb.TYPE_FP32, label_filename=filename)
    config.output.add(name="q", data_type=model_config_pb.TYPE_FP32)
    return config


def test_labels_are_lines_of_a_file_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_bytes(b"a\nb c\n\n\xffd\r\n")
    labels = read_labels(tmp_path, config_with_labels("labels.txt"), "model 'm'")
    assert labels == {"p": (b"a", b"b c", b"", b"\xffd\r")}  # as Triton's getline reads them


@pytest.mark.parametrize(
    ("filename", "status", "words"),
    [
        ("../labels.txt", Status.INVALID_ARGUMENT, "is not a plain file name"),
        ("sub/labels.txt", Status.INVALID_ARGUMENT, "is not a plain file name"),
        ("missing.txt", Status.UNAVAILABLE, "no such file"),
        ("link.txt", Status.INVALID_ARGUMENT, "not a regular file"),
        ("fifo", Status.INVALID_ARGUMENT, "not a regular file"),
    ],
)
def test_a_label_file_that_cannot_be_read_fails_the_load(
    tmp_path: Path, filename: str, status: Status, words: str
) -> None:
    (tmp_path / "secret").write_text("not for you\n")
    (tmp_path / "link.txt").symlink_to(tmp_path / "secret")
    os.mkfifo(tmp_path / "fifo")  # never opened: a reader would block
    with pytest.raises(ServingError) as caught:
        read_labels(tmp_path, config_with_labels(filename), "model 'm' version 1")
    assert caught.value.status is status
    message = caught.value.message
    assert "model 'm' version 1: output 'p' label_filename" in message and words in message


def test_a_version_whose_label_file_is_missing_is_unavailable_saying_why(tmp_path: Path) -> None:
    """In the serving core: the version does not load, the repository index says why, and
    once the file is there a load serves the labels."""
    root = tmp_path / "repo"
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "1" / "model.neff").write_bytes(build_mlp((8, 8, 4)).neff)
    (root / "m" / "config.pbtxt").write_text(
        'output [ { name: "probs" data_type: TYPE_FP32 dims: [ 1, 4 ] '
        'label_filename: "classes.txt" } ]\n'
    )
    with LocalRuntime() as local:
        serving = Serving(local.runtime, repository=root, control_mode="explicit")
        serving.start()
        try:
            with pytest.raises(ServingError):
                serving.load_model("m")
            (row,) = serving.repository_index()
            assert row.state == "UNAVAILABLE" and "label_filename 'classes.txt'" in row.reason
            assert "no such file" in row.reason
            (root / "m" / "classes.txt").write_text("a\nb\nc\nd\n")
            serving.load_model("m")
            x = {"x": np.ones((1, 8), np.float32)}
            answer = serving.infer(InferRequest("m", x, classification={"probs": 2}))
            top = answer.outputs["probs"]
            assert top.shape == (2,) and all(item.count(b":") == 2 for item in top)
        finally:
            serving.close()
