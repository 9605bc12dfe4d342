"""The runtime-level metric groups of a neuron-monitor report, with the original's field
names, from what the daemon answers (ext `describe` and `snapshot`, nmgr
`read_inference_counters`) at the start and the end of a group's period.

Where the original's data has no counterpart here, the nearest honest one:
- `inference_stats`: the daemon's own counters (`nmgr_counters`), which count every
  inference since it started, even of models unloaded since. `error_summary` maps their
  error subtypes (NUMERICAL -> numerical, MODEL -> model, TRANSIENT -> transient,
  HW_ERROR -> hardware, RT -> runtime); `generic` counts the requests the runtime could
  not queue at all, which have no subtype. Latencies are seconds, read from the
  histograms' buckets (within 9%).
- `memory_used`: the runtime's host bytes are the daemon's resident memory; a model's
  `subgraphs` are its NeuronCores (`sg00` on its first NC, ...), each given an even
  share of the model's memory, since the runtime counts memory per model.
- `hw_counters`: each device's counts of the period, and besides the ECC counters our
  own fault counters (nc_errors, nc_hangs, dma_timeouts, init_failures).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from neuron_rtd.client.observe import Interval
from neuron_rtd.proto import pb

SUMMARY_STATUS = {  # inference_summary field <- nmgr infer_status
    "completed": pb.IST_OK,
    "completed_with_err": pb.IST_COMPLETED_WITH_ERR,
    "completed_with_num_err": pb.IST_COMPLETED_WITH_NUM_ERR,
    "timed_out": pb.IST_TIMEOUT,
    "incorrect_input": pb.IST_BAD_INPUT,
}
ERROR_SUBTYPE = {  # error_summary field <- nmgr infer_error_subtype
    "numerical": pb.INFER_ERROR_SUBTYPE_NUMERICAL,
    "transient": pb.INFER_ERROR_SUBTYPE_TRANSIENT,
    "model": pb.INFER_ERROR_SUBTYPE_MODEL,
    "runtime": pb.INFER_ERROR_SUBTYPE_RT,
    "hardware": pb.INFER_ERROR_SUBTYPE_HW_ERROR,
}
HW_FIELDS = {  # report field <- ext_hw_counters field
    "mem_ecc_corrected": "mem_ecc_corr",
    "mem_ecc_uncorrected": "mem_ecc_uncorr",
    "sram_ecc_corrected": "sram_ecc_corr",
    "sram_ecc_uncorrected": "sram_ecc_uncorr",
    "nc_errors": "nc_errors",
    "nc_hangs": "nc_hangs",
    "dma_timeouts": "dma_timeouts",
    "init_failures": "init_failures",
}


def inference_counts(counters: Any | None) -> dict[str, int]:
    """The error_summary and inference_summary fields from `nmgr_counters` (None: all 0),
    keyed "error_summary.<field>" and "inference_summary.<field>"."""
    status: dict[int, int] = {}
    subtype: dict[int, int] = {}
    drops = 0
    if counters is not None:
        status = {c.infer_status: c.count for c in counters.infer_status_counts}
        subtype = {c.error_subtype: c.count for c in counters.infer_error_subtype_counts}
        drops = counters.infer_queue_drop_count
    counts = {"error_summary.generic": drops}
    counts |= {f"error_summary.{k}": subtype.get(v, 0) for k, v in ERROR_SUBTYPE.items()}
    counts |= {f"inference_summary.{k}": status.get(v, 0) for k, v in SUMMARY_STATUS.items()}
    counts["inference_summary.failed_to_queue"] = drops
    return counts


def _grown(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """How much each count grew (a count that went back started again: all of it)."""
    return {k: v - before.get(k, 0) if v >= before.get(k, 0) else v for k, v in after.items()}


def _seconds(percentiles_us: Mapping[str, float] | None) -> dict[str, float] | None:
    if percentiles_us is None:
        return None
    return {name: round(us / 1e6, 9) for name, us in percentiles_us.items()}


def inference_stats(iv: Interval, counters_before: Any | None, counters_after: Any) -> dict:
    grown = _grown(inference_counts(counters_before), inference_counts(counters_after))
    section: dict[str, dict[str, int]] = {"error_summary": {}, "inference_summary": {}}
    for key, value in grown.items():
        group, field = key.split(".")
        section[group][field] = value
    return {
        "period": round(iv.seconds, 6),
        **section,
        "latency_stats": {
            "total_latency": _seconds(iv.latency_us),
            "device_latency": _seconds(iv.nc_latency_us),
        },
        "error": "",
    }


def _subgraphs(model: Any) -> list[tuple[str, int]]:
    """(subgraph name, virtual NC) for each NC of the model."""
    return [(f"sg{k:02d}", vnc) for k, vnc in enumerate(model.vncs)]


def neuroncore_counters(iv: Interval, after: Any) -> dict:
    loaded: dict[int, list[str]] = {nc.vnc: [] for nc in after.ncs}
    for model in after.models:
        for name, vnc in _subgraphs(model):
            loaded.setdefault(vnc, []).append(f"{model.name}:{name}")
    return {
        "period": round(iv.seconds, 6),
        "neuroncores_in_use": {
            str(nc.vnc): {
                "neuroncore_utilization": iv.nc_utilization.get(nc.vnc, 0.0),
                "loaded_models": loaded[nc.vnc],
            }
            for nc in after.ncs
        },
        "error": "",
    }


def _share(total: int, parts: int, k: int) -> int:
    """Part `k` of `total` split evenly in `parts` (the first parts take the remainder)."""
    base, extra = divmod(total, parts)
    return base + (1 if k < extra else 0)


def memory_used(iv: Interval, after: Any, described: Any) -> dict:
    device_of = {nc.vnc: nc.device_index for nc in after.ncs}
    models = []
    for model in after.models:
        subgraphs = _subgraphs(model)
        models.append(
            {
                "name": model.name,
                "model_id": model.id,
                "is_running": model.state == "READY",
                "memory_used_bytes": {
                    "host": model.host_bytes,
                    "neuron_device": model.device_bytes,
                },
                "subgraphs": {
                    name: {
                        "memory_used_bytes": {
                            "host": _share(model.host_bytes, len(subgraphs), k),
                            "neuron_device": _share(model.device_bytes, len(subgraphs), k),
                        },
                        "neuroncore_index": vnc,
                        "neuron_device_index": device_of.get(vnc, 0),
                    }
                    for k, (name, vnc) in enumerate(subgraphs)
                },
            }
        )
    return {
        "period": round(iv.seconds, 6),
        "neuron_runtime_used_bytes": {
            "host": after.rss_bytes,
            "neuron_device": sum(d.memory_used for d in described.devices),
        },
        "loaded_models": models,
        "error": "",
    }


def hw_counts(described: Any) -> dict[str, dict[str, int]]:
    """Each device's counters (by its PCI BDF), report field names."""
    return {
        d.bdf: {name: getattr(d.hw_counters, field) for name, field in HW_FIELDS.items()}
        for d in described.devices
    }


def hw_counters(seconds: float, before: Mapping[str, Mapping[str, int]], described: Any) -> dict:
    now = hw_counts(described)
    return {
        "period": round(seconds, 6),
        "neuron_devices": [
            {"neuron_device_index": d.index, **_grown(before.get(d.bdf, {}), now[d.bdf])}
            for d in described.devices
        ],
        "error": "",
    }


def neuron_runtime_vcpu_usage(iv: Interval) -> dict:
    return {
        "period": round(iv.seconds, 6),
        "vcpu_usage": {"user": round(iv.vcpu_user, 2), "system": round(iv.vcpu_system, 2)},
        "error": "",
    }
