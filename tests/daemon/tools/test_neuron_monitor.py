"""neuron-monitor: its configuration file, and the real process against real daemons: a
run with inferences, an inference error, the daemon killed and started again; every
report checked against the schema written from the original's user guide."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from monitor_helpers import ALL_RUNTIME_GROUPS, Reports, command, config, stop, validate

from neuron_rtd.cli import neuron_monitor
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import Client, NrtClientError
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import pb
from neuron_rtd.tools.monitor.config import everything, from_document, parse_period
from neuron_rtd.tools.monitor.monitor import Monitor
from neuron_rtd.typed_json import ConfigError

# --- the configuration ------------------------------------------------------------------


def test_periods_apply_from_the_nearest_level() -> None:
    cfg = from_document(
        {
            "period": "2s",
            "neuron_runtimes": [
                {
                    "address": "unix:/a.sock",
                    "period": "500ms",
                    "metrics": [
                        {"type": "neuroncore_counters"},
                        {"type": "hw_counters", "period": 3},
                    ],
                },
                {"address": "unix:/b.sock", "metrics": [{"type": "memory_used"}]},
            ],
            "system_metrics": [{"type": "vcpu_usage", "period": "1.5m"}, {"type": "memory_info"}],
        }
    )
    first, second = cfg.runtimes
    assert [(g.type, g.period_s) for g in first.groups] == [
        ("neuroncore_counters", 0.5),
        ("hw_counters", 3.0),
    ]
    assert (second.address, second.groups[0].period_s) == ("unix:/b.sock", 2.0)
    assert [(g.type, g.period_s) for g in cfg.system] == [
        ("vcpu_usage", 90.0),
        ("memory_info", 2.0),
    ]
    assert parse_period("250ms", "p") == 0.25 and parse_period(1, "p") == 1.0


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"period": "fast"}, r"^period: 'fast' is not a period"),
        ({"period": 0}, r"^period: the period must be more than 0"),
        ({"neuron_runtimes": [{"metrics": []}]}, r"^neuron_runtimes\[0\]\.address: missing"),
        (
            {"neuron_runtimes": [{"address": "unix:/a", "metrics": [{"type": "gpu_counters"}]}]},
            r"^neuron_runtimes\[0\]\.metrics\[0\]\.type: unknown metric group 'gpu_counters'",
        ),
        (
            {"neuron_runtimes": [{"tag_filter": ".*", "metrics": []}]},
            r"^neuron_runtimes\[0\]\.tag_filter: not supported",
        ),
        (
            {"system_metrics": [{"type": "vcpu_usage", "periode": "1s"}]},
            r"system_metrics\[0\]\.periode: unknown key",
        ),
        ({"neuron_runtimes": {}}, r"^neuron_runtimes: expected an array"),
        ({}, r"nothing to collect"),
    ],
)
def test_a_bad_config_names_its_key(doc: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_document(doc)


def test_a_bad_config_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "monitor.conf"
    bad.write_text('{"period": "1s", "neuron_runtimes": [{"address": "unix:/a", "metrics": 3}]}')
    assert neuron_monitor.main(["-c", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"neuron-monitor: error: {bad}: neuron_runtimes[0].metrics: expected an array" in err
    bad.write_text("{period: 1s}")
    assert neuron_monitor.main(["-c", str(bad)]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert neuron_monitor.main(["-c", str(tmp_path / "none.conf")]) == 2
    assert "cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        neuron_monitor.main(["--verbose", "7"])
    assert exited.value.code == 2


# --- against real daemons ---------------------------------------------------------------


def _entry(report: dict, index: int = 0) -> dict:
    (entry,) = [e for e in report["neuron_runtime_data"] if e["neuron_runtime_index"] == index]
    return dict(entry)


def test_no_config_watches_the_default_address_with_every_group_at_once(
    daemon: DaemonProcess,
) -> None:
    env = {**os.environ, "NEURON_RTD_ADDRESS": daemon.address}
    proc = subprocess.Popen(
        command("neuron_monitor"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        first = Reports(proc.stdout).next(timeout_s=30)  # the default period is 5 s
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(20)
    entry = _entry(first)
    assert (entry["address"], entry["pid"], entry["error"]) == (daemon.address, daemon.pid, "")
    assert sorted(entry["report"]) == sorted(ALL_RUNTIME_GROUPS)
    assert sorted(first["system_data"]) == ["memory_info", "vcpu_usage"]
    assert first["instance_data"]["instance_type"] == "inf1.6xlarge"
    assert first["neuron_hardware_info"] == {
        "neuron_device_count": 4,
        "neuroncore_per_device_count": 4,
        "error": "",
    }
    assert code == 0
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()


def test_closed_stdout_ends_the_monitor_quietly(tmp_path: Path) -> None:
    conf = config(tmp_path / "m.conf", [f"unix:{tmp_path}/none.sock"], period="0.2s")
    proc = subprocess.Popen(
        command("neuron_monitor", "-c", str(conf)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    report = validate(json.loads(proc.stdout.readline()))
    assert "no runtime answers at unix:" in _entry(report)["error"]  # no daemon: still reports
    proc.stdout.close()
    assert proc.wait(30) == 0
    assert proc.stderr.read() == ""


def _utilization_of(report: dict, model: str) -> list[float]:
    """The utilization of each NC `model` is loaded on."""
    ncs = _entry(report)["report"]["neuroncore_counters"]["neuroncores_in_use"]
    return [
        nc["neuroncore_utilization"]
        for nc in ncs.values()
        if f"{model}:sg00" in nc["loaded_models"]
    ]


def test_reports_over_inferences_an_error_and_a_daemon_stop(work: Path) -> None:
    sim, sock = work / "sim", work / "rtd.sock"
    sample = build_mlp((256, 512, 10), batch=8, name="monitored")
    conf = config(work / "monitor.conf", [f"unix:{sock}"])
    daemon = DaemonProcess(sim_root=sim, socket_path=sock).start()
    proc = subprocess.Popen(
        command("neuron_monitor", "-c", str(conf), "--verbose", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    reports = Reports(proc.stdout)
    try:
        with Client(daemon.address) as client:
            model = client.load(sample.neff)
            (sim / "neuron0" / "inject").write_text("nc_error\nmem_ecc_corr=2\n")
            with pytest.raises(NrtClientError, match="HW_ERROR"):
                model.infer(sample.random_inputs(0))
            model.start()  # the device reset (its NCs' busy time with it), the model reloaded
            # the wrong size, sent as the original's clients may (ours refuses it unsent)
            request = pb.infer_request(h_nn=pb.h_nn(id=model.id))
            request.ifmap.add(name="x", buf=np.zeros((1, 3), np.float32).tobytes())
            refused = client.connection.unary("infer", request)
            assert refused.status.code == Nerr.INFER_BAD_INPUT, refused.status
            for seed in range(40):
                model.infer(sample.random_inputs(seed))

            # every inference and the error, in the reports of their periods
            totals = dict.fromkeys(
                ("completed", "incorrect_input", "completed_with_err", "model", "hardware"), 0
            )
            devices = dict.fromkeys(("nc_errors", "mem_ecc_corrected", "mem_ecc_uncorrected"), 0)
            busy: list[float] = []

            def counted(report: dict) -> bool:
                stats = _entry(report)["report"]["inference_stats"]
                for key in ("completed", "incorrect_input", "completed_with_err"):
                    totals[key] += stats["inference_summary"][key]
                for key in ("model", "hardware"):
                    totals[key] += stats["error_summary"][key]
                hw = _entry(report)["report"]["hw_counters"]["neuron_devices"]
                for key in devices:
                    devices[key] += sum(d[key] for d in hw if d["neuron_device_index"] == 0)
                busy.extend(_utilization_of(report, "monitored"))
                if stats["inference_summary"]["completed"]:
                    latency = stats["latency_stats"]
                    for kind in ("total_latency", "device_latency"):
                        values = [
                            latency[kind][p]
                            for p in ("p0", "p1", "p25", "p50", "p75", "p99", "p100")
                        ]
                        assert values == sorted(values) and values[0] > 0, (kind, values)
                    assert latency["device_latency"]["p50"] <= latency["total_latency"]["p100"]
                return totals["completed"] >= 40 and totals["completed_with_err"] >= 1

            seen = reports.until(counted, "40 inferences done, one bad input, one NC error")
            assert totals == {
                "completed": 40,
                "incorrect_input": 1,
                "completed_with_err": 1,
                "model": 1,
                "hardware": 1,
            }
            assert devices == {"nc_errors": 1, "mem_ecc_corrected": 2, "mem_ecc_uncorrected": 0}
            assert max(busy) > 0, "the model's NC was never busy"
            (loaded,) = _entry(seen)["report"]["memory_used"]["loaded_models"]
            assert (loaded["name"], loaded["is_running"]) == ("monitored", True)
            assert loaded["memory_used_bytes"]["neuron_device"] > 0
            first_pid = _entry(seen)["pid"]
            assert first_pid == daemon.pid

            # the daemon dies: its groups say so, and the monitor goes on
            assert daemon.proc is not None
            daemon.proc.kill()
            daemon.proc.wait()
            down = reports.until(lambda r: _entry(r)["error"] != "", "the daemon's death")
            entry = _entry(down)
            assert "no runtime answers at" in entry["error"]
            assert all(group["error"] == entry["error"] for group in entry["report"].values())
            assert sorted(entry["report"]) == sorted(ALL_RUNTIME_GROUPS)
            assert down["system_data"]["memory_info"]["error"] == ""  # the system is still seen
            reports.next()  # ... and more reports come
            assert proc.poll() is None
        daemon.close()

        # a daemon answers there again: picked up, counted from its start
        daemon = DaemonProcess(sim_root=sim, socket_path=sock).start()
        back = reports.until(lambda r: _entry(r)["error"] == "", "the new daemon")
        assert _entry(back)["pid"] == daemon.pid != first_pid
        assert _entry(back)["report"]["memory_used"]["loaded_models"] == []
    finally:
        code = stop(proc)
        daemon.close()
    assert code == 0
    told = proc.stderr.read()  # --verbose 1: the runtime going and coming back
    assert f"unix:{sock}: describe: NERR_FAIL: no runtime answers at unix:{sock}" in told
    assert f"a new runtime (pid {daemon.pid}) answers" in told
    assert "Traceback" not in told


def test_in_process_monitor_counts_each_period_once(daemon: DaemonProcess) -> None:
    """Two reports back to back: the second has only what happened in between."""
    sample = build_mlp((16, 8), name="twice")
    cfg = from_document(
        {
            "neuron_runtimes": [
                {
                    "address": daemon.address,
                    "period": 0.01,
                    "metrics": [{"type": "inference_stats"}],
                }
            ]
        }
    )
    monitor = Monitor(cfg)
    try:
        with Client(daemon.address) as client:
            model = client.load(sample.neff)
            for seed in range(3):
                model.infer(sample.random_inputs(seed))
            first = _entry(validate(monitor.collect()))["report"]["inference_stats"]
            model.infer(sample.random_inputs(9))
            second = _entry(validate(monitor.collect()))["report"]["inference_stats"]
    finally:
        monitor.close()
    assert first["inference_summary"]["completed"] >= 3  # since the daemon started
    assert second["inference_summary"]["completed"] == 1
    assert second["period"] < first["period"]


def test_each_group_on_its_own_period() -> None:
    now = [100.0]
    cfg = from_document(
        {
            "system_metrics": [
                {"type": "vcpu_usage", "period": "1s"},
                {"type": "memory_info", "period": "2s"},
            ]
        }
    )
    monitor = Monitor(cfg, clock=lambda: now[0])
    taken = []
    for _ in range(5):
        report = validate(monitor.collect())
        taken.append(sorted(report["system_data"]))
        now[0] += monitor.seconds_to_next()
    both, vcpu = ["memory_info", "vcpu_usage"], ["vcpu_usage"]
    assert taken == [both, vcpu, both, vcpu, both]


def test_several_runtimes_each_in_its_entry(daemon: DaemonProcess, tmp_path: Path) -> None:
    absent = f"unix:{tmp_path}/absent.sock"
    monitor = Monitor(everything([daemon.address, absent]), timeout_s=2)
    try:
        report = validate(monitor.collect())
    finally:
        monitor.close()
    here, gone = _entry(report, 0), _entry(report, 1)
    assert (here["address"], here["error"], here["pid"]) == (daemon.address, "", daemon.pid)
    assert (gone["address"], gone["pid"]) == (absent, None)
    assert f"no runtime answers at {absent}" in gone["error"]
    assert {k: g["error"] for k, g in gone["report"].items()} == dict.fromkeys(
        ALL_RUNTIME_GROUPS, gone["error"]
    )
    assert report["neuron_hardware_info"]["neuron_device_count"] == 4  # the one that answers
