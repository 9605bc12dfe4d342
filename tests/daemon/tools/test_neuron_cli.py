"""`neuron-cli` against the real daemon, run as a user runs it (a process of its own):
each command's effect seen through the wire (list_egs, the ext snapshot), its output as
text and as JSON, what it makes outliving it, inferences inline and through shared memory
equal to what the model computes, and every failure as one line with exit code 1 (2 for
usage errors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from onnx import TensorProto, helper
from test_client import daemon_shm

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.neff import read_neff
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.proto import ext_pb, ext_pb_grpc, pb
from neuron_rtd.tools.control.infer import summary, summary_line

pytestmark = pytest.mark.daemon


@pytest.fixture(scope="module")
def daemon(module_work: Path) -> Iterator[DaemonProcess]:
    """The module's daemon; it reads NEFF files (`neff_file`) only under `allowed/`, so a
    test tells a load by path from a streamed one."""
    (module_work / "allowed").mkdir()
    config = module_work / "neuron-rtd.json"
    config.write_text(json.dumps({"neff_file_dirs": [str(module_work / "allowed")]}))
    with DaemonProcess(sim_root=module_work / "sim", args=["-c", str(config)]) as proc:
        yield proc


@pytest.fixture(scope="module")
def sample() -> SampleModel:
    return build_mlp((64, 128, 32), batch=4, seed=3)


@pytest.fixture(scope="module")
def neff(sample: SampleModel, module_work: Path) -> Path:
    """The sample model's NEFF, in a folder the daemon does not read files from."""
    path = module_work / "mlp.neff"
    path.write_bytes(sample.neff)
    return path


def neuron_cli(address: str | None, *args: str | Path | int) -> subprocess.CompletedProcess[str]:
    """The installed `neuron-cli` (or the module), the daemon's address in the environment
    as NEURON_RTD_ADDRESS (None: not set)."""
    script = Path(sys.executable).parent / "neuron-cli"
    command = (
        [str(script)] if script.exists() else [sys.executable, "-m", "neuron_rtd.cli.neuron_cli"]
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NEURON_RTD_ADDRESS", "NEURONCORE_GROUP_SIZES")
    }
    if address is not None:
        env["NEURON_RTD_ADDRESS"] = address
    return subprocess.run(
        [*command, *map(str, args)], env=env, capture_output=True, text=True, timeout=120
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    return done.stdout


def ok_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(done))


def failed(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one line a failed command writes (no traceback, nothing on stdout)."""
    assert done.returncode == code, done.stdout + done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    if code == 1:
        assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr.strip()


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy's stub: a bool keyword


def snapshot(channel: grpc.Channel) -> Any:
    return ext_pb_grpc.nmgr_extStub(channel).snapshot(ext_pb.snapshot_request())


def models(channel: grpc.Channel) -> dict[int, Any]:
    return {m.id: m for m in snapshot(channel).models}


def ncgs(stub: Any) -> dict[int, Any]:
    return {e.eg.id: e for e in stub.list_egs(pb.empty()).eg_info}


# --- models and NCGs ----------------------------------------------------------------


def test_load_list_unload_and_what_it_makes_outlives_it(
    daemon: DaemonProcess, stub: Any, channel: grpc.Channel, neff: Path
) -> None:
    cli = daemon.address
    loaded = ok_json(neuron_cli(cli, "load", neff, "--json"))
    model_id, ncg_id = loaded["model_id"], loaded["ncg_id"]
    assert loaded["state"] == "READY" and loaded["neff"] == str(neff)
    # the command has exited: the model and its implicit NCG are still there, sessionless
    model = models(channel)[model_id]
    assert (model.state, model.ncg_id, model.session, model.name) == ("READY", ncg_id, "", "mlp")
    (group,) = snapshot(channel).ncgs
    assert (group.id, group.implicit, group.session) == (ncg_id, True, "")

    assert ok(neuron_cli(cli, "list-model")) == f"Found 1 model\n{model_id} READY {ncg_id} mlp\n"
    elsewhere = "unix:/nonexistent.sock"  # -a, before or after the command, wins over the env
    assert ok(neuron_cli(elsewhere, "list-model", "-a", cli)).startswith("Found 1 model\n")
    assert ok(neuron_cli(elsewhere, "-a", cli, "list-model")).startswith("Found 1 model\n")
    (listed,) = ok_json(neuron_cli(cli, "list-model", "--json"))
    assert listed["model_id"] == model_id and listed["nc_count"] == 1
    assert listed["inputs"] == [{"name": "x", "dtype": "float32", "shape": [4, 64]}]
    assert listed["outputs"] == [{"name": "probs", "dtype": "float32", "shape": [4, 32]}]

    table = ok(neuron_cli(cli, "list-ncg")).splitlines()
    assert table[0] == "Device 4 NC count 16"
    assert table[2] == "| NCG ID | NC COUNT | DEVICE START INDEX | NC START INDEX |"
    info = ncgs(stub)[ncg_id]
    row = f"| {ncg_id:6} | {1:8} | {info.mla_start_index:18} | {info.nc_start_index:14} |"
    assert table[4:] == [row, table[1]]
    listed_ncgs = ok_json(neuron_cli(cli, "list-ncg", "--json"))
    assert (listed_ncgs["device_count"], listed_ncgs["nc_count"]) == (4, 16)
    assert listed_ncgs["ncgs"] == [
        {
            "ncg_id": ncg_id,
            "nc_count": 1,
            "device_start_index": info.mla_start_index,
            "nc_start_index": info.nc_start_index,
            "vnc_start_index": info.vnc_start_index,
        }
    ]

    assert ok(neuron_cli(cli, "unload", model_id)) == f"Unloaded model {model_id}\n"
    assert models(channel) == {} and ncgs(stub) == {}  # the implicit NCG went with it
    assert ok(neuron_cli(cli, "list-model")) == "Found 0 models\n"
    assert ok(neuron_cli(cli, "list-ncg")).splitlines() == [*table[:4], table[1]]


def test_explicit_ncg_models_load_stopped_and_start_and_stop(
    daemon: DaemonProcess, stub: Any, channel: grpc.Channel, neff: Path
) -> None:
    cli = daemon.address
    made = ok_json(neuron_cli(cli, "create-ncg", "2", "--json"))
    ncg_id = made["ncg_id"]
    assert made["nc_count"] == 2 and ncgs(stub)[ncg_id].nc_count == 2
    (group,) = snapshot(channel).ncgs
    assert (group.implicit, group.session) == (False, "")

    first = neuron_cli(cli, "load", neff, "--ncg-id", ncg_id)
    first_id = int(ok(first).split()[2])
    assert ok(first) == (
        f"Loaded model {first_id} (mlp) on NCG {ncg_id}: STANDBY (stopped, as models on an "
        f"explicit NCG load: neuron-cli start {first_id})\n"
    )
    second_id = ok_json(neuron_cli(cli, "load", neff, "--ncg-id", ncg_id, "--json"))["model_id"]
    assert {m: s.state for m, s in models(channel).items()} == {
        first_id: "STANDBY",
        second_id: "STANDBY",
    }

    assert ok(neuron_cli(cli, "start", first_id)) == f"Started model {first_id}: READY\n"
    started = ok_json(neuron_cli(cli, "start", second_id, "--json"))
    assert started["model_id"] == second_id and started["state"] == "READY"
    assert {m: s.state for m, s in models(channel).items()} == {
        first_id: "STANDBY",
        second_id: "READY",
    }
    assert ok(neuron_cli(cli, "list-model")).splitlines()[1:] == [
        f"{first_id} STANDBY {ncg_id} mlp",
        f"{second_id} READY {ncg_id} mlp",
    ]
    assert ok(neuron_cli(cli, "stop", second_id)) == f"Stopped model {second_id}: STANDBY\n"
    assert models(channel)[second_id].state == "STANDBY"

    busy = failed(neuron_cli(cli, "destroy-ncg", ncg_id))
    assert busy.startswith(f"neuron-cli: NCG {ncg_id} still holds model(s)")
    assert busy.endswith("unload them first (NERR_FAIL)")
    for model_id in (first_id, second_id):
        ok(neuron_cli(cli, "unload", model_id))
    assert list(ncgs(stub)) == [ncg_id]  # an explicit NCG stays when its models go
    assert ok(neuron_cli(cli, "destroy-ncg", ncg_id)) == f"Destroyed NCG {ncg_id}\n"
    assert ncgs(stub) == {}


def test_ncg_id_0_makes_the_ncg_and_direct_file_load_sends_the_path(
    daemon: DaemonProcess,
    stub: Any,
    channel: grpc.Channel,
    neff: Path,
    module_work: Path,
) -> None:
    cli = daemon.address
    inside = module_work / "allowed" / "mlp.neff"
    inside.write_bytes(neff.read_bytes())
    args = ("--ncg-id", "0", "--enable-direct-file-load", "--ninfer", "2", "--timeout", "5")
    loaded = neuron_cli(cli, "load", inside, *args)
    model_id = int(ok(loaded).split()[2])
    model = models(channel)[model_id]
    (group,) = snapshot(channel).ncgs
    assert ok(loaded) == (
        f"Loaded model {model_id} (mlp) on NCG {group.id}: READY (neuron-cli made this NCG for "
        f"it; it stays after the model is unloaded: neuron-cli destroy-ncg {group.id})\n"
    )
    assert (model.state, model.ninfer, model.timeout_s) == ("READY", 2, 5.0)
    assert (group.implicit, group.nc_count) == (False, read_neff(neff.read_bytes()).nc_count)

    # the daemon reads files only under allowed/: a path elsewhere is refused, the same
    # NEFF streamed from there loads
    refused = failed(neuron_cli(cli, "load", neff, "--enable-direct-file-load"))
    assert "is outside the folders this daemon loads NEFF files from" in refused
    assert refused.endswith(  # the hint for the path; the NEFF itself is fine
        "(NERR_INVALID): put it in one of the daemon's neff_file_dirs, or stream it (load it "
        "without --enable-direct-file-load)"
    )
    assert "whole?" not in refused
    truncated = module_work / "allowed" / "truncated.neff"  # read by the daemon: malformed
    truncated.write_bytes(neff.read_bytes()[:3000])
    malformed = failed(neuron_cli(cli, "load", truncated, "--enable-direct-file-load"))
    assert malformed.endswith(
        "(NERR_INVALID): is it a NEFF neuron-cc compiled, whole? (neuron-cc compiles one from ONNX)"
    )
    streamed = ok_json(neuron_cli(cli, "load", neff, "--json"))
    assert streamed["direct_file_load"] is False and streamed["state"] == "READY"

    ok(neuron_cli(cli, "unload", model_id))
    assert group.id in ncgs(stub)  # neuron-cli's NCG stays
    ok(neuron_cli(cli, "destroy-ncg", group.id))


def test_reset_unloads_every_model_and_destroys_every_ncg(
    daemon: DaemonProcess, stub: Any, channel: grpc.Channel, neff: Path
) -> None:
    cli = daemon.address
    ncg_id = ok_json(neuron_cli(cli, "create-ncg", "1", "--json"))["ncg_id"]
    standby = ok_json(neuron_cli(cli, "load", neff, "--ncg-id", ncg_id, "--json"))["model_id"]
    loaded = ok_json(neuron_cli(cli, "load", neff, "--json"))
    ready, implicit = loaded["model_id"], loaded["ncg_id"]

    assert ok(neuron_cli(cli, "reset")).splitlines() == [
        "Found 2 models and 2 NCGs.",
        f"Unloading {standby} (STANDBY) :: success",
        f"Unloading {ready} (READY) :: success",
        f"Destroying NCG {min(ncg_id, implicit)} :: success",
        f"Destroying NCG {max(ncg_id, implicit)} :: success",
    ]
    assert models(channel) == {} and ncgs(stub) == {}
    assert ok_json(neuron_cli(cli, "reset", "--json")) == {
        "unloaded_models": [],
        "destroyed_ncgs": [],
    }


# --- inference ----------------------------------------------------------------------


def test_infer_inline_and_through_shm_answers_what_the_model_computes(
    daemon: DaemonProcess,
    stub: Any,
    channel: grpc.Channel,
    sample: SampleModel,
    neff: Path,
    work: Path,
) -> None:
    cli = daemon.address
    model_id = ok_json(neuron_cli(cli, "load", neff, "--json"))["model_id"]
    inputs = sample.random_inputs(seed=5)
    expected = sample.reference(inputs)["probs"]
    save_npz(work / "in.npz", inputs)

    for transport in ((), ("--shm",)):
        out = work / f"out{len(transport)}.npz"
        done = neuron_cli(
            cli, "infer", model_id, "--inputs", work / "in.npz", "--outputs", out, *transport
        )
        how = "through shared memory" if transport else "inline"
        assert ok(done) == (
            f"model {model_id} (mlp), tensors {how}: wrote probs float32 (4, 32) to {out}\n"
        )
        with np.load(out) as answer:
            assert answer.files == ["probs"]
            assert answer["probs"].dtype == np.float32 and answer["probs"].shape == (4, 32)
            np.testing.assert_allclose(answer["probs"], expected, rtol=1e-5, atol=1e-6)

    text = ok(neuron_cli(cli, "infer", model_id, "--inputs", work / "in.npz")).splitlines()
    assert text[0] == f"model {model_id} (mlp), tensors inline:"
    assert text[1].startswith(f"probs: float32 (4, 32)  min {expected.min():.6g}  max ")
    assert text[2].startswith(f"  [{expected.flat[0]:.6g}, ") and text[2].endswith(", ...]")

    doc = ok_json(
        neuron_cli(cli, "infer", model_id, "--inputs", work / "in.npz", "--shm", "--json")
    )
    assert (doc["model_id"], doc["transport"], doc["file"]) == (model_id, "shm", None)
    (probs,) = doc["outputs"]
    assert (probs["name"], probs["dtype"], probs["shape"]) == ("probs", "float32", [4, 32])
    np.testing.assert_allclose(probs["first"], expected.reshape(-1)[:6], rtol=1e-5, atol=1e-6)
    assert probs["mean"] == pytest.approx(float(expected.mean()), rel=1e-5)
    assert models(channel)[model_id].tally.completed == 4
    # each --shm command unmapped what it mapped
    assert daemon_shm(daemon.pid, "aws_neuron_runtime_") == set()


def test_infer_names_what_does_not_fit_before_sending(
    daemon: DaemonProcess, stub: Any, channel: grpc.Channel, neff: Path, work: Path
) -> None:
    cli = daemon.address
    model_id = ok_json(neuron_cli(cli, "load", neff, "--json"))["model_id"]
    takes = f"model {model_id} takes x: float32 (4, 64)"

    def infer(**arrays: np.ndarray) -> str:
        save_npz(work / "in.npz", arrays)
        return failed(neuron_cli(cli, "infer", model_id, "--inputs", work / "in.npz"), code=2)

    x = np.zeros((4, 64), np.float32)
    assert infer(y=x) == (
        f"neuron-cli: {work}/in.npz has no array named 'x'; {work}/in.npz has arrays the "
        f"model does not take: 'y'; {takes}"
    )
    assert infer(x=np.full((4, 64), 0.1)) == (  # float64 values float32 does not hold
        f"neuron-cli: {work}/in.npz: input 'x' is float64, the model takes float32, which "
        "cannot hold its values (0.1 would become 0.10000000149011612): convert them "
        "(.astype('float32')) or pass --cast for numpy's unsafe cast (precision lost, "
        f"out-of-range values become inf or wrap); {takes}"
    )
    assert infer(x=x[:2]) == (  # the shape expected stated once
        f"neuron-cli: {work}/in.npz: input 'x' has shape (2, 64); the model takes float32 "
        "(4, 64): give it an array of that shape"
    )
    missing = failed(neuron_cli(cli, "infer", model_id, "--inputs", work / "none.npz"), code=2)
    assert missing == f"neuron-cli: {work}/none.npz: no such file"
    not_npz = failed(neuron_cli(cli, "infer", model_id, "--inputs", neff), code=2)
    assert not_npz == f"neuron-cli: {neff}: not an npz file (numpy.savez writes one)"
    assert models(channel)[model_id].tally.incorrect_input == 0  # nothing was sent

    np.savez(work / "in.npz", x=x)
    unknown = failed(neuron_cli(cli, "infer", "10999", "--inputs", work / "in.npz"))
    assert unknown == (
        "neuron-cli: no model 10999 is loaded on the daemon (NERR_INVALID_HANDLE): "
        "see neuron-cli list-model"
    )
    ok(neuron_cli(cli, "stop", model_id))
    stopped = failed(neuron_cli(cli, "infer", model_id, "--inputs", work / "in.npz"))
    assert stopped == (
        f"neuron-cli: model {model_id} (mlp) is not running (state STANDBY): start it first "
        "(NERR_FAIL)"
    )


def test_infer_on_a_model_with_a_varying_axis(daemon: DaemonProcess, stub: Any, work: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn", [x], [y])
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (work / "dyn.neff").write_bytes(
        compile_model(onnx_model, dynamic_batch=bucket_ranges(1, 4)).neff
    )
    cli = daemon.address
    loaded = ok_json(neuron_cli(cli, "load", work / "dyn.neff", "--json"))
    assert loaded["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 4]}]
    assert loaded["outputs"] == [{"name": "y", "dtype": "float32", "shape": [-1, 4]}]

    batch = np.random.default_rng(9).standard_normal((3, 4)).astype(np.float32)
    save_npz(work / "in.npz", {"x": batch})
    for transport in ((), ("--shm",)):
        args = ("--inputs", work / "in.npz", "--outputs", work / "out.npz", *transport)
        ok(neuron_cli(cli, "infer", loaded["model_id"], *args))
        with np.load(work / "out.npz") as answer:
            np.testing.assert_array_equal(answer["y"], np.maximum(batch, 0))
    save_npz(work / "in.npz", {"x": batch[:, :3]})
    wrong = failed(
        neuron_cli(cli, "infer", loaded["model_id"], "--inputs", work / "in.npz"), code=2
    )
    assert wrong == (
        f"neuron-cli: {work}/in.npz: input 'x' has shape (3, 3); the model takes float32 "
        "(?, 4): give it an array of that shape"
    )


def test_an_output_summary_stays_strict_json_with_nan_and_inf() -> None:
    y = np.array([[1.0, np.nan, np.inf, -2.0]], np.float32)
    doc = summary("y", y)
    assert json.loads(json.dumps(doc, allow_nan=False)) == {
        "name": "y",
        "dtype": "float32",
        "shape": [1, 4],
        "first": [1.0, None, None, -2.0],
        "min": -2.0,
        "max": 1.0,
        "mean": -0.5,
        "nonfinite": 2,
    }
    assert (
        summary_line("y", y)
        == "y: float32 (1, 4)  min -2  max 1  mean -0.5  (2 NaN or infinite)\n  [1, nan, inf, -2]"
    )
    assert summary_line("b", np.array([True, False])) == "b: bool (2,)\n  [True, False]"


# --- failures -----------------------------------------------------------------------


def test_daemon_errors_name_the_nerr_code_and_what_to_do(
    daemon: DaemonProcess, stub: Any, neff: Path, work: Path
) -> None:
    cli = daemon.address
    for command in ("start", "stop", "unload"):
        assert failed(neuron_cli(cli, command, "10999")) == (
            "neuron-cli: model 10999 is not loaded (NERR_INVALID_HANDLE): see neuron-cli list-model"
        )
    assert failed(neuron_cli(cli, "destroy-ncg", "99")) == (
        "neuron-cli: NCG 99 does not exist (NERR_INVALID_HANDLE): see neuron-cli list-ncg"
    )
    assert failed(neuron_cli(cli, "load", neff, "--ncg-id", "99")) == (
        "neuron-cli: NCG 99 does not exist (NERR_INVALID_HANDLE): see neuron-cli list-ncg"
    )
    too_big = failed(neuron_cli(cli, "create-ncg", "99"))  # more than the machine has
    assert too_big == (
        "neuron-cli: not enough NeuronCores: 99 contiguous needed, this runtime has 16 "
        "(NERR_RESOURCE_NC): ask for at most 16, all it has (0 takes the largest free run)"
    )
    taken = ok_json(neuron_cli(cli, "create-ncg", "1", "-j"))["ncg_id"]
    busy = failed(neuron_cli(cli, "create-ncg", "16"))  # as many as it has, one taken
    assert "(NERR_RESOURCE_NC): free NeuronCores first (neuron-cli list-ncg" in busy
    ok(neuron_cli(cli, "destroy-ncg", taken))

    bad = work / "bad.neff"
    bad.write_bytes(neff.read_bytes()[:3000])
    truncated = failed(neuron_cli(cli, "load", bad))
    assert truncated.startswith("neuron-cli: NEFF is truncated")
    assert truncated.endswith(
        "(NERR_INVALID): is it a NEFF neuron-cc compiled, whole? (neuron-cc compiles one from ONNX)"
    )
    assert failed(neuron_cli(cli, "load", bad, "--ncg-id", "0")).startswith(
        f"neuron-cli: {bad}: NEFF is truncated"
    )
    assert failed(neuron_cli(cli, "load", work / "none.neff"), code=2) == (
        f"neuron-cli: {work}/none.neff: no such NEFF file"
    )
    assert ncgs(stub) == {}  # --ncg-id 0 made no NCG for a NEFF it could not read


def test_no_daemon_is_one_line_and_exit_1(work: Path) -> None:
    nobody = f"unix:{work}/nobody.sock"
    assert failed(neuron_cli(None, "-a", nobody, "list-model")) == (
        f"neuron-cli: no runtime answers at {nobody}: no socket {work}/nobody.sock, so no "
        f"daemon listens there: start one (systemctl start neuron-rtd, or neuron-rtd -g "
        f"{nobody}), or name another address (-a ADDRESS, or NEURON_RTD_ADDRESS)"
    )


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        ((), "the following arguments are required: command"),
        (("list-models",), "invalid choice: 'list-models'"),
        (("load",), "the following arguments are required: NEFF"),
        (("load", "m.neff", "--ncg-id", "-2"), "-1, 0 or an NCG id, got -2"),
        (("load", "m.neff", "--ninfer", "0"), "expected 1 or more, got 0"),
        (("create-ncg", "two"), "invalid nc_count value: 'two'"),
        (("create-ncg", "-1"), "an NC count is 0 or more, got -1"),
        (("destroy-ncg", "0"), "NCG ids start at 1, got 0"),
        (("start",), "the following arguments are required: ID"),
        (("unload", "x"), "invalid model_id value: 'x'"),
        (("infer", "10001"), "the following arguments are required: --inputs"),
        (("list-ncg", "--bogus"), "unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...], complaint: str) -> None:
    message = failed(neuron_cli("unix:/nonexistent.sock", *args), code=2)
    assert message.startswith("usage: neuron-cli") and complaint in message


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("list-ncg", ["--json"]),
        ("list-model", ["--json"]),
        ("create-ncg", ["N"]),
        ("destroy-ncg", ["ID"]),
        ("load", ["--ncg-id", "--enable-direct-file-load", "--ninfer", "--timeout"]),
        ("start", ["ID"]),
        ("stop", ["ID"]),
        ("unload", ["ID"]),
        ("reset", ["--json"]),
        ("infer", ["--inputs", "--outputs", "--shm"]),
    ],
)
def test_help_lists_each_commands_options(command: str, options: list[str]) -> None:
    text = ok(neuron_cli(None, command, "--help"))
    assert text.startswith(f"usage: neuron-cli {command}")
    for option in [*options, "-a ADDRESS, --address ADDRESS", "--json"]:
        assert option in text
