"""One exception tree: every runtime exception maps to an nerr value of the wire API, and
the client's errors are the runtime's classes too (`neuron_rtd.errors.for_code`), so one
`except` clause catches one failure from `Client` and from `LocalRuntime` alike."""

from __future__ import annotations

import pickle

import grpc
import numpy as np
import pytest

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client, DaemonStopping, NrtClientError, NrtConnectionError
from neuron_rtd.errors import (
    BadInput,
    InferTimeout,
    InvalidHandle,
    Nerr,
    NrtError,
    Stopping,
    all_error_classes,
    for_code,
)
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import pb
from neuron_rtd.runtime import LocalRuntime


def test_nerr_matches_the_wire_enum() -> None:
    wire = {v.name: v.number for v in pb.DESCRIPTOR.enum_types_by_name["nerr"].values}
    assert {f"NERR_{e.name}": e.value for e in Nerr} == wire


def test_every_exception_has_a_wire_code() -> None:
    wire = {v.number for v in pb.DESCRIPTOR.enum_types_by_name["nerr"].values}
    classes = all_error_classes()
    assert len(classes) > 10
    for cls in classes:
        assert issubclass(cls, NrtError)
        assert cls.code in wire, cls
        assert cls.code != Nerr.OK, cls
        assert str(cls("what went wrong")) == "what went wrong"


@pytest.mark.parametrize("code", [c for c in Nerr if c != Nerr.OK], ids=lambda c: c.name)
def test_a_daemon_answer_is_the_runtime_class_of_its_code(code: Nerr) -> None:
    error = NrtClientError(code, "what went wrong", "infer")
    assert isinstance(error, NrtClientError) and isinstance(error, for_code(code))
    assert error.code == code and error.nerr == code
    assert str(error) == f"infer: NERR_{code.name}: what went wrong"
    again = pickle.loads(pickle.dumps(error))  # as a Ray task's error crosses processes
    assert type(again) is type(error) and str(again) == str(error)


def test_a_code_the_wire_does_not_define_is_kept() -> None:
    error = NrtClientError(4321, "from a newer daemon", "load")
    assert type(error) is NrtClientError and error.nerr is None and error.wire_code == 4321
    assert str(error) == "load: nerr 4321: from a newer daemon"


def test_transport_failures_are_the_runtime_s_timeout_and_stopping() -> None:
    late = NrtConnectionError("infer", "unix:/x", grpc.StatusCode.DEADLINE_EXCEEDED, "late")
    assert isinstance(late, InferTimeout) and late.code == Nerr.TIMEOUT
    gone = NrtConnectionError("infer", "unix:/x", grpc.StatusCode.UNAVAILABLE, "gone")
    assert not isinstance(gone, InferTimeout) and gone.code == Nerr.FAIL
    stopping = DaemonStopping("infer", "the daemon is stopping")
    assert isinstance(stopping, Stopping) and isinstance(stopping, NrtConnectionError)
    for error in (late, gone, stopping):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)


@pytest.mark.daemon
def test_one_except_clause_for_the_client_and_local_runtime(daemon: DaemonProcess) -> None:
    """The same two failures (a wrong input, a model no longer loaded), caught by the same
    clauses from the daemon's client and from the in-process runtime."""
    mlp = build_mlp()
    wrong = {"x": np.zeros((28, 28), np.float32)}
    with Client(daemon.address) as client:
        model = client.load(mlp.neff)
        with pytest.raises(BadInput):
            model.infer(wrong)
        model.unload()
        with pytest.raises(InvalidHandle):
            model.infer_raw({"x": bytes(model.inputs[0].nbytes)})
    with LocalRuntime() as rt:
        local = rt.load(mlp.neff)
        with pytest.raises(BadInput):
            rt.infer(local, wrong)
        rt.unload(local)
        with pytest.raises(InvalidHandle):
            rt.infer(local, {"x": np.zeros(local.neff.inputs[0].shape, np.float32)})
