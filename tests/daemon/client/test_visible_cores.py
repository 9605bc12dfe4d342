"""NEURON_RT_VISIBLE_CORES (the client and LocalRuntime) and AWS_NEURON_VISIBLE_DEVICES
(the daemon): every NCG a process makes lies within its NeuronCores; a daemon serves only
its devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client, NrtClientError
from neuron_rtd.errors import InvalidError, Nerr, ResourceNcError
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.runtime import LocalRuntime
from neuron_rtd.visible import CORES_ENV, DEVICES_ENV, parse_indices, show_indices

pytestmark = pytest.mark.daemon

ONE_NC = build_mlp((16, 8, 4), name="one")
TWO_NCS = build_mlp((16, 8, 8, 4), stages_per_node=2, name="two")
FIVE_NCS = build_mlp((8, 8, 8, 8, 8, 8), stages_per_node=5, name="five")


def test_lists_and_ranges_read_and_shown_back() -> None:
    assert parse_indices("4-7,9", CORES_ENV) == {4, 5, 6, 7, 9}
    assert parse_indices(" 0 , 2-3 ", CORES_ENV) == {0, 2, 3}
    assert show_indices({9, 4, 5, 6, 7, 0}) == "0,4-7,9"
    for bad, why in (
        ("4-", "'4-' is not an index or a range"),
        ("a", "'a' is not an index or a range"),
        ("7-4", "the range 7-4 runs backwards"),
        ("1,,2", "an entry is empty"),
        ("-1", "'-1' is not an index"),
    ):
        with pytest.raises(InvalidError) as caught:
            parse_indices(bad, CORES_ENV)
        assert str(caught.value).startswith(f"{CORES_ENV}={bad!r}: {why}"), caught.value
        assert "as in '4-7,9'" in str(caught.value)


# --- the client, against a real daemon on an inf1.6xlarge (16 NCs) ----------------------


def machine_ncs(client: Client, model_id: int) -> set[int]:
    """The machine-wide NC indices model `model_id` runs on, as the daemon's snapshot says."""
    snapshot = client.connection.snapshot()
    where = {nc.vnc: nc.device_index * 4 + nc.nc_index for nc in snapshot.ncs}
    (model,) = [m for m in snapshot.models if m.id == model_id]
    return {where[vnc] for vnc in model.vncs}


@pytest.fixture
def visible_4_7(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORES_ENV, "4-7")
    monkeypatch.delenv("NEURONCORE_GROUP_SIZES", raising=False)


@pytest.fixture
def client(daemon: DaemonProcess, visible_4_7: None) -> Iterator[Client]:
    with Client(daemon.address) as made:
        yield made
    with Client(daemon.address, session=False) as other:  # its session released it all
        assert other.list_ncgs() == []


def run(model: object, sample: SampleModel) -> None:
    x = np.random.rand(*sample.inputs[0].shape).astype(np.float32)
    got = model(x=x)["probs"]  # type: ignore[operator]
    np.testing.assert_allclose(got, sample.reference({"x": x})["probs"], rtol=1e-4, atol=1e-5)


def test_implicit_ncgs_land_inside_the_visible_cores(client: Client) -> None:
    one = client.load(ONE_NC.neff)  # unrestricted, the daemon would take NC 0
    two = client.load(TWO_NCS.neff)
    assert machine_ncs(client, one.id) == {4}
    assert machine_ncs(client, two.id) == {5, 6}
    run(one, ONE_NC)
    run(two, TWO_NCS)
    with pytest.raises(NrtClientError) as caught:  # NC 7 is the only one left
        client.load(TWO_NCS.neff)
    assert caught.value.nerr is Nerr.RESOURCE_NC
    assert f"{CORES_ENV}=4-7 lets this process use NeuronCores 4-7 only" in str(caught.value)
    assert "2 contiguous needed, the largest free run is 1" in str(caught.value)
    assert len(client.list_ncgs()) == 2  # the refused load left no NCG behind
    two.unload()  # the NCG made for it goes with it, as an implicit one does
    assert [g["nc_count"] for g in client.list_ncgs()] == [1]
    three = client.load(TWO_NCS.neff)
    assert machine_ncs(client, three.id) == {5, 6}
    snapshot = client.connection.snapshot()
    assert all(g.implicit for g in snapshot.ncgs)  # each goes with its model


def test_an_implicit_ncg_goes_with_its_model_whoever_unloads_it(
    daemon: DaemonProcess, visible_4_7: None
) -> None:
    with Client(daemon.address, session=False) as loader:  # as neuron-cli load does
        model_id = loader.load(ONE_NC.neff).id
    with Client(daemon.address, session=False) as other:  # as neuron-cli unload does
        assert machine_ncs(other, model_id) == {4}
        other.unload(model_id)
        assert other.list_ncgs() == []


def test_explicit_and_group_sizes_ncgs_land_inside(daemon: DaemonProcess, client: Client) -> None:
    ncg, count = client.create_ncg(0)  # the largest free run: all the visible ones
    assert count == 4
    model = client.load(TWO_NCS.neff, ncg=ncg, start=True)
    assert machine_ncs(client, model.id) == {4, 5}
    client.unload(model.id)
    client.destroy_ncg(ncg)
    with Client(daemon.address, ncg_sizes=[1, 1]) as grouped:
        first, second = grouped.load(ONE_NC.neff), grouped.load(ONE_NC.neff)
        assert {*machine_ncs(grouped, first.id), *machine_ncs(grouped, second.id)} == {4, 5}
        run(second, ONE_NC)


def test_a_model_larger_than_the_visible_cores_fails_naming_the_variable(
    client: Client,
) -> None:
    with pytest.raises(NrtClientError) as caught:
        client.load(FIVE_NCS.neff)
    assert caught.value.nerr is Nerr.RESOURCE_NC
    said = str(caught.value)
    assert f"{CORES_ENV}=4-7 lets this process use NeuronCores 4-7 only" in said
    assert "5 contiguous needed" in said and f"widen {CORES_ENV}" in said
    with pytest.raises(NrtClientError, match=f"{CORES_ENV}=4-7"):
        client.create_ncg(5)
    assert client.list_ncgs() == []


def test_cores_not_on_the_daemon_are_said(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CORES_ENV, "16-19")  # a 6xlarge has NCs 0-15
    with Client(daemon.address) as client, pytest.raises(NrtClientError) as caught:
        client.load(ONE_NC.neff)
    assert caught.value.nerr is Nerr.RESOURCE_NC
    assert "none of NeuronCores 16-19 is this runtime's: it has NeuronCores 0-15" in str(
        caught.value
    )


def test_bad_syntax_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORES_ENV, "4..7")
    with pytest.raises(ValueError, match=f"{CORES_ENV}='4..7': '4..7' is not an index"):
        Client("unix:/nonexistent.sock")
    with pytest.raises(InvalidError, match=f"{CORES_ENV}='4..7'"):
        LocalRuntime("inf1.xlarge")


def test_unset_or_empty_restricts_nothing(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CORES_ENV, "")  # as Ray leaves it for a task with no neuron_cores
    with Client(daemon.address) as client:
        assert client.visible is None
        model = client.load(ONE_NC.neff)
        assert machine_ncs(client, model.id) == {0}


# --- LocalRuntime ----------------------------------------------------------------------


def test_local_runtime_places_every_ncg_inside(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORES_ENV, "4-7")
    with LocalRuntime("inf1.6xlarge") as rt:
        implicit = rt.load(TWO_NCS.neff)
        assert {rt.runtime.machine_nc(v) for v in implicit.vncs} == {4, 5}
        x = np.random.rand(1, 16).astype(np.float32)
        np.testing.assert_allclose(
            rt.infer(implicit, {"x": x})["probs"], TWO_NCS.reference({"x": x})["probs"], rtol=1e-4
        )
        ncg = rt.create_ncg(0)
        assert (ncg.device_index, ncg.nc_start, ncg.nc_count) == (1, 2, 2)  # NCs 6-7
        with pytest.raises(ResourceNcError) as caught:
            rt.load(ONE_NC.neff)
        assert f"{CORES_ENV}=4-7 lets this process use NeuronCores 4-7 only" in str(caught.value)
        with pytest.raises(ResourceNcError, match="5 contiguous needed"):
            rt.create_ncg(5)


# --- the daemon: AWS_NEURON_VISIBLE_DEVICES --------------------------------------------


def neuron_ls_json(address: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "neuron_rtd.cli.neuron_ls", "--json-output"],
        env={**os.environ, "NEURON_RTD_ADDRESS": address},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    doc: list[dict[str, object]] = json.loads(done.stdout)
    return doc


def test_a_daemon_owns_only_the_visible_devices(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CORES_ENV, "4-7")
    with DaemonProcess(sim_root=work / "sim", env={DEVICES_ENV: "1"}) as proc:
        listed = neuron_ls_json(proc.address)
        assert [(d["neuron_device"], d["nc_count"]) for d in listed] == [(1, 4)]
        with Client(proc.address) as client:  # its NCs are the machine's 4-7
            model = client.load(TWO_NCS.neff)
            assert machine_ncs(client, model.id) == {4, 5}


def start_refused(work: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "neuron_rtd.daemon.main", "-g", f"unix:{work}/x.sock", *args],
        env={**os.environ, "NEURON_SIM_ROOT": str(work / "sim"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert not (work / "x.sock").exists()
    return done


def test_the_daemon_refuses_bad_or_conflicting_devices(work: Path) -> None:
    said = start_refused(work, {DEVICES_ENV: "1-"}).stderr
    assert f"{DEVICES_ENV}='1-': '1-' is not an index or a range" in said
    said = start_refused(work, {DEVICES_ENV: "2"}, "-t", "0000:00:1d.0").stderr
    assert f"-t 0000:00:1d.0 names devices 1, but {DEVICES_ENV}=2 names others" in said
    said = start_refused(work, {DEVICES_ENV: "0,2"}).stderr
    assert f"{DEVICES_ENV}=0,2 is not a contiguous run of devices" in said
    said = start_refused(work, {DEVICES_ENV: "3-4"}).stderr
    assert "no device 4 on this inf1.6xlarge, whose devices are 0-3" in said
    # the same device both ways is no conflict
    with DaemonProcess(
        sim_root=work / "sim", args=["-t", "0000:00:1d.0"], env={DEVICES_ENV: "1"}
    ) as proc:
        assert [d["neuron_device"] for d in neuron_ls_json(proc.address)] == [1]


def test_neuron_cli_tells_a_bad_list_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, CORES_ENV: "x"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "neuron_rtd.cli.neuron_cli",
            "-a",
            f"unix:{tmp_path}/s",
            "unload",  # a command that makes a client (a listing reads the daemon only)
            "10001",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"{CORES_ENV}='x'" in done.stderr and "bug" not in done.stderr
