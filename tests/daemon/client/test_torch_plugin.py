"""The PyTorch plugin (`neuron_rtd.torch`) against the real daemon: traced modules answer
what eager PyTorch answers, in the module's own structure; saved and loaded in another
process; a dynamic batch; DataParallel over four NCGs; a daemon restart between calls; and
the failures a PyTorch user meets (a wrong input, an operator the exporter or the NC
lacks, no daemon)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

import neuron_rtd.torch as neuron
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client.observe import Watch

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning"),
]

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module", autouse=True)
def _env(daemon: DaemonProcess) -> Iterator[None]:
    """Every test talks to the module's daemon, with no groups unless it sets some."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NEURON_RTD_ADDRESS", daemon.address)
        for name in ("NEURONCORE_GROUP_SIZES", "NEURON_RT_VISIBLE_CORES", "NEURON_RTD_SHM_MAP"):
            patch.delenv(name, raising=False)
        yield


def same(got: Any, want: Any, atol: float = ATOL) -> None:
    """`got` has `want`'s structure, and its tensors `want`'s values."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=RTOL, atol=atol)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            same(got[key], want[key], atol)
    else:
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            same(g, w, atol)


def eager(module: Any, *args: Any) -> Any:
    with torch.no_grad():
        return module(*args)


def models_on(address: str) -> list[Any]:
    with Watch(address) as watch:
        return list(watch.snapshot().models)


# --- modules ------------------------------------------------------------------------
class ResidualCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.body = nn.Sequential(
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 1)
        )
        self.head = nn.Linear(8, 5)

    def forward(self, x: Any) -> Any:
        y = self.stem(x)
        y = torch.relu(y + self.body(y))
        return self.head(y.mean((2, 3)))


def residual_cnn() -> ResidualCNN:
    torch.manual_seed(0)
    module = ResidualCNN()
    with torch.no_grad():  # running statistics worth folding
        module(torch.randn(4, 3, 12, 12))
    return module.eval()


class TwoInOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 4)
        self.b = nn.Linear(3, 4)

    def forward(self, x: Any, y: Any) -> Any:
        s = self.a(x) + self.b(y)
        return s, torch.sigmoid(s) * 2


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 3)

    def forward(self, x: Any) -> Any:
        logits = self.lin(x)
        return {"logits": logits, "probs": torch.softmax(logits, -1)}


class Positives(nn.Module):
    """torch.nonzero exports as ONNX NonZero, which the NC lacks (its output's size
    depends on the values): a CPU node."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.find = Find()

    def forward(self, x: Any) -> Any:
        y = self.lin(x)
        return y * 2, self.find(y)


class Find(nn.Module):
    def forward(self, x: Any) -> Any:
        return torch.nonzero(x > 0)


class KthValue(nn.Module):
    """torch.kthvalue: the exporter has no ONNX for it."""

    def forward(self, x: Any) -> Any:
        return torch.kthvalue(x, 2, 1)[0]


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.picks = nn.Sequential(nn.ReLU(), KthValue())

    def forward(self, x: Any) -> Any:
        return self.picks(self.pre(x))


# --- outputs equal eager PyTorch ------------------------------------------------------------
def test_a_residual_cnn_with_batch_norm_answers_as_eager(daemon: DaemonProcess) -> None:
    module = residual_cnn()
    x = torch.randn(2, 3, 12, 12)
    traced = neuron.trace(module, x)
    assert isinstance(traced, nn.Module) and not models_on(daemon.address)  # loaded lazily
    same(traced(x), eager(module, x))
    same(traced(x + 1), eager(module, x + 1))
    (model,) = models_on(daemon.address)
    assert model.name == "ResidualCNN"
    del traced
    gc.collect()
    assert not models_on(daemon.address)  # unloaded when deleted


def test_a_transformer_encoder_answers_as_eager() -> None:
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    module = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 16)
    same(neuron.trace(module, x)(x), eager(module, x))


def test_an_lstm_answers_its_output_and_its_state_tuple() -> None:
    torch.manual_seed(2)
    module = nn.LSTM(8, 12, num_layers=2, batch_first=True).eval()
    x = torch.randn(3, 6, 8)
    got = neuron.trace(module, x)(x)
    want = eager(module, x)
    assert isinstance(got, tuple) and isinstance(got[1], tuple)  # (output, (h, c))
    same(got, want)


def test_two_inputs_and_a_tuple_output() -> None:
    torch.manual_seed(3)
    module = TwoInOut().eval()
    x, y = torch.randn(2, 6), torch.randn(2, 3)
    traced = neuron.trace(module, (x, y))
    same(traced(x, y), eager(module, x, y))
    x2 = torch.randn(6, 2).t()  # not contiguous: made so, then sent
    same(traced(x2, y), eager(module, x2, y))


def test_a_dict_output() -> None:
    torch.manual_seed(4)
    module = DictOut().eval()
    x = torch.randn(2, 6)
    same(neuron.trace(module, x)(x), eager(module, x))


# --- saved and loaded ----------------------------------------------------------------------
LOAD_AND_RUN = """
import sys, torch
import neuron_rtd.torch
loaded = torch.jit.load(sys.argv[1])
x, y = torch.load(sys.argv[2])
torch.save(loaded(x, y), sys.argv[3])
"""


def test_torch_jit_save_then_load_in_a_new_process(work: Path, daemon: DaemonProcess) -> None:
    torch.manual_seed(5)
    module = TwoInOut().eval()
    x, y = torch.randn(2, 6), torch.randn(2, 3)
    traced = neuron.trace(module, (x, y))
    torch.jit.save(traced, str(work / "traced.pt"))
    torch.save((x, y), work / "inputs.pt")
    env = {**os.environ, "NEURON_RTD_ADDRESS": daemon.address}
    subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD_AND_RUN,
            str(work / "traced.pt"),
            str(work / "inputs.pt"),
            str(work / "outputs.pt"),
        ],
        env=env,
        check=True,
        timeout=120,
    )
    same(torch.load(work / "outputs.pt"), eager(module, x, y))
    assert not models_on(daemon.address)  # the other process's copy went with it


def test_a_loaded_module_without_the_plugin_names_the_operator(work: Path) -> None:
    traced = neuron.trace(DictOut().eval(), torch.randn(2, 6))
    torch.jit.save(traced, str(work / "traced.pt"))
    code = f"import torch; torch.jit.load({str(work / 'traced.pt')!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0 and "neuron::run_neff" in done.stderr


def test_a_module_loaded_in_this_process_runs_and_unloads_when_deleted(
    work: Path, daemon: DaemonProcess
) -> None:
    torch.manual_seed(7)
    module = DictOut().eval()
    x = torch.randn(2, 6)
    torch.jit.save(neuron.trace(module, x), str(work / "dict.pt"))
    gc.collect()
    loaded = torch.jit.load(str(work / "dict.pt"))
    same(loaded(x), eager(module, x))
    same(loaded(x * 2), eager(module, x * 2))
    assert len(models_on(daemon.address)) == 1  # one copy, loaded at the first call
    del loaded
    gc.collect()
    assert not models_on(daemon.address)


def test_neuron_load_gives_the_traced_module_back(work: Path) -> None:
    torch.manual_seed(9)
    module = TwoInOut().eval()
    x, y = torch.randn(2, 6), torch.randn(2, 3)
    torch.jit.save(neuron.trace(module, (x, y)), str(work / "two.pt"))
    loaded = neuron.load(str(work / "two.pt"))
    assert isinstance(loaded, neuron.NeuronModule) and loaded.traced_name == "TwoInOut"
    same(loaded(x, y), eager(module, x, y))
    with pytest.raises(neuron.InputMismatch, match=r"input 0: expected float32 \(2, 6\)"):
        loaded(torch.randn(3, 6), y)
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), str(work / "plain.pt"))
    with pytest.raises(neuron.NeuronTorchError, match=r"load it with torch\.jit\.load"):
        neuron.load(str(work / "plain.pt"))


class MixedDict(nn.Module):
    def forward(self, x: Any) -> Any:
        return {"sum": x.sum(1), "parts": (x * 2, x - 1)}


def test_what_torchscript_cannot_hold_is_saved_with_torch_save(work: Path) -> None:
    module = MixedDict()
    x = torch.randn(2, 3)
    traced = neuron.trace(module, x)
    with pytest.raises(neuron.NeuronTorchError, match=r"save it with torch\.save"):
        torch.jit.save(traced, str(work / "mixed.pt"))
    torch.save(traced, work / "mixed.pt")
    loaded = torch.load(work / "mixed.pt", weights_only=False)
    same(loaded(x), eager(module, x))


# --- dynamic batch -------------------------------------------------------------------------
def test_dynamic_batch_traced_at_one_takes_any_batch(daemon: DaemonProcess) -> None:
    module = residual_cnn()
    traced = neuron.trace(
        module,
        torch.randn(1, 3, 12, 12),
        dynamic_batch_size=True,
        compiler_args=["--dynamic-batch", "1:4"],
    )
    assert traced.package.batch_limit == 4
    for batch in (1, 3, 8, 0):  # 8: two runs of 4, joined; 0: empty, as eager
        x = torch.randn(batch, 3, 12, 12)
        same(traced(x), eager(module, x))
    with pytest.raises(neuron.InputMismatch, match=r"float32 \(N, 3, 12, 12\) for any batch"):
        traced(torch.randn(2, 3, 12, 13))


# --- DataParallel ---------------------------------------------------------------------------
def test_data_parallel_over_four_ncgs(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURONCORE_GROUP_SIZES", "4x1")
    module = residual_cnn()
    traced = neuron.trace(module, torch.randn(1, 3, 12, 12), dynamic_batch_size=True)
    parallel = neuron.DataParallel(traced)
    assert parallel.ncg_sizes == (1, 1, 1, 1)
    x = torch.randn(12, 3, 12, 12)
    same(parallel(x), eager(module, x))
    ncgs = {copy.loaded.model.ncg for copy in parallel.copies if copy.loaded.model}
    assert len(ncgs) == 4  # each copy on a group of its own
    on_daemon = {m.ncg_id for m in models_on(daemon.address)}
    assert ncgs <= on_daemon
    del parallel
    gc.collect()
    assert not models_on(daemon.address)


def test_data_parallel_of_a_fixed_batch_module_runs_it_at_that_batch() -> None:
    torch.manual_seed(8)
    module = TwoInOut().eval()
    traced = neuron.trace(module, (torch.randn(2, 6), torch.randn(2, 3)))
    parallel = neuron.DataParallel(traced, device_ids=[0, 1])
    assert parallel.ncg_sizes == (1, 1)
    x, y = torch.randn(6, 6), torch.randn(6, 3)
    same(parallel(x, y), eager(module, x, y))  # 3 parts of 2 over 2 copies
    with pytest.raises(neuron.InputMismatch, match="give a multiple of 2"):
        parallel(torch.randn(5, 6), torch.randn(5, 3))


# --- a daemon restart -----------------------------------------------------------------------
def test_a_daemon_restart_between_two_calls_loads_again(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    socket_path = work / "restart.sock"
    module = residual_cnn()
    x = torch.randn(1, 3, 12, 12)
    first = DaemonProcess(sim_root=work / "sim", socket_path=socket_path).start()
    try:
        monkeypatch.setenv("NEURON_RTD_ADDRESS", first.address)
        traced = neuron.trace(module, x)
        same(traced(x), eager(module, x))
        before = traced.loaded.model
    finally:
        first.close()
    second = DaemonProcess(sim_root=work / "sim", socket_path=socket_path).start()
    try:
        assert not models_on(second.address)
        same(traced(x), eager(module, x))  # the model loaded again on the new daemon
        assert len(models_on(second.address)) == 1
        assert traced.loaded.model is not before
    finally:
        del traced
        gc.collect()
        second.close()


# --- failures a PyTorch user meets ---------------------------------------------------------------
def test_a_wrong_shape_dtype_or_structure_names_the_expected_one() -> None:
    traced = neuron.trace(TwoInOut().eval(), (torch.randn(2, 6), torch.randn(2, 3)))
    with pytest.raises(neuron.InputMismatch, match=r"input 1: expected float32 \(2, 3\), got"):
        traced(torch.randn(2, 6), torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"input 0: expected float32 \(2, 6\), got float64"):
        traced(torch.randn(2, 6, dtype=torch.float64), torch.randn(2, 3))
    with pytest.raises(neuron.InputMismatch, match=r"traced with arguments \(Tensor, Tensor\)"):
        traced(torch.randn(2, 6))


def test_an_operator_the_exporter_lacks_is_named_with_its_submodule() -> None:
    with pytest.raises(neuron.UnsupportedOperatorError) as caught:
        neuron.trace(Outer(), torch.randn(3, 4))
    assert caught.value.operator == "aten::kthvalue"
    assert caught.value.module_path == "picks.1"
    assert "'picks.1' (KthValue)" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_an_operator_the_nc_lacks_runs_on_a_cpu_node_and_analysis_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.manual_seed(6)
    module = Positives().eval()
    x = torch.randn(3, 4)
    same(neuron.trace(module, x)(x), eager(module, x))
    analysis = neuron.analyze_model(module, x)
    (nonzero,) = analysis.on_cpu
    assert (nonzero.operator, nonzero.module_path) == ("NonZero", "find")
    assert nonzero.reason == "no NC kernel for this op"
    by_op = {use.operator: use for use in analysis.operators}
    assert (by_op["Gemm"].on_nc, by_op["Gemm"].on_cpu) == (1, 0)
    assert (by_op["NonZero"].on_nc, by_op["NonZero"].on_cpu) == (0, 1)
    printed = capsys.readouterr().out
    assert "NonZero" in printed and "no NC kernel for this op (find)" in printed
    assert "4 of 5 operator nodes on the NeuronCores" in printed


def test_no_daemon_is_one_line(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traced = neuron.trace(DictOut().eval(), torch.randn(2, 6))
    monkeypatch.setenv("NEURON_RTD_ADDRESS", f"unix:{work}/nobody.sock")
    with pytest.raises(neuron.RuntimeUnavailable) as caught:
        traced(torch.randn(2, 6))
    message = str(caught.value)
    assert "\n" not in message and "no runtime answers at" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_bad_compiler_args_are_said_before_exporting() -> None:
    with pytest.raises(neuron.CompileFailed, match=r"--auto-cast.*neuron-cc compile --help"):
        neuron.trace(DictOut(), torch.randn(2, 6), compiler_args=["--auto-cast", "sometimes"])
    with pytest.raises(neuron.CompileFailed, match="dynamic_batch_size=True"):
        neuron.trace(DictOut(), torch.randn(2, 6), compiler_args=["--dynamic-batch", "4"])


def test_neuroncore_group_sizes_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_rtd.torch.runtime import ncg_sizes_from_env

    for text, sizes in (("2,2", (2, 2)), ("4x2", (2,) * 4), ("1, 2x3", (1, 3, 3)), ("", ())):
        monkeypatch.setenv("NEURONCORE_GROUP_SIZES", text)
        assert ncg_sizes_from_env() == sizes
    for bad in ("0", "x2", "2x", "a,b", "0x1", "2,,2", "2,"):
        monkeypatch.setenv("NEURONCORE_GROUP_SIZES", bad)
        with pytest.raises(neuron.NeuronTorchError, match="KxN"):
            ncg_sizes_from_env()


def test_the_plugin_is_the_only_importer_of_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        import neuron_rtd.client, neuron_rtd.compiler, neuron_rtd.tools, neuron_rtd.cli.neuron_cli
        assert "torch" not in sys.modules, "torch imported outside neuron_rtd.torch"
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_readme_section_runs_as_written(work: Path) -> None:
    """README's "From PyTorch", pasted into a shell and `python` as the tour is."""
    from test_readme_tour import README, run_as_written, tour_blocks, tour_script

    blocks = tour_blocks(README.read_text(), "## From PyTorch")
    assert [language for language, _ in blocks] == ["sh", "python", "sh"]
    said = run_as_written(tour_script(blocks), work)
    lines = said.splitlines()
    assert "True" in lines and "torch.Size([16, 10])" in lines, said
    assert "Sequential: 5 of 5 operator nodes on the NeuronCores (100.0%), 0 on CPU nodes" in lines
    assert (work / "net.pt").stat().st_size > 0
