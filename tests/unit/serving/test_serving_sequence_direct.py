"""The `direct` strategy's lane over a fake execution (which echoes its inputs): slot i is
row i, an idle slot below the highest ready one gets the filler row, a batch of too few
slots waits for more (minimum_slot_utilization) up to its delay, shapes that differ run
apart, and an execution's error reaches every request of it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from waiting import wait_until

from neuron_rtd.errors import Nerr
from neuron_rtd.serving.sequence_direct import DirectLane, Inputs, Share


@dataclass
class Echo:
    """An execution that answers each input as an output of the same name."""

    batches: list[dict[str, np.ndarray]] = field(default_factory=list)
    fail: bool = False

    @property
    def outputs(self) -> Mapping[str, np.ndarray]:
        return self.batches[-1]

    @property
    def code(self) -> Nerr:
        return Nerr.OK

    def __call__(self, copy: int, inputs: Mapping[str, Any]) -> Echo:
        if self.fail:
            raise RuntimeError("the NC failed")
        self.batches.append({name: np.asarray(a) for name, a in inputs.items()})
        return self


def filler(model: Inputs) -> Inputs:
    made = {name: np.zeros_like(array) for name, array in model.items()}
    made["READY"] = np.zeros((1, 1), np.int32)
    return made


def row(x: int, width: int = 1) -> Inputs:
    return {"INPUT": np.full((1, width), x, np.int32), "READY": np.ones((1, 1), np.int32)}


@contextlib.contextmanager
def lane(echo: Echo, slots: int = 4, **options: Any) -> Iterator[DirectLane]:
    settings = {"max_queue_delay_us": 0, "minimum_slot_utilization": 0.0, **options}
    made = DirectLane(
        0,
        slots,
        echo,
        filler,
        batched=True,
        name="t",
        waits=contextlib.nullcontext,
        **settings,
    )
    try:
        yield made
    finally:
        made.close()


def run_in(made: DirectLane, slot: int, inputs: Inputs) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(made.run(slot, inputs))
        except BaseException as error:
            got.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


def test_each_slot_is_its_row_and_an_idle_one_a_filler() -> None:
    echo = Echo()
    with lane(echo, minimum_slot_utilization=0.5, max_queue_delay_us=60_000_000) as made:
        first, got0 = run_in(made, 0, row(10))
        second, got2 = run_in(made, 2, row(12))  # 2 of 4 slots: the batch may run
        first.join()
        second.join()
    (batch,) = echo.batches
    assert batch["INPUT"].reshape(-1).tolist() == [10, 0, 12]  # slot 1: the filler
    assert batch["READY"].reshape(-1).tolist() == [1, 0, 1]
    share0, share2 = got0[0], got2[0]
    assert isinstance(share0, Share) and isinstance(share2, Share)
    assert share0.outputs["INPUT"].tolist() == [[10]]
    assert share2.outputs["INPUT"].tolist() == [[12]]


def test_a_thin_batch_waits_for_more_slots() -> None:
    echo = Echo()
    with lane(echo, slots=2, minimum_slot_utilization=1.0, max_queue_delay_us=60_000_000) as made:
        first, got = run_in(made, 1, row(1))
        wait_until(lambda: made._ready[1] is not None, 10, "slot 1 ready")
        assert echo.batches == [] and got == []  # half the slots: it waits (a minute)
        second, _ = run_in(made, 0, row(0))
        first.join()
        second.join()
    assert [b["INPUT"].reshape(-1).tolist() for b in echo.batches] == [[0, 1]]


def test_different_shapes_run_apart_and_errors_reach_every_request() -> None:
    echo = Echo()
    with lane(echo, slots=2, minimum_slot_utilization=1.0, max_queue_delay_us=200_000) as made:
        first, _ = run_in(made, 0, row(1, width=2))
        second, _ = run_in(made, 1, row(2, width=3))
        first.join()
        second.join()
    widths = sorted(b["INPUT"].shape[1] for b in echo.batches)
    assert widths == [2, 3]  # never one execution of both
    failing = Echo(fail=True)
    with lane(failing, slots=2) as made:
        thread, got = run_in(made, 1, row(5))
        thread.join()
    (error,) = got
    assert isinstance(error, RuntimeError) and "the NC failed" in str(error)


@pytest.mark.parametrize("slot", [0, 3])
def test_close_fails_a_request_waiting_for_its_batch(slot: int) -> None:
    echo = Echo()
    with lane(echo, minimum_slot_utilization=1.0, max_queue_delay_us=60_000_000) as made:
        thread, got = run_in(made, slot, row(7))
        wait_until(lambda: made._ready[slot] is not None, 10, "the slot ready")
    thread.join()
    (error,) = got
    assert "being unloaded" in str(error)
