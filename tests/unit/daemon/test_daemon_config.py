"""The daemon's config (`neuron_rtd/daemon/config.py`): the file's keys and types read off
the dataclass, the environment read in one place, the runtime's options taken by name,
and the CPU nodes' threads decided by one number (`neuron_rtd/runtime/host.py`)."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

import pytest

from neuron_rtd.daemon.config import (
    ENV,
    DaemonConfig,
    SimConfig,
    config_from_dict,
    environment,
    file_types,
    load_config,
    runtime_options,
)
from neuron_rtd.runtime import RuntimeOptions
from neuron_rtd.runtime.host import HostPool
from neuron_rtd.typed_json import ConfigError


def test_the_files_types_come_from_the_fields() -> None:
    types = file_types(DaemonConfig)
    assert types["server_threads"] is int and types["shmem_enabled"] is bool
    assert types["neff_file_dirs"] is list and types["sim"] is dict
    assert types["http_address"] == (str, type(None))
    assert types["socket_mode"] is str  # "0660" in the file
    for env_only in ("visible_devices", "nc_spinning", "host_threads", "instance"):
        assert env_only not in types
    assert file_types(SimConfig) == {"instance_type": str, "root": (str, type(None))}


def test_a_file_names_no_field_of_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "neuron-rtd.json"
    path.write_text('{"host_threads": 2}')
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="unknown key 'host_threads'"):
        load_config(path=str(path), environ={})
    path.write_text('{"server_threads": "16"}')
    with pytest.raises(ConfigError, match="'server_threads' must be an integer"):
        load_config(path=str(path), environ={})


def test_every_field_named_by_the_file_is_read() -> None:
    config = config_from_dict(
        {"stream_threads": 8, "http_threads": 4, "peer_lanes": 9, "neff_file_dirs": ["/"]}
    )
    assert (config.stream_threads, config.http_threads, config.peer_lanes) == (8, 4, 9)
    assert config.neff_file_dirs == ("/",)
    with pytest.raises(ConfigError, match="peer_lanes must be at least 1"):
        config_from_dict({"peer_lanes": 0})


def test_the_environment_is_read_in_one_place() -> None:
    env = {
        "NEURON_RTD_NC_ENGINE": "reference",
        "NEURON_RTD_NC_SPINNING": "in-runs",
        "NEURON_RTD_HOST_THREADS": "2",
        "NEURON_SIM_ROOT": "/somewhere/sim",
        "NEURON_SIM_FAULTS": "nc_error@0:1",
        "AWS_NEURON_VISIBLE_DEVICES": "1",
    }
    config = environment(DaemonConfig(), env)
    assert (config.nc_engine, config.nc_spinning, config.host_threads) == (
        "reference",
        "in-runs",
        2,
    )
    assert (config.sim.root, config.sim.faults) == ("/somewhere/sim", "nc_error@0:1")
    assert config.visible_devices == frozenset({1})
    # the file's engine wins over the variable; a bad thread count is the default
    mine = environment(DaemonConfig(nc_engine="fast"), {**env, "NEURON_RTD_HOST_THREADS": "x"})
    assert (mine.nc_engine, mine.host_threads) == ("fast", 0)
    nothing = environment(DaemonConfig(), {})
    assert (nothing.nc_engine, nothing.nc_spinning, nothing.sim.root) == (
        "fast",
        "while-busy",
        None,
    )
    with pytest.raises(ConfigError, match=r"\$NEURON_RTD_NC_SPINNING: unknown thread spinning"):
        environment(DaemonConfig(), {"NEURON_RTD_NC_SPINNING": "sometimes"})
    with pytest.raises(ConfigError, match=r"\$NEURON_RTD_NC_ENGINE: unknown NC engine"):
        environment(DaemonConfig(), {"NEURON_RTD_NC_ENGINE": "abacus"})


def test_the_runtimes_options_are_the_configs_fields_of_their_names() -> None:
    config = config_from_dict({"default_timeout": 7, "model_cache_count": 0, "session_max_ncs": 3})
    options = runtime_options(config)
    ours = {f.name for f in fields(DaemonConfig)}
    shared = [f.name for f in fields(RuntimeOptions) if f.name in ours]
    assert {"default_timeout", "model_cache_count", "host_threads", "neff_file_dirs"} <= set(shared)
    for name in shared:
        assert getattr(options, name) == getattr(config, name), name
    assert options.max_ninfer == RuntimeOptions().max_ninfer  # not the config's: the default


def test_one_number_decides_the_cpu_nodes_threads() -> None:
    cores = len(os.sched_getaffinity(0))
    every = HostPool()
    assert (every.threads, every.width) == (cores, 1)  # one CPU node at a time, on every core
    one = HostPool(1)
    assert (one.threads, one.width) == (1, cores)  # one per core, each on one thread
    assert HostPool(cores * 4).width == 1
    with one:
        pass


def test_every_key_and_variable_is_documented() -> None:
    """docs/operations.md's config reference has a row for every key of the file and names
    every variable a field is read from."""
    text = (Path(__file__).parents[3] / "docs" / "operations.md").read_text()
    keys = [k for k in file_types(DaemonConfig) if k != "sim"]
    keys += [f"sim.{k}" for k in file_types(SimConfig)]
    assert [k for k in keys if f"| `{k}` |" not in text] == []
    variables = [
        f.metadata[ENV]
        for cls in (DaemonConfig, SimConfig)
        for f in fields(cls)
        if ENV in f.metadata
    ]
    assert len(variables) == 7
    assert [v for v in variables if f"`{v}`" not in text] == []
