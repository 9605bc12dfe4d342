"""The serving core's model repository, in process: configs completed from the NEFF and
refused when they contradict it, versions and their policies, the control modes (poll
included), explicit load/unload with a config or files, and instance groups as runtime
models."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from waiting import wait_until

from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.neff import build_mlp
from neuron_rtd.proto import model_config_pb
from neuron_rtd.runtime import LocalRuntime
from neuron_rtd.serving import InferRequest, RepositoryModel, Serving, ServingError, Status
from neuron_rtd.serving.repository import check_file_key

MLP = build_mlp((8, 8, 4), name="mlp")
MLP2 = build_mlp((8, 8, 4), seed=7, name="mlp")  # same shapes, other weights
W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10


def linear_model(batch: str | int = "N") -> onnx.ModelProto:
    """y = x @ W: x (batch, 4) float32, y (batch, 3)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])
    weight = numpy_helper.from_array(W, "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "linear", [x], [y], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


BUCKETS = compile_model(linear_model(), dynamic_batch=bucket_ranges(1, 8)).neff  # max 8


def write_repo(root: Path, models: Mapping[str, Mapping[int, bytes]], **configs: str) -> Path:
    """`root/NAME/VERSION/model.neff` per model and version; `configs`: config.pbtxt
    text by model name."""
    for name, versions in models.items():
        for version, neff in versions.items():
            (root / name / str(version)).mkdir(parents=True, exist_ok=True)
            (root / name / str(version) / "model.neff").write_bytes(neff)
    for name, text in configs.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(text)
    return root


@pytest.fixture
def local() -> Iterator[LocalRuntime]:
    with LocalRuntime() as runtime:
        yield runtime


def serve(local: LocalRuntime, root: Path | None, **kwargs: object) -> Serving:
    serving = Serving(local.runtime, repository=root, **kwargs)  # type: ignore[arg-type]
    serving.start()
    return serving


def index(serving: Serving) -> list[tuple[str, str, str]]:
    return [(r.name, r.version, r.state) for r in serving.repository_index()]


def refusal(serving: Serving, name: str) -> str:
    """The reason model `name` is not served, as the index says."""
    (row,) = [r for r in serving.repository_index() if r.name == name]
    assert row.state == "UNAVAILABLE", row
    return row.reason


# --- the config completed from the NEFF --------------------------------------------------
def test_config_of_a_fixed_shape_neff(local: LocalRuntime, tmp_path: Path) -> None:
    serving = serve(local, write_repo(tmp_path, {"m": {1: MLP.neff}}))
    config = serving.model_config("m")
    assert (config.name, config.platform, config.backend) == ("m", "neuron_neff", "neuron")
    assert config.max_batch_size == 0
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("x", model_config_pb.TYPE_FP32, [1, 8])
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("probs", model_config_pb.TYPE_FP32, [1, 4])
    ]
    assert [(g.count, g.kind) for g in config.instance_group] == [
        (1, model_config_pb.ModelInstanceGroup.KIND_MODEL)
    ]
    assert config.version_policy.latest.num_versions == 1
    assert config.default_model_filename == "model.neff"
    meta = serving.model_metadata("m")
    assert (meta.versions, meta.platform) == (("1",), "neuron_neff")
    assert [(t.name, t.datatype, t.shape) for t in meta.inputs] == [("x", "FP32", (1, 8))]
    serving.close()


def test_config_of_a_batch_bucket_neff(local: LocalRuntime, tmp_path: Path) -> None:
    serving = serve(local, write_repo(tmp_path, {"b": {1: BUCKETS}}))
    config = serving.model_config("b")
    assert config.max_batch_size == 8
    assert [list(i.dims) for i in config.input] == [[4]]
    assert [list(o.dims) for o in config.output] == [[3]]
    meta = serving.model_metadata("b", "1")
    assert [t.shape for t in (*meta.inputs, *meta.outputs)] == [(-1, 4), (-1, 3)]
    serving.close()


def test_a_smaller_max_batch_size_is_kept_and_dims_given_are_checked(
    local: LocalRuntime, tmp_path: Path
) -> None:
    text = 'max_batch_size: 4\ninput { name: "x" data_type: TYPE_FP32 dims: [4] }\n'
    serving = serve(local, write_repo(tmp_path, {"b": {1: BUCKETS}}, b=text))
    config = serving.model_config("b")
    assert config.max_batch_size == 4
    assert [o.name for o in config.output] == ["y"]  # completed
    serving.close()


def test_max_batch_size_zero_on_a_bucket_neff_means_the_batch_axis_varies(
    local: LocalRuntime, tmp_path: Path
) -> None:
    # proto3 cannot tell "max_batch_size: 0" from no field: 0 is completed, as Triton does
    text = 'input { name: "x" dims: [-1, 4] }\nmax_batch_size: 0\n'
    serving = serve(local, write_repo(tmp_path, {"b": {1: BUCKETS}}, b=text))
    assert refusal(serving, "b") == (
        "config.pbtxt of model 'b': input 'x' dims [-1, 4], but its NEFF (version 1) takes [4] "
        "(the batch axis left out: max_batch_size > 0)"
    )
    serving.close()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            'input { name: "x" data_type: TYPE_INT32 }',
            "input 'x' data_type TYPE_INT32, but its NEFF (version 1) takes TYPE_FP32",
        ),
        (
            'input { name: "images" }',
            "input 'images' is not one of its NEFF (version 1)'s inputs (x)",
        ),
        (
            'output { name: "probs" dims: [1, 5] }',
            "output 'probs' dims [1, 5], but its NEFF (version 1) takes [1, 4]",
        ),
        (
            'input { name: "x" dims: [-1, 8] }',
            "input 'x' dims [-1, 8], but its NEFF (version 1) takes [1, 8]",
        ),
        (
            "max_batch_size: 4",
            "max_batch_size 4, but its NEFF (version 1) has no batch buckets",
        ),
        (
            "dynamic_batching { }",
            "dynamic_batching needs max_batch_size > 0",
        ),
        (
            'sequence_batching { control_input { name: "START" control { '
            "kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] } } }",
            "control_input 'START' (CONTROL_SEQUENCE_START): its NEFF has no input 'START'",
        ),
        (
            'ensemble_scheduling { step { model_name: "a" } }',
            "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble",
        ),
        (
            "instance_group { kind: KIND_GPU count: 1 }",
            "instance_group asks for GPUs (KIND_GPU), and this host has none",
        ),
        (
            "model_transaction_policy { decoupled: true }",
            "decoupled is not served: a NEFF answers each request exactly once",
        ),
        ('platform: "tensorrt_plan"', "platform 'tensorrt_plan' is not served here"),
        ('name: "other"', "name 'other', but the model's directory is 'm'"),
        ('input { name: "x" reshape { shape: [8] } }', "input 'x' sets reshape"),
    ],
)
def test_a_config_that_contradicts_the_neff_is_refused_naming_the_field(
    local: LocalRuntime, tmp_path: Path, text: str, reason: str
) -> None:
    serving = serve(local, write_repo(tmp_path, {"m": {1: MLP.neff}}, m=text))
    why = refusal(serving, "m")
    assert why.startswith("config.pbtxt of model 'm': "), why
    assert reason in why
    with pytest.raises(ServingError) as caught:
        serving.infer(InferRequest("m", MLP.random_inputs()))
    assert caught.value.status is Status.UNAVAILABLE
    assert reason in caught.value.message
    assert local.runtime.models() == []
    serving.close()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("max_batch_size: 16", "max_batch_size 16, but the largest batch bucket of its NEFF"),
        (
            "max_batch_size: 4 dynamic_batching { preferred_batch_size: [2, 6] }",
            "dynamic_batching preferred_batch_size 6 is not within 1..max_batch_size (4)",
        ),
    ],
)
def test_batch_sizes_beyond_the_buckets_are_refused(
    local: LocalRuntime, tmp_path: Path, text: str, reason: str
) -> None:
    serving = serve(local, write_repo(tmp_path, {"b": {1: BUCKETS}}, b=text))
    assert reason in refusal(serving, "b")
    serving.close()


def test_a_config_that_does_not_parse_names_the_file_and_line(
    local: LocalRuntime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = write_repo(
        tmp_path, {"m": {1: MLP.neff}, "ok": {1: MLP.neff}}, m="max_batch_size: 0\nfoo: 1\n"
    )
    caplog.set_level(logging.ERROR, logger="nrtd.KSERVE")
    serving = serve(local, root)
    why = refusal(serving, "m")
    assert why.startswith(f"{root}/m/config.pbtxt:2:1: "), why
    assert 'no field named "foo"' in why
    assert any("Model 'm' not served" in r.getMessage() for r in caplog.records)
    assert serving.model_ready("ok")  # the daemon keeps serving the others
    serving.close()


# --- versions ----------------------------------------------------------------------------
def test_versions_and_their_policies(local: LocalRuntime, tmp_path: Path) -> None:
    neffs = {1: MLP.neff, 2: MLP2.neff, 3: MLP.neff}
    root = write_repo(
        tmp_path,
        {"latest": neffs, "two": neffs, "all": neffs, "some": neffs},
        two="version_policy { latest { num_versions: 2 } }",
        all="version_policy { all { } }",
        some="version_policy { specific { versions: [1, 3] } }",
    )
    serving = serve(local, root)
    assert index(serving) == [
        ("all", "1", "READY"),
        ("all", "2", "READY"),
        ("all", "3", "READY"),
        ("latest", "3", "READY"),
        ("some", "1", "READY"),
        ("some", "3", "READY"),
        ("two", "2", "READY"),
        ("two", "3", "READY"),
    ]
    assert serving.model_metadata("all").versions == ("1", "2", "3")
    x = MLP.random_inputs()
    by_version = serving.infer(InferRequest("all", x, version="2"))
    assert by_version.version == "2"
    np.testing.assert_allclose(by_version.outputs["probs"], MLP2.reference(x)["probs"], rtol=1e-5)
    assert serving.infer(InferRequest("all", x)).version == "3"  # "": the newest
    assert not serving.model_ready("latest", "2")
    with pytest.raises(ServingError) as caught:
        serving.model_metadata("latest", "2")
    assert caught.value.status is Status.NOT_FOUND
    assert caught.value.message == (
        "Request for unknown model: 'latest' version 2 is not found (ready versions: 3)"
    )
    assert len(local.runtime.models()) == 8
    serving.close()
    assert local.runtime.models() == []


def test_a_version_named_by_policy_but_missing_is_unavailable(
    local: LocalRuntime, tmp_path: Path
) -> None:
    root = write_repo(
        tmp_path, {"m": {1: MLP.neff}}, m="version_policy { specific { versions: [1, 4] } }"
    )
    serving = serve(local, root)
    rows = serving.repository_index()
    assert rows[0] == RepositoryModel("m", "1", "READY")
    assert rows[1].version == "4" and rows[1].state == "UNAVAILABLE"
    assert "named by version_policy, but" in rows[1].reason
    with pytest.raises(ServingError) as caught:
        serving.infer(InferRequest("m", MLP.random_inputs(), version="4"))
    assert caught.value.status is Status.UNAVAILABLE
    assert serving.repository_index(ready_only=True) == [RepositoryModel("m", "1", "READY")]
    serving.close()


def test_a_broken_neff_leaves_its_version_unavailable(local: LocalRuntime, tmp_path: Path) -> None:
    serving = serve(local, write_repo(tmp_path, {"m": {1: b"not a neff at all" * 100}}))
    why = refusal(serving, "m")
    assert why.startswith(f"model 'm' version 1: {tmp_path}/m/1/model.neff is not a NEFF"), why
    serving.close()


def test_a_model_without_versions(local: LocalRuntime, tmp_path: Path) -> None:
    (tmp_path / "empty" / "notaversion").mkdir(parents=True)
    serving = serve(local, tmp_path)
    assert "no numeric version directory" in refusal(serving, "empty")
    serving.close()


def test_default_model_filename(local: LocalRuntime, tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "net.neff").write_bytes(MLP.neff)
    (tmp_path / "m" / "config.pbtxt").write_text('default_model_filename: "net.neff"')
    serving = serve(local, tmp_path)
    assert serving.model_ready("m")
    serving.close()


# --- instance groups -----------------------------------------------------------------------
def test_instance_group_count_makes_runtime_models(local: LocalRuntime, tmp_path: Path) -> None:
    text = "instance_group [{ count: 2 }, { count: 1 kind: KIND_CPU }]"
    serving = serve(local, write_repo(tmp_path, {"m": {1: MLP.neff}}, m=text))
    models = local.runtime.models()
    assert len(models) == 3
    assert len({m.ncg_id for m in models}) == 3  # each copy on an NCG of its own
    assert {m.name for m in models} == {"m"}  # each under its repository name
    x = MLP.random_inputs()
    for _ in range(4):
        out = serving.infer(InferRequest("m", x)).outputs["probs"]
        np.testing.assert_allclose(out, MLP.reference(x)["probs"], rtol=1e-5)
    serving.close()
    assert local.runtime.models() == []


def test_not_enough_neuroncores_is_a_clear_reason(local: LocalRuntime, tmp_path: Path) -> None:
    text = "instance_group { count: 17 }"  # an inf1.6xlarge has 16 NCs
    serving = serve(local, write_repo(tmp_path, {"m": {1: MLP.neff}}, m=text))
    why = refusal(serving, "m")
    assert why.startswith(
        "model 'm' version 1: not enough free NeuronCores for its 17 copies of 1 NC(s) each "
        "(instance_group count; 16 loaded before the shortage)"
    ), why
    assert local.runtime.models() == []  # the copies made were unloaded
    serving.close()


# --- control modes ---------------------------------------------------------------------------
def test_none_mode_refuses_load_and_unload(local: LocalRuntime, tmp_path: Path) -> None:
    serving = serve(local, write_repo(tmp_path, {"m": {1: MLP.neff}}))
    for call in (lambda: serving.load_model("m"), lambda: serving.unload_model("m")):
        with pytest.raises(ServingError) as caught:
            call()
        assert caught.value.status is Status.UNAVAILABLE
        assert caught.value.message.startswith(
            "explicit model load / unload is not allowed unless the daemon runs with "
            "--model-control-mode explicit"
        )
    assert serving.model_ready("m")
    serving.close()


def test_explicit_mode_loads_what_it_is_told(local: LocalRuntime, tmp_path: Path) -> None:
    root = write_repo(tmp_path, {"a": {1: MLP.neff}, "b": {1: BUCKETS}})
    serving = serve(local, root, control_mode="explicit", load_models=["a"])
    assert index(serving) == [("a", "1", "READY"), ("b", "", "")]
    with pytest.raises(ServingError) as caught:
        serving.infer(InferRequest("b", {"x": np.zeros((1, 4), np.float32)}))
    assert caught.value.status is Status.NOT_FOUND
    assert "it is in the model repository" in caught.value.message
    serving.unload_model("b")  # in the repository, not loaded: nothing to do
    serving.load_model("b")
    assert serving.model_ready("b")
    serving.unload_model("a")
    assert index(serving) == [("a", "", "UNAVAILABLE"), ("b", "1", "READY")]
    assert serving.repository_index()[0].reason == "unloaded"
    with pytest.raises(ServingError) as caught:
        serving.infer(InferRequest("a", MLP.random_inputs()))
    assert caught.value.status is Status.UNAVAILABLE
    with pytest.raises(ServingError) as caught:
        serving.load_model("nothere")
    assert caught.value.status is Status.INTERNAL  # as Triton answers it
    assert caught.value.message.startswith(
        "failed to load 'nothere', failed to poll from model repository: Request for unknown "
        "model: 'nothere' is not found"
    )
    with pytest.raises(ServingError) as caught:
        serving.unload_model("nothere")
    assert caught.value.status is Status.NOT_FOUND
    assert len(local.runtime.models()) == 1
    serving.close()


def test_explicit_load_with_a_config_override(local: LocalRuntime, tmp_path: Path) -> None:
    serving = serve(local, write_repo(tmp_path, {"b": {1: BUCKETS}}), control_mode="explicit")
    config = json.dumps({"max_batch_size": 2, "instance_group": [{"count": 2}]})
    serving.load_model("b", config=config)
    assert serving.model_config("b").max_batch_size == 2
    assert len(local.runtime.models()) == 2
    bad = json.dumps({"input": [{"name": "x", "data_type": "TYPE_INT8"}]})
    with pytest.raises(ServingError) as caught:
        serving.load_model("b", config=bad)
    assert caught.value.status is Status.INVALID_ARGUMENT
    assert caught.value.message == (
        "load failed for model 'b': the config given to load model 'b': input 'x' data_type "
        "TYPE_INT8, but its NEFF (version 1) takes TYPE_FP32"
    )
    assert serving.model_config("b").max_batch_size == 2  # the one loaded before still serves
    with pytest.raises(ServingError) as caught:
        serving.load_model("b", config="{not json")
    assert caught.value.status is Status.INTERNAL  # the model unread, as Triton answers it
    assert caught.value.message.startswith("failed to load 'b', failed to poll from model")
    assert "is not a JSON ModelConfig" in caught.value.message
    serving.close()


def test_explicit_load_with_files(local: LocalRuntime, tmp_path: Path) -> None:
    serving = serve(local, None, control_mode="explicit")
    assert serving.repository_index() == []
    serving.load_model("mine", files={"1/model.neff": MLP.neff, "2/model.neff": MLP2.neff})
    assert index(serving) == [("mine", "2", "READY")]
    x = MLP.random_inputs()
    out = serving.infer(InferRequest("mine", x)).outputs["probs"]
    np.testing.assert_allclose(out, MLP2.reference(x)["probs"], rtol=1e-5)
    for key in ("../1/model.neff", "/etc/passwd", "1/../../x", "", "1//model.neff"):
        with pytest.raises(ServingError) as caught:
            serving.load_model("mine", files={key: MLP.neff})
        assert caught.value.status is Status.INTERNAL, key  # not read, as Triton answers it
        assert "is not a relative path inside the model's directory" in caught.value.message
    assert serving.model_ready("mine")
    serving.unload_model("mine")
    assert local.runtime.models() == []
    serving.close()


def test_file_keys_stay_inside_the_model() -> None:
    assert str(check_file_key("1/model.neff", "m")) == "1/model.neff"
    with pytest.raises(ServingError, match=r"'\.\./x' of the load of model 'm' is not"):
        check_file_key("../x", "m")


def test_poll_mode_picks_up_new_changed_and_removed(local: LocalRuntime, tmp_path: Path) -> None:
    root = write_repo(tmp_path, {"m": {1: MLP.neff}})
    serving = serve(local, root, control_mode="poll", poll_s=3600)
    with pytest.raises(ServingError) as caught:
        serving.load_model("m")
    assert caught.value.status is Status.UNAVAILABLE
    first = local.runtime.models()
    write_repo(root, {"m": {2: MLP2.neff}, "n": {1: MLP.neff}})
    serving.poll_once()
    assert index(serving) == [("m", "2", "READY"), ("n", "1", "READY")]
    assert first[0].id not in {m.id for m in local.runtime.models()}  # version 1 unloaded
    x = MLP.random_inputs()
    np.testing.assert_allclose(
        serving.infer(InferRequest("m", x)).outputs["probs"], MLP2.reference(x)["probs"], rtol=1e-5
    )
    # a changed model file is reloaded: version 2 now holds MLP's weights
    path = root / "m" / "2" / "model.neff"
    path.write_bytes(MLP.neff)
    os.utime(path, ns=(1, 1))
    before = {m.id for m in local.runtime.models()}
    serving.poll_once()
    assert {m.id for m in local.runtime.models()} != before
    np.testing.assert_allclose(
        serving.infer(InferRequest("m", x)).outputs["probs"], MLP.reference(x)["probs"], rtol=1e-5
    )
    unchanged = {m.id for m in local.runtime.models()}
    serving.poll_once()  # nothing changed: nothing reloaded
    assert {m.id for m in local.runtime.models()} == unchanged
    # a changed config.pbtxt is applied; a removed model unloaded
    (root / "m" / "config.pbtxt").write_text("instance_group { count: 2 }")
    for f in (root / "n" / "1" / "model.neff", root / "n" / "1"):
        f.unlink() if f.is_file() else f.rmdir()
    (root / "n").rmdir()
    serving.poll_once()
    assert index(serving) == [("m", "2", "READY"), ("n", "", "UNAVAILABLE")]
    assert len(local.runtime.models()) == 2
    serving.close()


def test_poll_thread_runs(local: LocalRuntime, tmp_path: Path) -> None:
    root = write_repo(tmp_path, {"m": {1: MLP.neff}})
    serving = serve(local, root, control_mode="poll", poll_s=0.05)
    write_repo(root, {"m": {2: MLP.neff}})
    wait_until(lambda: serving.model_ready("m", "2"), 10, "the poll has loaded version 2")
    serving.close()
    assert local.runtime.models() == []


def test_no_repository(local: LocalRuntime) -> None:
    serving = serve(local, None)
    assert serving.repository_index() == []
    assert serving.ready()
    with pytest.raises(ServingError) as caught:
        serving.infer(InferRequest("m", {}))
    assert caught.value.status is Status.NOT_FOUND
    assert caught.value.message.startswith("Request for unknown model: 'm' is not found")
    assert "--model-repository DIR" in caught.value.message
    serving.close()


def test_poll_keeps_serving_when_a_change_breaks_the_model(
    local: LocalRuntime, tmp_path: Path
) -> None:
    root = write_repo(tmp_path, {"m": {1: MLP.neff, 2: MLP.neff}}, m="version_policy { all { } }")
    serving = serve(local, root, control_mode="poll", poll_s=3600)
    (root / "m" / "config.pbtxt").write_text("version_policy { all { } }\nmax_batch_size: 4\n")
    serving.poll_once()  # the new config contradicts the NEFF: versions 1 and 2 still serve
    assert index(serving) == [("m", "1", "READY"), ("m", "2", "READY")]
    (root / "m" / "config.pbtxt").write_text("version_policy { all { } }\n")
    (root / "m" / "2" / "model.neff").unlink()
    (root / "m" / "2").rmdir()
    serving.poll_once()  # a removed version is unloaded
    assert index(serving) == [("m", "1", "READY")]
    assert len(local.runtime.models()) == 1
    serving.close()


def test_explicit_mode_star_loads_all(local: LocalRuntime, tmp_path: Path) -> None:
    root = write_repo(tmp_path, {"a": {1: MLP.neff}, "b": {1: BUCKETS}})
    serving = serve(local, root, control_mode="explicit", load_models=["*"])
    assert index(serving) == [("a", "1", "READY"), ("b", "1", "READY")]
    serving.close()


def test_a_batch_below_the_smallest_bucket_is_refused(local: LocalRuntime, tmp_path: Path) -> None:
    neff = compile_model(linear_model(), dynamic_batch=bucket_ranges(2, 8)).neff
    serving = serve(local, write_repo(tmp_path, {"b": {1: neff}}))
    with pytest.raises(ServingError) as caught:
        serving.infer(InferRequest("b", {"x": np.zeros((1, 4), np.float32)}))
    assert caught.value.message == (
        "input 'x' has batch size 1; model 'b' takes 2..8 (its NEFF's batch buckets)"
    )
    out = serving.infer(InferRequest("b", {"x": np.ones((2, 4), np.float32)})).outputs["y"]
    np.testing.assert_allclose(out, np.ones((2, 4), np.float32) @ W, rtol=1e-5)
    serving.close()
