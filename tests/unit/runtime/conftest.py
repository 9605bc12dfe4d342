"""What the runtime's unit tests stand on: one simulated device (an inf1.xlarge's, 4 NCs)
whose NCs' runs are gated (`fake_device.GatedDevice`: a test sees each run begin and lets it
through), and models built straight on it by the loader, with no `Runtime`, daemon or gRPC
around them."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_device import GatedDevice

from neuron_rtd.neff import read_neff
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.runtime.driver import open_sim
from neuron_rtd.runtime.loader import build_model
from neuron_rtd.runtime.model import LoadedModel, ModelParams, ModelState
from neuron_rtd.runtime.ncg import NcgTable
from neuron_rtd.runtime.sessions import SessionId


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[GatedDevice]:
    """The device, its runs let through until the test holds them."""
    (device,) = open_sim(tmp_path / "sim", "inf1.xlarge", address="in-process", version="unit")
    device.reset()
    wrapped = GatedDevice(device)
    yield wrapped
    wrapped.open()
    device.release()


@pytest.fixture
def make_model(gated: GatedDevice) -> Iterator[Callable[..., LoadedModel]]:
    """`make_model(sample, ninfer=..., timeout_s=..., session_id=...)`: the sample built on
    an NCG of its own on the gated device, READY; unloaded after the test."""
    ncgs = NcgTable(1, gated.spec.nc_count)
    ids = itertools.count(1)
    made: list[LoadedModel] = []

    def make(
        sample: SampleModel, *, ninfer: int = 2, timeout_s: float = 30.0, session_id: int = 0
    ) -> LoadedModel:
        neff = read_neff(sample.neff)
        model = build_model(
            model_id=next(ids),
            neff=neff,
            ncg=ncgs.create(max(neff.nc_count, 1), session_id=SessionId(session_id)),
            ncgs=ncgs,
            devices=[gated],
            params=ModelParams(timeout_s=timeout_s, ninfer=ninfer),
            session_id=SessionId(session_id),
        )
        model.set_state(ModelState.READY)
        made.append(model)
        return model

    yield make
    gated.open()
    for model in made:
        model.drop_all("the test is over", 10)
        for device, buf in model.dram:
            device.dram_free(buf)


@pytest.fixture(scope="session")
def mlp() -> SampleModel:
    """One NC's model: x (1, 8) float32 -> probs (1, 4)."""
    return build_mlp((8, 16, 4), seed=3)


@pytest.fixture(scope="session")
def two_stage() -> SampleModel:
    """A pipeline of two NCs (node 1 on NC 0, node 2 on NC 1)."""
    return build_mlp((8, 16, 16, 4), neuron_nodes=2, seed=4)
