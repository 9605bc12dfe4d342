"""`DataPath` on its own (`neuron_rtd/runtime/dataplane.py`): an inference's inputs from
bytes or from shared memory, its outputs inline or into shared memory, posted and
collected by wait or poll, a run's error and the NaN outcome answered, and the slot given
back whatever the answer; on a shm table over a temp folder, not /dev/shm."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from answers import as_array, expected
from fake_device import GatedDevice

import driver_sim
from neuron_rtd.errors import BadInput, InvalidHandle, Nerr, NrtError
from neuron_rtd.neff.samples import SampleModel
from neuron_rtd.runtime.api import InferResult, ShmInput
from neuron_rtd.runtime.dataplane import DataPath
from neuron_rtd.runtime.inflight import Inflight
from neuron_rtd.runtime.model import LoadedModel
from neuron_rtd.runtime.shm import ShmTable

MakeModel = Callable[..., LoadedModel]  # the `make_model` fixture
WAIT_S = 30.0  # a bound on what must happen, on a loaded machine: a hang fails the test
READ_WRITE = 3  # PROT_READ | PROT_WRITE


class Plane:
    """The data path under test, its cookie table, and a shm folder of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.shm = ShmTable(root=root)
        self.inflight = Inflight()
        self.data = DataPath(self.shm, self.inflight)

    def shm_object(self, name: str, content: bytes, prot: int = READ_WRITE) -> str:
        """A client's object `name`, mapped by name for clients of no session."""
        (self.root / name).write_bytes(content)
        self.shm.map(f"/{name}", prot)
        return f"/{name}"

    def ended(self, cookie: int) -> None:
        assert self.inflight.peek(cookie).job.wait_done(WAIT_S)

    def close(self) -> None:
        self.inflight.close()
        self.shm.close()


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    made = Plane(tmp_path)
    yield made
    made.close()


def output_of(result: InferResult, sample: SampleModel) -> np.ndarray:
    (value,) = result.outputs.values()
    return as_array(value, sample)


def test_inputs_from_bytes_or_shm_and_outputs_inline_or_to_shm(
    make_model: MakeModel, plane: Plane, mlp: SampleModel
) -> None:
    model = make_model(mlp, ninfer=1)
    x = mlp.random_inputs(1)["x"]
    want = expected(mlp, x)
    inline = plane.data.infer(model, {"x": x.tobytes()}, {}, None)
    assert inline.code == Nerr.OK
    np.testing.assert_allclose(output_of(inline, mlp), want, rtol=1e-5)
    source = plane.shm_object("in", x.tobytes())
    from_shm = plane.data.infer(model, {"x": ShmInput(source)}, {}, None)
    np.testing.assert_array_equal(output_of(from_shm, mlp), output_of(inline, mlp))
    (name,) = (t.name for t in mlp.outputs)
    sink = plane.shm_object("out", bytes(want.nbytes))
    to_shm = plane.data.infer(model, {"x": ShmInput(source)}, {name: sink}, None)
    assert to_shm.outputs == {} and to_shm.code == Nerr.OK  # none inline
    written = np.frombuffer((plane.root / "out").read_bytes(), want.dtype).reshape(want.shape)
    np.testing.assert_array_equal(written, output_of(inline, mlp))
    assert model.in_flight == 0


def test_a_tensor_in_shm_not_mapped_or_not_writable_is_refused_before_a_slot_is_held(
    make_model: MakeModel, plane: Plane, mlp: SampleModel
) -> None:
    model = make_model(mlp, ninfer=1)
    x = mlp.random_inputs(1)["x"].tobytes()
    with pytest.raises(BadInput, match="ifmap 'x': shared memory '/nothing' is not mapped"):
        plane.data.infer(model, {"x": ShmInput("/nothing")}, {}, None)
    (name,) = (t.name for t in mlp.outputs)
    sink = plane.shm_object("read-only", bytes(64), prot=1)
    with pytest.raises(BadInput, match="mapped without PROT_WRITE"):
        plane.data.infer(model, {"x": x}, {name: sink}, None)
    assert model.in_flight == 0


def test_post_then_poll_then_wait(
    make_model: MakeModel, plane: Plane, gated: GatedDevice, mlp: SampleModel
) -> None:
    """A posted inference: poll answers None and keeps the cookie until it has ended,
    then answers it once; completed names it only once it has ended."""
    model = make_model(mlp, ninfer=2)
    x = mlp.random_inputs(2)["x"]
    gated.hold()
    cookie = plane.data.post(model, {"x": x.tobytes()}, {}, None)
    gated.wait_begun(1)
    assert plane.data.poll(cookie, {}, None) is None
    assert plane.data.completed([cookie]) == []
    gated.open()
    plane.ended(cookie)
    assert plane.data.completed([cookie]) == [cookie]
    answer = plane.data.poll(cookie, {}, None)
    assert answer is not None and answer.code == Nerr.OK
    np.testing.assert_allclose(output_of(answer, mlp), expected(mlp, x), rtol=1e-5)
    for spent in (plane.data.poll, plane.data.wait):
        with pytest.raises(InvalidHandle, match=f"cookie {cookie}"):
            spent(cookie, {}, None)
    assert model.in_flight == 0


def test_a_waits_outputs_go_where_the_wait_or_else_the_post_names(
    make_model: MakeModel, plane: Plane, mlp: SampleModel
) -> None:
    model = make_model(mlp, ninfer=2)
    x = mlp.random_inputs(3)["x"]
    want = expected(mlp, x)
    (name,) = (t.name for t in mlp.outputs)
    posted_to = plane.shm_object("posted", bytes(want.nbytes))
    waited_to = plane.shm_object("waited", bytes(want.nbytes))
    first = plane.data.post(model, {"x": x.tobytes()}, {name: posted_to}, None)
    second = plane.data.post(model, {"x": x.tobytes()}, {name: posted_to}, None)
    assert plane.data.wait(first, {}, None).outputs == {}
    assert plane.data.wait(second, {name: waited_to}, None).outputs == {}
    for each in ("posted", "waited"):
        got = np.frombuffer((plane.root / each).read_bytes(), want.dtype).reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert model.in_flight == 0


def test_a_wait_naming_unmapped_shm_spends_the_cookie_and_gives_the_slot_back(
    make_model: MakeModel, plane: Plane, mlp: SampleModel
) -> None:
    model = make_model(mlp, ninfer=1)
    (name,) = (t.name for t in mlp.outputs)
    cookie = plane.data.post(model, {"x": mlp.random_inputs(1)["x"].tobytes()}, {}, None)
    with pytest.raises(BadInput, match=f"shm_ofmap '{name}': shared memory '/gone'"):
        plane.data.wait(cookie, {name: "/gone"}, None)
    assert model.in_flight == 0
    with pytest.raises(InvalidHandle):
        plane.data.wait(cookie, {}, None)


def test_a_failing_run_and_a_nan_are_answered_and_give_the_slot_back(
    make_model: MakeModel, plane: Plane, gated: GatedDevice, mlp: SampleModel
) -> None:
    model = make_model(mlp, ninfer=1)
    gated.failing = driver_sim.DriverError("NC 0: DMA descriptor refused")
    x = mlp.random_inputs(1)["x"].tobytes()
    with pytest.raises(NrtError, match="DMA descriptor refused"):
        plane.data.infer(model, {"x": x}, {}, None)
    assert model.in_flight == 0
    cookie = plane.data.post(model, {"x": x}, {}, None)
    with pytest.raises(NrtError, match="DMA descriptor refused"):
        plane.data.wait(cookie, {}, None)
    assert model.in_flight == 0
    gated.failing = None
    nan = np.full((1, 8), np.nan, np.float32).tobytes()
    answer = plane.data.infer(model, {"x": nan}, {}, None)
    assert answer.code == Nerr.INFER_COMPLETED_WITH_NUM_ERR
    assert np.isnan(output_of(answer, mlp)).all()
    posted = plane.data.wait(plane.data.post(model, {"x": nan}, {}, None), {}, None)
    assert posted.code == Nerr.INFER_COMPLETED_WITH_NUM_ERR
    assert model.in_flight == 0
