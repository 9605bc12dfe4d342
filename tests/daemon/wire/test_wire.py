"""The wire API against the real daemon process, driven by the generated client."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from neuron_rtd import __version__
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import SampleModel, build_mlp, build_relu
from neuron_rtd.proto import pb

CHUNK = 1 << 20


@pytest.fixture(scope="module")
def mlp() -> SampleModel:
    """Big enough (>1 MiB) that loading it takes several chunks."""
    return build_mlp((784, 512, 256, 10), batch=4, neuron_nodes=2, seed=3)


def load_stream(
    neff: bytes,
    *,
    ncg: int | None = None,
    ninfer: int | None = None,
    timeout: int | None = None,
    size: int | None = None,
) -> Iterator[Any]:
    if ncg is not None:
        yield pb.load_request(h_eg=pb.h_eg(id=ncg))
    yield pb.load_request(neff_size=len(neff) if size is None else size)
    params = pb.model_params()
    if ninfer is not None:
        params.ninfer.data = ninfer
    if timeout is not None:
        params.timeout.data = timeout
    yield pb.load_request(model_params=params)
    for i in range(0, len(neff), CHUNK):
        yield pb.load_request(neff_chunk=pb.file_chunk(chunk=neff[i : i + CHUNK]))


def load(stub: Any, neff: bytes, **kw: Any) -> Any:
    return stub.load(load_stream(neff, **kw))


def infer_request(model_id: int, inputs: dict[str, np.ndarray]) -> Any:
    return pb.infer_request(
        h_nn=pb.h_nn(id=model_id),
        ifmap=[pb.infer_io(name=k, buf=v.tobytes()) for k, v in inputs.items()],
    )


def infer(stub: Any, model_id: int, inputs: dict[str, np.ndarray]) -> Any:
    return stub.infer(infer_request(model_id, inputs))


def post(stub: Any, model_id: int, inputs: dict[str, np.ndarray]) -> Any:
    return stub.infer_post(infer_request(model_id, inputs))


def outputs(response: Any, sample: SampleModel) -> dict[str, np.ndarray]:
    specs = {t.name: t for t in sample.outputs}
    return {
        io.name: np.frombuffer(io.buf, specs[io.name].dtype).reshape(specs[io.name].shape)
        for io in response.ofmap
    }


def assert_nerr(status: Any, code: Nerr, *fragments: str) -> str:
    details = status.details.decode()
    assert status.code == code, f"expected {code.name}, got {status.code}: {details}"
    for fragment in fragments:
        assert fragment in details, f"{fragment!r} not in details: {details}"
    assert re.search(r"^\[[A-Z]+:\w+\] ", details, re.M), details
    return details


def test_version_and_ping(stub: Any) -> None:
    v = stub.get_version(pb.get_version_request(framework_name="test")).runtime_version
    assert v.full_version == __version__
    assert (v.major_num, v.minor_num) == tuple(int(p) for p in __version__.split(".")[:2])
    assert stub.start(pb.start_request(h_nn=pb.h_nn(id=0))).status.code == Nerr.OK


def test_implicit_load_in_chunks_infer_unload(stub: Any, mlp: SampleModel) -> None:
    assert len(mlp.neff) > 2 * CHUNK
    first = load(stub, mlp.neff)
    assert first.status.code == Nerr.OK, first.status.details
    assert first.h_nn.id >= 10001
    egs = stub.list_egs(pb.empty())
    assert [(e.nc_count, e.vnc_start_index) for e in egs.eg_info] == [(2, 0)]
    assert (egs.mla_count, egs.nc_count) == (4, 16)

    inputs = mlp.random_inputs(seed=5)
    response = infer(stub, first.h_nn.id, inputs)
    assert response.status.code == Nerr.OK, response.status.details
    got = outputs(response, mlp)
    np.testing.assert_allclose(got["probs"], mlp.reference(inputs)["probs"], rtol=1e-5, atol=1e-6)

    second = load(stub, mlp.neff)
    assert second.h_nn.id == first.h_nn.id + 1
    assert len(stub.list_egs(pb.empty()).eg_info) == 2
    for model in (first, second):
        assert stub.unload(pb.unload_request(h_nn=model.h_nn)).status.code == Nerr.OK
    assert len(stub.list_egs(pb.empty()).eg_info) == 0


def test_explicit_ncg_by_path_start_stop(stub: Any, mlp: SampleModel, tmp_path: Path) -> None:
    path = tmp_path / "mlp.neff"
    path.write_bytes(mlp.neff)
    eg = stub.create_eg(pb.create_eg_request(nc_count=4))
    assert eg.status.code == Nerr.OK and eg.nc_count == 4
    response = stub.load(
        iter([pb.load_request(h_eg=eg.h_eg), pb.load_request(neff_file=str(path))])
    )
    assert response.status.code == Nerr.OK, response.status.details
    model = response.h_nn
    inputs = mlp.random_inputs(seed=2)

    stopped = infer(stub, model.id, inputs)
    assert_nerr(stopped.status, Nerr.FAIL, f"model {model.id}", "not running", "STANDBY")
    assert stub.start(pb.start_request(h_nn=model)).status.code == Nerr.OK
    ok = infer(stub, model.id, inputs)
    assert ok.status.code == Nerr.OK
    np.testing.assert_allclose(
        outputs(ok, mlp)["probs"], mlp.reference(inputs)["probs"], rtol=1e-5, atol=1e-6
    )
    assert stub.stop(pb.stop_request(h_nn=model)).status.code == Nerr.OK
    assert_nerr(infer(stub, model.id, inputs).status, Nerr.FAIL, "not running")

    busy = stub.destroy_eg(pb.destroy_eg_request(h_eg=eg.h_eg))
    assert_nerr(busy.status, Nerr.FAIL, "unload")
    assert stub.unload(pb.unload_request(h_nn=model)).status.code == Nerr.OK
    assert stub.destroy_eg(pb.destroy_eg_request(h_eg=eg.h_eg)).status.code == Nerr.OK
    assert len(stub.list_egs(pb.empty()).eg_info) == 0


def test_start_makes_other_models_standby(stub: Any, mlp: SampleModel) -> None:
    eg = stub.create_eg(pb.create_eg_request(nc_count=2))
    a = load(stub, mlp.neff, ncg=eg.h_eg.id).h_nn
    b = load(stub, mlp.neff, ncg=eg.h_eg.id).h_nn
    inputs = mlp.random_inputs()
    stub.start(pb.start_request(h_nn=a))
    assert infer(stub, a.id, inputs).status.code == Nerr.OK
    stub.start(pb.start_request(h_nn=b))
    assert infer(stub, b.id, inputs).status.code == Nerr.OK
    assert_nerr(infer(stub, a.id, inputs).status, Nerr.FAIL, "STANDBY")


def test_create_eg_zero_takes_largest_free_run(stub: Any) -> None:
    small = stub.create_eg(pb.create_eg_request(nc_count=3))
    assert small.nc_count == 3
    rest = stub.create_eg(pb.create_eg_request(nc_count=0))
    assert rest.status.code == Nerr.OK and rest.nc_count == 13
    infos = {e.eg.id: e for e in stub.list_egs(pb.empty()).eg_info}
    info = infos[rest.h_eg.id]
    assert (info.vnc_start_index, info.mla_start_index, info.nc_start_index) == (3, 0, 3)
    full = stub.create_eg(pb.create_eg_request(nc_count=1))
    assert_nerr(full.status, Nerr.RESOURCE_NC, "not enough free NeuronCores")


def test_unload_all(stub: Any, mlp: SampleModel) -> None:
    eg = stub.create_eg(pb.create_eg_request(nc_count=2))
    load(stub, mlp.neff, ncg=eg.h_eg.id)
    load(stub, mlp.neff)
    assert len(stub.list_egs(pb.empty()).eg_info) == 2
    assert stub.unload_all(pb.empty()).code == Nerr.OK
    assert len(stub.list_egs(pb.empty()).eg_info) == 0
    assert_nerr(stub.unload(pb.unload_request(h_nn=pb.h_nn(id=10001))).status, Nerr.INVALID_HANDLE)


def test_shared_nc_mode_and_too_few_ncs(stub: Any) -> None:
    sample = build_mlp((32, 24, 16, 8, 4), neuron_nodes=4, seed=1)
    eg = stub.create_eg(pb.create_eg_request(nc_count=1))
    shared = load(stub, sample.neff, ncg=eg.h_eg.id)
    assert shared.status.code == Nerr.OK, shared.status.details
    assert "shared mode" in shared.status.details.decode()
    stub.start(pb.start_request(h_nn=shared.h_nn))
    inputs = sample.random_inputs()
    got = outputs(infer(stub, shared.h_nn.id, inputs), sample)
    np.testing.assert_allclose(
        got["probs"], sample.reference(inputs)["probs"], rtol=1e-5, atol=1e-6
    )

    wide = build_mlp((32, 24, 16, 8, 4), neuron_nodes=1, stages_per_node=2, seed=1)
    refused = load(stub, wide.neff, ncg=eg.h_eg.id)
    assert_nerr(refused.status, Nerr.RESOURCE_NC, "largest node 2", "has 1")

    sizes = [8] * 18  # 17 layers on 17 NCs: more than the machine's 16
    huge = load(stub, build_mlp(sizes, neuron_nodes=17).neff)
    assert_nerr(huge.status, Nerr.RESOURCE_NC, "17 contiguous needed")
    assert len(stub.list_egs(pb.empty()).eg_info) == 1  # no NCG left behind by a failure


def big_io_neff() -> bytes:
    """No weights, but 1 GiB in and 1 GiB out per in-flight inference."""
    return build_relu((1, 1 << 28), name="bigio")


def test_too_little_dram(stub: Any, mlp: SampleModel) -> None:
    refused = load(stub, big_io_neff(), ninfer=4)
    details = assert_nerr(refused.status, Nerr.RESOURCE, "DRAM", "cannot allocate")
    assert re.search(r"\d+ bytes", details)
    assert len(stub.list_egs(pb.empty()).eg_info) == 0
    fits = load(stub, big_io_neff(), ninfer=1)  # 2 GiB: fits in one 4 GiB channel
    assert fits.status.code == Nerr.OK, fits.status.details
    stub.unload(pb.unload_request(h_nn=fits.h_nn))
    assert load(stub, mlp.neff).status.code == Nerr.OK  # all DRAM came back


def test_bad_handles(stub: Any, mlp: SampleModel) -> None:
    ghost = pb.h_nn(id=424242)
    for call, request in [
        (stub.unload, pb.unload_request(h_nn=ghost)),
        (stub.start, pb.start_request(h_nn=ghost)),
        (stub.stop, pb.stop_request(h_nn=ghost)),
    ]:
        assert_nerr(call(request).status, Nerr.INVALID_HANDLE, "model 424242")
    assert_nerr(
        infer(stub, 424242, mlp.random_inputs()).status, Nerr.INVALID_HANDLE, "model 424242"
    )
    assert_nerr(load(stub, mlp.neff, ncg=77).status, Nerr.INVALID_HANDLE, "NCG 77")
    assert_nerr(
        stub.destroy_eg(pb.destroy_eg_request(h_eg=pb.h_eg(id=77))).status,
        Nerr.INVALID_HANDLE,
        "NCG 77",
    )


def test_truncated_neff(stub: Any, mlp: SampleModel, tmp_path: Path) -> None:
    cut = mlp.neff[: len(mlp.neff) - 1000]
    assert_nerr(load(stub, cut).status, Nerr.INVALID, "truncated")
    assert_nerr(load(stub, mlp.neff[:500]).status, Nerr.INVALID, "truncated")
    path = tmp_path / "cut.neff"
    path.write_bytes(cut)
    by_path = stub.load(iter([pb.load_request(neff_file=str(path))]))
    assert_nerr(by_path.status, Nerr.INVALID, "truncated")
    short = load(stub, mlp.neff, size=len(mlp.neff) + 10)
    assert_nerr(short.status, Nerr.INVALID, "neff_size")
    assert len(stub.list_egs(pb.empty()).eg_info) == 0


def test_hash_mismatch(stub: Any, mlp: SampleModel) -> None:
    flipped = bytearray(mlp.neff)
    flipped[len(flipped) // 2] ^= 0xFF
    assert_nerr(load(stub, bytes(flipped)).status, Nerr.INVALID, "hash mismatch")


def test_unsupported_version(stub: Any) -> None:
    response = load(stub, build_relu((1, 4), version=(3, 0)))
    assert_nerr(response.status, Nerr.UNSUPPORTED_VERSION, "3.0")


def test_missing_neff_file_and_empty_stream(stub: Any) -> None:
    missing = stub.load(iter([pb.load_request(neff_file="/nonexistent/model.neff")]))
    assert_nerr(missing.status, Nerr.INVALID, "/nonexistent/model.neff")
    empty = stub.load(iter([pb.load_request(model_params=pb.model_params())]))
    assert_nerr(empty.status, Nerr.INVALID, "no NEFF")


def test_bad_inputs(stub: Any, mlp: SampleModel) -> None:
    model = load(stub, mlp.neff).h_nn
    good = mlp.random_inputs()
    wrong_name = infer(stub, model.id, {"image": good["x"]})
    assert_nerr(wrong_name.status, Nerr.INFER_BAD_INPUT, "'image'", "inputs are: x")
    wrong_size = infer(stub, model.id, {"x": good["x"][:, :-1]})
    expected = good["x"].nbytes
    assert_nerr(
        wrong_size.status,
        Nerr.INFER_BAD_INPUT,
        "'x'",
        f"expected {expected} bytes",
        f"received {expected - 4 * good['x'].shape[0]}",
    )
    missing = stub.infer(pb.infer_request(h_nn=model))
    assert_nerr(missing.status, Nerr.INFER_BAD_INPUT, "missing", "'x'")
    assert infer(stub, model.id, good).status.code == Nerr.OK  # still serving


@pytest.mark.parametrize(
    "path", ["/nrt.nmgr_v1/no_such_method", "/nrt.nmgr_stream/infer", "/nrt.other/load"]
)
def test_unknown_methods_are_unimplemented(channel: grpc.Channel, path: str) -> None:
    call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as info:
        call(b"")
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
