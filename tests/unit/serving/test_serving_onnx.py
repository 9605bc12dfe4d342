"""ONNX models in the serving core, in process: a config that contradicts the ONNX file
refused naming the field and both values, the compile cache (one build per key however
many ask at once, an entry cut short built again, a folder others may write in refused,
what the key covers), a compile in progress shown as LOADING while other models answer,
and which file a version's folder is served from when there is no config."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_serving_repository import MLP, W, linear_model, local, refusal, serve
from waiting import wait_until

import neuron_rtd
from neuron_rtd.runtime import LocalRuntime
from neuron_rtd.serving import InferRequest, ServingError, Status, compile_cache, onnx_models
from neuron_rtd.serving.compile_cache import CompileCache, cache_key, compiler_version

__all__ = ["local"]  # the fixture, imported


def onnx_repo(root: Path, model: onnx.ModelProto, config: str | None, name: str = "m") -> Path:
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, root / name / "1" / "model.onnx")
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)
    return root


def string_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("s", TensorProto.STRING, [2])
    y = helper.make_tensor_value_info("t", TensorProto.STRING, [2])
    graph = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "s", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


ONNX = 'platform: "onnxruntime_onnx"\n'


@pytest.mark.parametrize(
    ("batch", "config", "reason"),
    [
        (
            2,
            ONNX + 'input { name: "x" data_type: TYPE_INT32 dims: [2, 4] }',
            "input 'x' data_type TYPE_INT32, but model.onnx (version 1) has TYPE_FP32",
        ),
        (
            2,
            ONNX + 'input { name: "images" data_type: TYPE_FP32 dims: [2, 4] }',
            "input 'images' is not one of model.onnx (version 1)'s inputs ('x')",
        ),
        (
            2,
            ONNX + 'input { name: "w" data_type: TYPE_FP32 dims: [4, 3] }',
            "input 'w' is a weight (an initializer) of model.onnx (version 1)",
        ),
        (
            2,
            ONNX + 'input { name: "x" data_type: TYPE_FP32 dims: [3, 4] }',
            "input 'x' dims [3, 4], but model.onnx (version 1) has [2, 4]",
        ),
        (
            2,
            ONNX + 'output { name: "y" data_type: TYPE_FP32 dims: [2, 5] }',
            "output 'y' dims [2, 5], but model.onnx (version 1) has [2, 3]",
        ),
        (
            2,
            ONNX + "max_batch_size: 4",
            "max_batch_size 4, but input 'x' of model.onnx (version 1) has a fixed first axis of 2",
        ),
        (
            2,
            ONNX + "dynamic_batching { }",
            "dynamic_batching needs max_batch_size > 0",
        ),
        (
            "N",
            ONNX + 'output { name: "y" }',  # names a tensor: not auto-completed to batch
            "input 'x' has axes of no fixed size ([-1, 4])",
        ),
        (
            2,
            ONNX + 'input { name: "x" data_type: TYPE_FP32 dims: [2, 3] reshape { shape: [8] } }',
            "input 'x' reshape [8] holds 8 elements, but its dims [2, 3] hold 6",
        ),
        (
            2,
            ONNX
            + 'input { name: "x" data_type: TYPE_FP32 dims: [8] reshape { shape: [2, 4, 1] } }',
            "input 'x' reshape [2, 4, 1], but model.onnx (version 1) has [2, 4]",
        ),
        (
            2,
            'platform: "onnxruntime_onnx" backend: "neuron"',
            "platform 'onnxruntime_onnx' and backend 'neuron' name different kinds of model",
        ),
    ],
)
def test_a_config_that_contradicts_the_onnx_file_is_refused_naming_the_field(
    local: LocalRuntime, tmp_path: Path, batch: str | int, config: str, reason: str
) -> None:
    root = onnx_repo(tmp_path / "repo", linear_model(batch), config)
    serving = serve(local, root, compile_cache=tmp_path / "cache")
    why = refusal(serving, "m")
    assert reason in why, why
    assert local.runtime.models() == []
    assert not list((tmp_path / "cache").glob("*.neff"))  # refused before any compile


def test_an_onnx_model_of_string_tensors_is_served(local: LocalRuntime, tmp_path: Path) -> None:
    root = onnx_repo(tmp_path / "repo", string_model(), None)
    serving = serve(local, root, compile_cache=tmp_path / "cache")
    sent = np.array([b"ab", "\u00e9t\u00e9".encode()], dtype=object)
    got = serving.infer(InferRequest("m", {"s": sent})).outputs["t"]
    assert got.tolist() == sent.tolist()


def test_a_folder_with_a_neff_and_an_onnx_file_serves_the_neff(
    local: LocalRuntime, tmp_path: Path
) -> None:
    root = onnx_repo(tmp_path / "repo", linear_model(2), None)
    (root / "m" / "1" / "model.neff").write_bytes(MLP.neff)
    serving = serve(local, root, compile_cache=tmp_path / "cache")
    assert serving.model_config("m").platform == "neuron_neff"
    assert serving.model_metadata("m").platform == "neuron_neff"
    assert not (tmp_path / "cache").exists()  # nothing compiled


# --- the compile cache -------------------------------------------------------------------
def test_one_build_per_key_however_many_ask_at_once(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "cache")
    builds: list[int] = []
    gate = threading.Barrier(4)

    def build() -> bytes:
        builds.append(1)
        return MLP.neff

    def ask() -> tuple[Path, bool]:
        gate.wait()
        return CompileCache(tmp_path / "cache").get_or_build("k" * 64, build)  # another daemon's

    results: list[tuple[Path, bool]] = []
    threads = [threading.Thread(target=lambda: results.append(ask())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert sorted(built for _, built in results) == [False, False, False, True]
    assert {path for path, _ in results} == {cache.entry("k" * 64)}
    assert cache.entry("k" * 64).read_bytes() == MLP.neff
    assert os.stat(tmp_path / "cache").st_mode & 0o777 == 0o700
    assert not [n for n in os.listdir(tmp_path / "cache") if n.startswith(".tmp-")]


def test_an_entry_cut_short_is_built_again(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "cache")
    path, built = cache.get_or_build("a" * 64, lambda: MLP.neff)
    assert built
    path.write_bytes(MLP.neff[:-10])  # a full disk, say
    again, built = cache.get_or_build("a" * 64, lambda: MLP.neff)
    assert (again, built) == (path, True)
    assert path.read_bytes() == MLP.neff
    assert cache.find("a" * 64) == path


def test_a_cache_folder_others_may_write_in_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(ServingError) as caught:
        CompileCache(folder).get_or_build("b" * 64, lambda: MLP.neff)
    assert caught.value.status is Status.UNAVAILABLE
    assert f"the compile cache folder {folder} cannot be used: others may write in it" in (
        caught.value.message
    )
    assert not list(folder.iterdir())


def test_the_key_covers_the_bytes_the_options_and_the_compiler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = cache_key(b"model", {"max_batch_size": 8})
    assert key == cache_key(b"model", {"max_batch_size": 8})
    assert key != cache_key(b"model2", {"max_batch_size": 8})
    assert key != cache_key(b"model", {"max_batch_size": 4})
    assert compiler_version().startswith(f"{neuron_rtd.__version__}+")
    monkeypatch.setattr(compile_cache, "compiler_version", lambda: "0.1.0+another")
    assert key != cache_key(b"model", {"max_batch_size": 8})


# --- compiling while the daemon serves ---------------------------------------------------
@pytest.fixture
def held_compile(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The compile of every ONNX model waits, after telling its first step, until the
    event is set."""
    release = threading.Event()
    real = onnx_models.compile_model

    def compile_model(model: Any, **options: Any) -> Any:
        options["progress"]("loading and checking the model", 0, 3)
        assert release.wait(60)
        return real(model, **options)

    monkeypatch.setattr(onnx_models, "compile_model", compile_model)
    yield release
    release.set()


def test_a_compile_shows_as_loading_and_other_models_answer_meanwhile(
    local: LocalRuntime, tmp_path: Path, held_compile: threading.Event
) -> None:
    root = onnx_repo(tmp_path / "repo", linear_model(2), ONNX)
    (root / "mlp" / "1").mkdir(parents=True)
    (root / "mlp" / "1" / "model.neff").write_bytes(MLP.neff)
    serving = serve(local, root, control_mode="explicit", compile_cache=tmp_path / "cache")
    serving.load_model("mlp")
    loading = threading.Thread(target=serving.load_model, args=("m",))
    loading.start()
    try:

        def row() -> Any:
            return next(r for r in serving.repository_index() if r.name == "m")

        wait_until(lambda: row().state == "LOADING", 30, "model m LOADING")
        assert row().version == "1"
        assert row().reason == "compiling model.onnx: loading and checking the model (0/3)"
        answer = serving.infer(InferRequest("mlp", MLP.random_inputs()))  # not held up
        assert answer.outputs.keys() == {t.name for t in serving.model_metadata("mlp").outputs}
        with pytest.raises(ServingError):
            serving.infer(InferRequest("m", {"x": np.zeros((2, 4), np.float32)}))
    finally:
        held_compile.set()
        loading.join(60)
    assert [(r.name, r.version, r.state) for r in serving.repository_index()] == [
        ("m", "1", "READY"),
        ("mlp", "1", "READY"),
    ]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    got = serving.infer(InferRequest("m", {"x": x})).outputs["y"]
    np.testing.assert_allclose(got, x @ W, rtol=1e-5, atol=1e-6)
    serving.close()


def test_a_changed_onnx_file_is_compiled_again_when_polled(
    local: LocalRuntime, tmp_path: Path
) -> None:
    root = onnx_repo(tmp_path / "repo", linear_model(2), None)
    serving = serve(local, root, control_mode="poll", poll_s=3600, compile_cache=tmp_path / "c")
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(serving.infer(InferRequest("m", {"x": x})).outputs["y"], x @ W)
    doubled = linear_model(2)
    doubled.graph.initializer[0].CopyFrom(numpy_helper.from_array(2 * W, "w"))
    path = root / "m" / "1" / "model.onnx"
    onnx.save(doubled, path)
    os.utime(path, ns=(1, 1))  # a stamp of its own, however fast the rewrite came
    serving.poll_once()
    got = serving.infer(InferRequest("m", {"x": x})).outputs["y"]
    np.testing.assert_allclose(got, x @ (2 * W), rtol=1e-6)
    assert len(list((tmp_path / "c").glob("*.neff"))) == 2  # one entry per content
    serving.close()


def test_an_onnx_file_with_external_data_is_refused_saying_so(
    local: LocalRuntime, tmp_path: Path
) -> None:
    root = onnx_repo(tmp_path / "repo", linear_model(2), None)
    path = root / "m" / "1" / "model.onnx"
    onnx.save(linear_model(2), path, save_as_external_data=True, size_threshold=0)
    serving = serve(local, root, compile_cache=tmp_path / "cache")
    why = refusal(serving, "m")
    assert "keeps weights in external data files ('w'), which neuron-rtd does not read" in why


def test_a_load_request_may_bring_an_onnx_file_and_its_config(
    local: LocalRuntime, tmp_path: Path
) -> None:
    (tmp_path / "repo").mkdir()
    serving = serve(
        local, tmp_path / "repo", control_mode="explicit", compile_cache=tmp_path / "cache"
    )
    config = (
        '{"backend": "onnxruntime", "max_batch_size": 8, "input": [{"name": "x", '
        '"data_type": "TYPE_FP32", "dims": [4]}], "dynamic_batching": {}}'
    )
    model = linear_model("N").SerializeToString()
    serving.load_model("up", config=config, files={"1/model.onnx": model})
    assert serving.model_config("up").max_batch_size == 8
    x = np.ones((5, 4), np.float32)
    got = serving.infer(InferRequest("up", {"x": x})).outputs["y"]
    np.testing.assert_allclose(got, x @ W, rtol=1e-6)
    serving.close()


def test_reshape_with_a_batch_axis_keeps_the_batch_first(
    local: LocalRuntime, tmp_path: Path
) -> None:
    """Triton's rule: with max_batch_size > 0, dims and reshape both leave the batch out."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 2])
    node = helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])
    graph = helper.make_graph([node], "t", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    config = (
        ONNX + "max_batch_size: 4\n"
        'input { name: "x" data_type: TYPE_FP32 dims: [4] reshape { shape: [2, 2] } }\n'
        'output { name: "y" data_type: TYPE_FP32 dims: [4] reshape { shape: [2, 2] } }\n'
    )
    root = onnx_repo(tmp_path / "repo", model, config)
    serving = serve(local, root, compile_cache=tmp_path / "cache")
    meta = serving.model_metadata("m")
    assert [t.shape for t in (*meta.inputs, *meta.outputs)] == [(-1, 4), (-1, 4)]
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = serving.infer(InferRequest("m", {"x": rows})).outputs["y"]
    want = rows.reshape(3, 2, 2).transpose(0, 2, 1).reshape(3, 4)
    np.testing.assert_array_equal(got, want)
    serving.close()


def test_a_model_file_is_read_only_from_within_its_version_folder(
    local: LocalRuntime, tmp_path: Path
) -> None:
    root = tmp_path / "repo"
    for name, target in (("inside", "real.onnx"), ("outside", str(tmp_path / "secret.onnx"))):
        (root / name / "1").mkdir(parents=True)
        onnx.save(linear_model(2), root / name / "1" / "real.onnx")
        (root / name / "1" / "model.onnx").symlink_to(target)
    onnx.save(linear_model(2), tmp_path / "secret.onnx")
    (root / "fifo" / "1").mkdir(parents=True)
    os.mkfifo(root / "fifo" / "1" / "model.onnx")
    serving = serve(local, root, compile_cache=tmp_path / "cache")
    assert serving.model_ready("inside")
    why = refusal(serving, "outside")
    assert "model.onnx leads outside its version folder" in why, why
    why = refusal(serving, "fifo")
    assert "it is not a regular file (an ONNX model file must be one)" in why, why
    serving.close()


def test_an_onnx_models_label_file_is_read_from_its_folder(
    local: LocalRuntime, tmp_path: Path
) -> None:
    """Its NEFF is in the compile cache, its labels beside its config.pbtxt."""
    config = (
        ONNX
        + 'max_batch_size: 4 input { name: "x" data_type: TYPE_FP32 dims: [4] } '
        + 'output { name: "y" data_type: TYPE_FP32 dims: [3] label_filename: "labels.txt" }'
    )
    root = onnx_repo(tmp_path / "repo", linear_model(), config)
    (root / "m" / "labels.txt").write_text("zero\none\ntwo\n")
    serving = serve(local, root, compile_cache=tmp_path / "cache")
    x = np.array([[1, 0, 0, 0], [0, 0, 1, 0]], np.float32)
    got = serving.infer(InferRequest("m", {"x": x}, classification={"y": 1})).outputs["y"]
    best = (x @ W).argmax(axis=1)
    labels = ["zero", "one", "two"]
    assert [row[0].decode().split(":")[1:] for row in got] == [[str(i), labels[i]] for i in best]


def test_fields_that_change_nothing_here_are_accepted(local: LocalRuntime, tmp_path: Path) -> None:
    """What docs/kserve.md lists as accepted and not acted on: a config Triton's users
    write with them serves."""
    config = ONNX + (
        "max_batch_size: 8\n"
        "dynamic_batching { priority_levels: 2 default_priority_level: 1 }\n"
        "optimization { graph { level: 1 } }\n"
        'model_warmup { name: "w" batch_size: 1 }\n'
        "response_cache { enable: true }\n"
        'parameters { key: "k" value { string_value: "v" } }\n'
        'metric_tags { key: "team" value: "a" }\n'
        'instance_group { count: 1 kind: KIND_CPU rate_limiter { priority: 1 } host_policy: "h" }\n'
    )
    root = onnx_repo(tmp_path / "repo", linear_model(), config)
    serving = serve(local, root, compile_cache=tmp_path / "cache")
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(serving.infer(InferRequest("m", {"x": x})).outputs["y"], x @ W)
