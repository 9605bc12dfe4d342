"""The generated wire API matches the outside reference, ../shared/spec/runtime-api.md,
field by field.

The tables below are transcribed from the spec by hand, independently of proto/nrt/*.proto,
so that a drift on either side (an edited .proto, stale generated code, or a spec change
not carried over) fails here. Field rows are (number, name, type, repeated, oneof), where
type is a scalar type name or the full name of a message/enum type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import (
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
    ServiceDescriptor,
)

from neuron_rtd import proto
from neuron_rtd.proto import ext_pb, ext_pb_grpc, pb, pb_grpc

Field = tuple[int, str, str, bool, str | None]

R = True  # repeated
S = False  # singular


def _status(number: int = 1) -> Field:
    return (number, "status", "nrt.status", S, None)


# --- package nrt (nmgr.proto) -----------------------------------------------------------

NRT_MESSAGES: dict[str, list[Field]] = {
    # Small shared messages
    "status": [(1, "code", "int32", S, None), (2, "details", "bytes", S, None)],
    "return_code": [(1, "data", "int32", S, None)],
    "h_nn": [(1, "id", "uint32", S, None)],
    "h_eg": [(1, "id", "uint32", S, None)],
    "h_model": [(1, "id", "uint32", S, None)],
    "version": [
        (1, "full_version", "string", S, None),
        (2, "major_num", "uint32", S, None),
        (3, "minor_num", "uint32", S, None),
    ],
    "u32": [(1, "data", "uint32", S, None)],
    "address": [(1, "data", "uint64", S, None)],
    "empty": [],
    # nmgr_session_manager
    "session_monitor_request": [
        (1, "framework_name", "string", S, None),
        (2, "framework_version", "nrt.version", S, None),
        (3, "fal_version", "nrt.version", S, None),
    ],
    "session_monitor_response": [
        (1, "session_id", "uint64", S, None),
        (2, "runtime_version", "nrt.version", S, None),
    ],
    # nmgr_v1
    "model_params": [
        (1, "timeout", "nrt.u32", S, None),
        (2, "ninfer", "nrt.u32", S, None),
        (3, "enable_tracing", "nrt.u32", S, None),
        (4, "io_data_host", "nrt.u32", S, None),
        (5, "fmap_in_huge_tlb", "nrt.u32", S, None),
        (6, "enable_node_profiling", "nrt.u32", S, None),
    ],
    "file_chunk": [(1, "chunk", "bytes", S, None)],
    "shared_mem_buf": [(1, "path", "string", S, None)],
    "infer_io": [
        (1, "buf", "bytes", S, "data"),
        (2, "buf_shm", "nrt.shared_mem_buf", S, "data"),
        (3, "name", "string", S, None),
    ],
    "load_request": [
        (1, "h_eg", "nrt.h_eg", S, "content"),
        (2, "model_params", "nrt.model_params", S, "content"),
        (3, "neff_size", "uint64", S, "content"),
        (4, "neff_chunk", "nrt.file_chunk", S, "content"),
        (5, "neff_file", "string", S, "content"),
        (6, "session_id", "uint64", S, "content"),
    ],
    "load_response": [_status(), (2, "h_nn", "nrt.h_nn", S, None)],
    "unload_request": [(1, "h_nn", "nrt.h_nn", S, None)],
    "start_request": [(1, "h_nn", "nrt.h_nn", S, None)],
    "stop_request": [(1, "h_nn", "nrt.h_nn", S, None)],
    "unload_response": [_status()],
    "start_response": [_status()],
    "stop_response": [_status()],
    "infer_request": [
        (1, "h_nn", "nrt.h_nn", S, None),
        (2, "ifmap", "nrt.infer_io", R, None),
        (3, "shm_ofmap", "nrt.infer_io", R, None),
        (4, "loop_end_value", "uint32", S, None),
    ],
    "infer_wait_request": [
        (1, "cookie", "uint64", S, None),
        (2, "shm_ofmap", "nrt.infer_io", R, None),
    ],
    "infer_response": [_status(), (3, "ofmap", "nrt.infer_io", R, None)],
    "infer_post_response": [_status(), (2, "cookie", "uint64", S, None)],
    "infer_check_completion_request": [(1, "cookie", "uint64", R, None)],
    "infer_check_completion_response": [_status(), (2, "cookie", "uint64", R, None)],
    "create_eg_request": [
        (1, "nc_count", "uint32", S, None),
        (2, "session_id", "uint64", S, None),
    ],
    "create_eg_response": [
        _status(),
        (2, "h_eg", "nrt.h_eg", S, None),
        (3, "nc_count", "uint32", S, None),
    ],
    "destroy_eg_request": [(1, "h_eg", "nrt.h_eg", S, None)],
    "destroy_eg_response": [_status()],
    "eg_info": [
        (1, "eg", "nrt.h_eg", S, None),
        (2, "vnc_start_index", "uint32", S, None),
        (3, "nc_count", "uint32", S, None),
        (4, "mla_start_index", "uint32", S, None),
        (5, "nc_start_index", "uint32", S, None),
    ],
    "out_list_egs": [
        (1, "eg_info", "nrt.eg_info", R, None),
        (2, "mla_count", "uint32", S, None),
        (3, "nc_count", "uint32", S, None),
        _status(4),
    ],
    "hugetlb_shm": [(1, "path", "string", S, None), (2, "size", "uint32", S, None)],
    "shm_map_request": [
        (1, "path", "string", S, "data"),
        (2, "mmap_prot", "uint32", S, None),
        (3, "path_hugetlb", "nrt.hugetlb_shm", S, "data"),
        (4, "session_id", "uint64", S, None),
    ],
    "shm_map_response": [_status()],
    "shm_unmap_request": [(1, "path", "string", S, None), (2, "mmap_prot", "uint32", S, None)],
    "shm_unmap_response": [_status()],
    "nc_counters": [
        (1, "virtual_nc_id", "uint32", S, None),
        (2, "pe_num_idle_cycles", "uint64", S, None),
        (3, "pe_num_wait_event_cycles", "uint64", S, None),
        (4, "pe_matmul_num_wait_event_cycles", "uint64", S, None),
        (5, "pe_num_executed_instr", "uint64", S, None),
        (6, "pe_matmul_num_executed_instr", "uint64", S, None),
        (7, "pool_num_idle_cycles", "uint64", S, None),
        (8, "pool_num_wait_event_cycles", "uint64", S, None),
        (9, "pool_num_executed_instr", "uint64", S, None),
        (10, "act_num_idle_cycles", "uint64", S, None),
        (11, "act_num_wait_event_cycles", "uint64", S, None),
        (12, "act_num_executed_instr", "uint64", S, None),
        (13, "sb_rmw_count", "uint64", S, None),
        (14, "macs_count", "uint64", S, None),
    ],
    "infer_error_subtype_count": [
        (1, "error_subtype", "nrt.infer_error_subtype", S, None),
        (2, "count", "uint32", S, None),
    ],
    "infer_status_counts": [
        (1, "infer_status", "nrt.infer_status", S, None),
        (2, "count", "uint32", S, None),
    ],
    "nmgr_counters": [
        # The spec names only the types of fields 1 and 2; the names are ours.
        (1, "infer_error_subtype_counts", "nrt.infer_error_subtype_count", R, None),
        (2, "infer_status_counts", "nrt.infer_status_counts", R, None),
        (3, "infer_queue_drop_count", "uint64", S, None),
        (4, "infer_count", "uint64", S, None),
        (5, "model_start_count", "uint64", S, None),
        (6, "model_stop_count", "uint64", S, None),
        (7, "model_load_count", "uint64", S, None),
        (8, "model_unload_count", "uint64", S, None),
        (9, "neff_version_max_major", "uint64", S, None),
        (10, "neff_version_max_minor", "uint64", S, None),
        (11, "neff_version_min_major", "uint64", S, None),
        (12, "neff_version_min_minor", "uint64", S, None),
        (13, "neff_size_bytes_max", "uint64", S, None),
        (14, "neff_num_ncs_max", "uint64", S, None),
    ],
    "memory_counters": [
        (1, "infa_id", "uint32", S, None),
        (2, "mem_used_host", "uint64", S, None),
        (3, "mem_used_infa_0", "uint64", S, None),
        (4, "mem_used_infa_1", "uint64", S, None),
    ],
    "system_counters": [
        (1, "num_logs_error", "uint64", S, None),
        (2, "num_logs_warning", "uint64", S, None),
        (3, "memory_counters", "nrt.memory_counters", R, None),
    ],
    "aggregate": [
        (1, "min", "double", S, None),
        (2, "max", "double", S, None),
        (3, "count", "double", S, None),
        (4, "sum", "double", S, None),
        (5, "values", "double", R, None),
        (6, "counts", "uint32", R, None),
    ],
    "metric_data": [
        (1, "ts_nanos_since_epoch", "uint64", S, None),
        (2, "value_double", "double", S, "value"),
        (3, "value_agg", "nrt.aggregate", S, "value"),
    ],
    "metric": [
        (2, "metric_type", "nrt.metric_type", S, None),
        (3, "data", "nrt.metric_data", R, None),
        (4, "overflow", "bool", S, None),
    ],
    "read_all_metrics_request": [(1, "summarize_period", "uint32", S, None)],
    "read_all_metrics_response": [(1, "nmgr_metrics", "nrt.metric", R, None), _status(2)],
    "read_nc_counters_request": [(1, "vnc_id", "uint32", S, None)],
    "read_nc_counters_response": [(1, "nc_counters", "nrt.nc_counters", S, None), _status(2)],
    "read_inference_counters_response": [(1, "nmgr_counters", "nrt.nmgr_counters", S, None)],
    "read_all_counters_request": [],
    "read_all_counters_response": [
        (2, "nc_counters", "nrt.nc_counters", R, None),
        (4, "nmgr_counters", "nrt.nmgr_counters", S, None),
        (5, "system_counters", "nrt.system_counters", S, None),
        _status(6),
    ],
    "hw_counters": [
        (1, "bdf", "string", S, None),
        (2, "device_index", "uint32", S, None),
        (3, "mem_ecc_corr", "uint32", S, None),
        (4, "mem_ecc_uncorr", "uint32", S, None),
        (5, "sram_ecc_corr", "uint32", S, None),
        (6, "sram_ecc_uncorr", "uint32", S, None),
        (7, "transfer_adjustment_cnt", "uint32", S, None),
    ],
    "get_hw_counters_request": [
        (1, "bdf", "string", S, "device"),
        (2, "device_id", "uint32", S, "device"),
    ],
    "get_hw_counters_response": [(1, "counters", "nrt.hw_counters", S, None), _status(2)],
    "get_all_hw_counters_response": [(1, "counters", "nrt.hw_counters", R, None), _status(2)],
    "random_seed_request": [(1, "h_eg", "nrt.h_eg", S, None), (2, "seed", "uint32", S, None)],
    "random_seed_response": [_status()],
    "get_version_request": [
        (1, "framework_name", "string", S, None),
        (2, "framework_version", "nrt.version", S, None),
        (3, "fal_version", "nrt.version", S, None),
    ],
    "get_version_response": [(1, "runtime_version", "nrt.version", S, None)],
    "nc_time_in_use": [
        (1, "virtual_nc_id", "uint32", S, None),
        (2, "time_in_use", "uint64", S, None),
    ],
    "read_nc_time_in_use_request": [(1, "vnc_id", "uint32", S, None)],
    "read_nc_time_in_use_response": [
        (1, "nc_time_in_use", "nrt.nc_time_in_use", S, None),
        _status(2),
    ],
    "set_static_transfer_adjustment_request": [(1, "transfer_adjust_cnt", "uint32", S, None)],
    "set_static_transfer_adjustment_response": [_status()],
}

# Field numbers the spec skips; the .proto marks them reserved so they are never reused.
NRT_RESERVED: dict[str, set[int]] = {
    "infer_response": {2},
    "read_all_counters_response": {3},
    "metric": {1},
}

NRT_ENUMS: dict[str, dict[str, int]] = {
    "nc_engine_type": {
        "nc_engine_type_pe": 0,
        "nc_engine_type_act": 1,
        "nc_engine_type_pool": 2,
    },
    "nerr": {
        "NERR_OK": 0,
        "NERR_FAIL": 1,
        "NERR_INVALID": 2,
        "NERR_INVALID_HANDLE": 3,
        "NERR_RESOURCE": 4,
        "NERR_TIMEOUT": 5,
        "NERR_HW_ERROR": 6,
        "NERR_QUEUE_FULL": 7,
        "NERR_FAILED_STATE": 8,
        "NERR_RESOURCE_NC": 9,
        "NERR_UNSUPPORTED_VERSION": 10,
        "NERR_INFER_PENDING": 1000,
        "NERR_INFER_CANCELLED": 1001,
        "NERR_INFER_BAD_INPUT": 1002,
        "NERR_INFER_COMPLETED_WITH_NUM_ERR": 1003,
        "NERR_INFER_COMPLETED_WITH_ERR": 1004,
    },
    "infer_status": {
        "IST_OK": 0,
        "IST_COMPLETED_WITH_NUM_ERR": 1,
        "IST_COMPLETED_WITH_ERR": 2,
        "IST_BAD_INPUT": 3,
        "IST_TIMEOUT": 4,
        "IST_UNKNOWN": 15,
    },
    "infer_error_subtype": {
        "INFER_ERROR_SUBTYPE_NONE": 0,
        "INFER_ERROR_SUBTYPE_NUMERICAL": 1,
        "INFER_ERROR_SUBTYPE_MODEL": 2,
        "INFER_ERROR_SUBTYPE_TRANSIENT": 3,
        "INFER_ERROR_SUBTYPE_HW_ERROR": 4,
        "INFER_ERROR_SUBTYPE_RT": 5,
    },
    "metric_type": {
        "NMGR_METRIC_INFER_LATENCY": 0,
        "NMGR_METRIC_INFER_ON_INFA_LATENCY": 1,
        "NMGR_METRIC_MODEL_START_LATENCY": 2,
        "NMGR_METRIC_MODEL_STOP_LATENCY": 3,
        "NMGR_METRIC_MODEL_LOAD_LATENCY": 4,
        "NMGR_METRIC_MODEL_UNLOAD_LATENCY": 5,
        "NMGR_METRIC_MODEL_SIZE": 6,
        "NMGR_METRIC_MODEL_NUM_NC": 7,
        "NMGR_METRIC_MODEL_MAJOR_VERSION": 8,
        "NMGR_METRIC_INFER_ON_INFA_CYCLESx1k": 9,
        "NMGR_METRIC_NUM": 10,
    },
}

# method name -> (request type, response type, client streams, server streams)
Method = tuple[str, str, bool, bool]


def _unary(request: str, response: str) -> Method:
    return (f"nrt.{request}", f"nrt.{response}", False, False)


NRT_SERVICES: dict[str, dict[str, Method]] = {
    "nmgr_v1": {
        "load": ("nrt.load_request", "nrt.load_response", True, False),
        "unload": _unary("unload_request", "unload_response"),
        "start": _unary("start_request", "start_response"),
        "stop": _unary("stop_request", "stop_response"),
        "infer": _unary("infer_request", "infer_response"),
        "infer_post": _unary("infer_request", "infer_post_response"),
        "infer_wait": _unary("infer_wait_request", "infer_response"),
        "infer_poll": _unary("infer_wait_request", "infer_response"),
        "infer_check_completion": _unary(
            "infer_check_completion_request", "infer_check_completion_response"
        ),
        "create_eg": _unary("create_eg_request", "create_eg_response"),
        "destroy_eg": _unary("destroy_eg_request", "destroy_eg_response"),
        "list_egs": _unary("empty", "out_list_egs"),
        "read_nc_counters": _unary("read_nc_counters_request", "read_nc_counters_response"),
        "read_nc_time_in_use": _unary(
            "read_nc_time_in_use_request", "read_nc_time_in_use_response"
        ),
        "read_inference_counters": _unary("empty", "read_inference_counters_response"),
        "read_all_counters": _unary("read_all_counters_request", "read_all_counters_response"),
        "read_all_metrics": _unary("read_all_metrics_request", "read_all_metrics_response"),
        "shm_map": _unary("shm_map_request", "shm_map_response"),
        "shm_unmap": _unary("shm_unmap_request", "shm_unmap_response"),
        "get_hw_counters": _unary("get_hw_counters_request", "get_hw_counters_response"),
        "get_all_hw_counters": _unary("empty", "get_all_hw_counters_response"),
        "unload_all": _unary("empty", "status"),
        "random_seed": _unary("random_seed_request", "random_seed_response"),
        "get_version": _unary("get_version_request", "get_version_response"),
        "set_static_transfer_adjustment": _unary(
            "set_static_transfer_adjustment_request", "set_static_transfer_adjustment_response"
        ),
    },
    "nmgr_session_manager": {
        "session_monitor": (
            "nrt.session_monitor_request",
            "nrt.session_monitor_response",
            True,
            True,
        ),
    },
    "nmgr_stream": {
        "infer_stream": ("nrt.infer_request", "nrt.infer_response", True, True),
    },
}

# --- package nrt.ext (ext.proto): our own service ---------------------------------------

EXT_MESSAGES: dict[str, list[Field]] = {
    "describe_request": [],
    "ext_device": [
        (1, "index", "uint32", S, None),
        (2, "bdf", "string", S, None),
        (3, "nc_count", "uint32", S, None),
        (4, "memory_bytes", "uint64", S, None),
        (5, "memory_used", "uint64", S, None),
        (6, "hw_counters", "nrt.ext.ext_hw_counters", S, None),
    ],
    "ext_hw_counters": [
        (1, "mem_ecc_corr", "uint64", S, None),
        (2, "mem_ecc_uncorr", "uint64", S, None),
        (3, "sram_ecc_corr", "uint64", S, None),
        (4, "sram_ecc_uncorr", "uint64", S, None),
        (5, "nc_errors", "uint64", S, None),
        (6, "nc_hangs", "uint64", S, None),
        (7, "dma_timeouts", "uint64", S, None),
        (8, "init_failures", "uint64", S, None),
    ],
    "describe_response": [
        (1, "runtime_version", "string", S, None),
        (2, "pid", "uint32", S, None),
        (3, "address", "string", S, None),
        (4, "sim_root", "string", S, None),
        (5, "instance_type", "string", S, None),
        (6, "devices", "nrt.ext.ext_device", R, None),
        (7, "start_time_ns", "uint64", S, None),
        (8, "status_code", "int32", S, None),
        (9, "details", "string", S, None),
        (10, "peer_socket", "string", S, None),
    ],
    "peer_request": [
        (1, "shm_share", "nrt.ext.shm_share_request", S, "what"),
        (2, "ticket", "nrt.ext.peer_ticket_request", S, "what"),
        (3, "infer", "nrt.ext.peer_infer_request", S, "what"),
    ],
    "peer_infer_request": [
        (1, "session_id", "uint64", S, None),
        (2, "infer_request", "bytes", S, None),
    ],
    "shm_share_request": [
        (1, "session_id", "uint64", S, None),
        (2, "path", "string", S, None),
        (3, "mmap_prot", "uint32", S, None),
    ],
    "peer_ticket_request": [],
    "peer_response": [
        (1, "status_code", "int32", S, None),
        (2, "details", "string", S, None),
        (3, "ticket", "uint64", S, None),
        (4, "infer_response", "bytes", S, None),
    ],
    "create_ncg_request": [
        (1, "nc_count", "uint32", S, None),
        (2, "session_id", "uint64", S, None),
        (3, "visible_ncs", "uint32", R, None),
        (4, "implicit", "bool", S, None),
    ],
    "create_ncg_response": [
        (1, "status_code", "int32", S, None),
        (2, "details", "string", S, None),
        (3, "ncg_id", "uint32", S, None),
        (4, "nc_count", "uint32", S, None),
        (5, "first_nc", "uint32", S, None),
    ],
    "snapshot_request": [],
    "ext_nc": [
        (1, "vnc", "uint32", S, None),
        (2, "device_index", "uint32", S, None),
        (3, "nc_index", "uint32", S, None),
        (4, "busy_ns", "uint64", S, None),
        (5, "ncg_id", "uint32", S, None),
    ],
    "ext_ncg": [
        (1, "id", "uint32", S, None),
        (2, "vnc_start", "uint32", S, None),
        (3, "nc_count", "uint32", S, None),
        (4, "device_index", "uint32", S, None),
        (5, "implicit", "bool", S, None),
        (7, "model_ids", "uint32", R, None),
        (8, "session", "string", S, None),
    ],
    "ext_infer_tally": [
        (1, "completed", "uint64", S, None),
        (2, "completed_with_err", "uint64", S, None),
        (3, "completed_with_num_err", "uint64", S, None),
        (4, "timed_out", "uint64", S, None),
        (5, "incorrect_input", "uint64", S, None),
        (6, "failed_to_queue", "uint64", S, None),
        (7, "cancelled", "uint64", S, None),
    ],
    "ext_model": [
        (1, "id", "uint32", S, None),
        (2, "name", "string", S, None),
        (3, "ncg_id", "uint32", S, None),
        (4, "state", "string", S, None),
        (5, "mode", "string", S, None),
        (6, "vncs", "uint32", R, None),
        (7, "device_bytes", "uint64", S, None),
        (8, "host_bytes", "uint64", S, None),
        (9, "ninfer", "uint32", S, None),
        (10, "timeout_s", "double", S, None),
        (11, "in_flight", "uint32", S, None),
        (13, "tally", "nrt.ext.ext_infer_tally", S, None),
        (14, "failure", "string", S, None),
        (15, "nc_count", "uint32", S, None),
        (16, "inputs", "nrt.ext.ext_tensor", R, None),
        (17, "outputs", "nrt.ext.ext_tensor", R, None),
        (18, "session", "string", S, None),
    ],
    "ext_tensor": [
        (1, "name", "string", S, None),
        (2, "dtype", "string", S, None),
        (3, "shape", "int64", R, None),
    ],
    "ext_histogram": [
        (1, "bounds_us", "double", R, None),
        (2, "counts", "uint64", R, None),
        (3, "total", "uint64", S, None),
        (4, "sum_us", "double", S, None),
    ],
    "snapshot_response": [
        (1, "time_ns", "uint64", S, None),
        (2, "cpu_user_s", "double", S, None),
        (3, "cpu_system_s", "double", S, None),
        (4, "rss_bytes", "uint64", S, None),
        (5, "ncs", "nrt.ext.ext_nc", R, None),
        (6, "ncgs", "nrt.ext.ext_ncg", R, None),
        (7, "models", "nrt.ext.ext_model", R, None),
        (8, "latency", "nrt.ext.ext_histogram", S, None),
        (9, "nc_latency", "nrt.ext.ext_histogram", S, None),
        (10, "status_code", "int32", S, None),
        (11, "details", "string", S, None),
    ],
    "profile_request": [
        (1, "model_id", "uint32", S, None),
        (2, "last", "uint32", S, None),
    ],
    "profile_shape": [(1, "dims", "int64", R, None)],
    "profile_instr": [
        (1, "index", "uint32", S, None),
        (2, "op", "string", S, None),
        (3, "engine", "string", S, None),
        (4, "input_shapes", "nrt.ext.profile_shape", R, None),
        (5, "output_shapes", "nrt.ext.profile_shape", R, None),
        (6, "start_ns", "uint64", S, None),
        (7, "host_ns", "uint64", S, None),
        (8, "macs", "uint64", S, None),
        (9, "cycles", "uint64", S, None),
    ],
    "profile_step": [
        (1, "node", "string", S, None),
        (2, "stage", "uint32", S, None),
        (3, "vnc", "int32", S, None),
        (4, "start_ns", "uint64", S, None),
        (5, "host_ns", "uint64", S, None),
        (6, "cycles", "uint64", S, None),
        (7, "instrs", "nrt.ext.profile_instr", R, None),
        (8, "input_shapes", "nrt.ext.profile_shape", R, None),
        (9, "output_shapes", "nrt.ext.profile_shape", R, None),
    ],
    "profile_inference": [
        (1, "seq", "uint64", S, None),
        (2, "time_ns", "uint64", S, None),
        (3, "host_ns", "uint64", S, None),
        (4, "cycles", "uint64", S, None),
        (5, "steps", "nrt.ext.profile_step", R, None),
    ],
    "profile_response": [
        (1, "status_code", "int32", S, None),
        (2, "details", "string", S, None),
        (3, "model_id", "uint32", S, None),
        (4, "model_name", "string", S, None),
        (5, "nc_clock_hz", "uint64", S, None),
        (6, "recorded", "uint64", S, None),
        (7, "inferences", "nrt.ext.profile_inference", R, None),
    ],
}

EXT_SERVICES: dict[str, dict[str, Method]] = {
    "nmgr_ext": {
        "describe": ("nrt.ext.describe_request", "nrt.ext.describe_response", False, False),
        "snapshot": ("nrt.ext.snapshot_request", "nrt.ext.snapshot_response", False, False),
        "profile": ("nrt.ext.profile_request", "nrt.ext.profile_response", False, False),
        "create_ncg": (
            "nrt.ext.create_ncg_request",
            "nrt.ext.create_ncg_response",
            False,
            False,
        ),
    },
}

# --- helpers ----------------------------------------------------------------------------

_SCALAR_NAMES = {
    getattr(FieldDescriptor, name): name.removeprefix("TYPE_").lower()
    for name in dir(FieldDescriptor)
    if name.startswith("TYPE_")
}


def _type_name(field: FieldDescriptor) -> str:
    if field.message_type is not None:
        return str(field.message_type.full_name)
    if field.enum_type is not None:
        return str(field.enum_type.full_name)
    return _SCALAR_NAMES[field.type]


def _actual_fields(file: FileDescriptor, message: str) -> set[Field]:
    desc = file.message_types_by_name[message]
    return {
        (
            f.number,
            f.name,
            _type_name(f),
            bool(f.is_repeated),
            f.containing_oneof.name if f.containing_oneof is not None else None,
        )
        for f in desc.fields
    }


def _enum_values(enum: EnumDescriptor) -> dict[str, int]:
    return {v.name: v.number for v in enum.values}


def _actual_methods(service: ServiceDescriptor) -> dict[str, Method]:
    return {
        m.name: (
            m.input_type.full_name,
            m.output_type.full_name,
            bool(m.client_streaming),
            bool(m.server_streaming),
        )
        for m in service.methods
    }


# --- nrt: messages, enums, services -----------------------------------------------------


def test_package_and_syntax() -> None:
    assert pb.DESCRIPTOR.package == "nrt"
    assert pb.DESCRIPTOR.name == "nrt/nmgr.proto"
    assert ext_pb.DESCRIPTOR.package == "nrt.ext"
    assert ext_pb.DESCRIPTOR.name == "nrt/ext.proto"
    for file in (pb.DESCRIPTOR, ext_pb.DESCRIPTOR):
        file_proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(file_proto)
        assert file_proto.syntax == "proto3"


def test_ext_proto_is_self_contained() -> None:
    assert list(ext_pb.DESCRIPTOR.dependencies) == []


@pytest.mark.parametrize("message", sorted(NRT_MESSAGES))
def test_nrt_message_fields(message: str) -> None:
    assert _actual_fields(pb.DESCRIPTOR, message) == set(NRT_MESSAGES[message])


@pytest.mark.parametrize("enum", sorted(NRT_ENUMS))
def test_nrt_enum_values(enum: str) -> None:
    assert _enum_values(pb.DESCRIPTOR.enum_types_by_name[enum]) == NRT_ENUMS[enum]


def test_table_covers_every_nrt_message_and_enum() -> None:
    assert set(pb.DESCRIPTOR.message_types_by_name) == set(NRT_MESSAGES)
    assert set(pb.DESCRIPTOR.enum_types_by_name) == set(NRT_ENUMS)
    for message in pb.DESCRIPTOR.message_types_by_name.values():
        assert list(message.nested_types) == [], message.full_name
        assert list(message.enum_types) == [], message.full_name


def test_nrt_reserved_field_numbers() -> None:
    file_proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(file_proto)
    reserved = {
        m.name: {n for r in m.reserved_range for n in range(r.start, r.end)}
        for m in file_proto.message_type
        if m.reserved_range
    }
    assert reserved == NRT_RESERVED


def test_nrt_services() -> None:
    assert set(pb.DESCRIPTOR.services_by_name) == set(NRT_SERVICES)
    for name, methods in NRT_SERVICES.items():
        service = pb.DESCRIPTOR.services_by_name[name]
        assert service.full_name == f"nrt.{name}"
        assert _actual_methods(service) == methods, name


# --- nrt.ext ----------------------------------------------------------------------------


@pytest.mark.parametrize("message", sorted(EXT_MESSAGES))
def test_ext_message_fields(message: str) -> None:
    assert _actual_fields(ext_pb.DESCRIPTOR, message) == set(EXT_MESSAGES[message])


def test_ext_covers_every_message_and_service() -> None:
    assert set(ext_pb.DESCRIPTOR.message_types_by_name) == set(EXT_MESSAGES)
    assert set(ext_pb.DESCRIPTOR.enum_types_by_name) == set()
    assert set(ext_pb.DESCRIPTOR.services_by_name) == set(EXT_SERVICES)
    for name, methods in EXT_SERVICES.items():
        service = ext_pb.DESCRIPTOR.services_by_name[name]
        assert _actual_methods(service) == methods


# --- the service-name constants and the generated gRPC code -----------------------------


def test_service_name_constants() -> None:
    constants = {
        (pb, "nmgr_v1"): proto.NMGR_V1,
        (pb, "nmgr_session_manager"): proto.NMGR_SESSION_MANAGER,
        (pb, "nmgr_stream"): proto.NMGR_STREAM,
        (ext_pb, "nmgr_ext"): proto.NMGR_EXT,
    }
    for (module, service), constant in constants.items():
        assert module.DESCRIPTOR.services_by_name[service].full_name == constant


_CALLABLE_KIND = {
    (False, False): "unary_unary",
    (True, False): "stream_unary",
    (False, True): "unary_stream",
    (True, True): "stream_stream",
}


class _RecordingChannel:
    """Stands in for grpc.Channel: records the path and kind of each multi-callable."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}

    def _record(self, kind: str) -> Any:
        def make(path: str, **_: Any) -> None:
            self.paths[path] = kind

        return make

    def __getattr__(self, kind: str) -> Any:
        if kind not in _CALLABLE_KIND.values():
            raise AttributeError(kind)
        return self._record(kind)


_STUBS = [
    (pb_grpc.nmgr_v1Stub, proto.NMGR_V1, NRT_SERVICES["nmgr_v1"]),
    (
        pb_grpc.nmgr_session_managerStub,
        proto.NMGR_SESSION_MANAGER,
        NRT_SERVICES["nmgr_session_manager"],
    ),
    (pb_grpc.nmgr_streamStub, proto.NMGR_STREAM, NRT_SERVICES["nmgr_stream"]),
    (ext_pb_grpc.nmgr_extStub, proto.NMGR_EXT, EXT_SERVICES["nmgr_ext"]),
]


@pytest.mark.parametrize(("stub_class", "service", "methods"), _STUBS)
def test_stub_http2_paths(stub_class: Any, service: str, methods: dict[str, Method]) -> None:
    channel = _RecordingChannel()
    stub_class(channel)
    expected = {
        f"/{service}/{name}": _CALLABLE_KIND[(client_streams, server_streams)]
        for name, (_, _, client_streams, server_streams) in methods.items()
    }
    assert channel.paths == expected


def test_load_path() -> None:
    channel = _RecordingChannel()
    pb_grpc.nmgr_v1Stub(channel)
    assert channel.paths["/nrt.nmgr_v1/load"] == "stream_unary"


class _RecordingServer:
    """Stands in for grpc.Server: records the method handlers a servicer registers."""

    def __init__(self) -> None:
        self.handlers: dict[str, dict[str, grpc.RpcMethodHandler]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.handlers[service] = handlers


_SERVICERS = [
    (pb_grpc.add_nmgr_v1Servicer_to_server, pb_grpc.nmgr_v1Servicer, proto.NMGR_V1, "nmgr_v1"),
    (
        pb_grpc.add_nmgr_session_managerServicer_to_server,
        pb_grpc.nmgr_session_managerServicer,
        proto.NMGR_SESSION_MANAGER,
        "nmgr_session_manager",
    ),
    (
        pb_grpc.add_nmgr_streamServicer_to_server,
        pb_grpc.nmgr_streamServicer,
        proto.NMGR_STREAM,
        "nmgr_stream",
    ),
    (
        ext_pb_grpc.add_nmgr_extServicer_to_server,
        ext_pb_grpc.nmgr_extServicer,
        proto.NMGR_EXT,
        "nmgr_ext",
    ),
]


@pytest.mark.parametrize(("add", "servicer_class", "service", "short"), _SERVICERS)
def test_servicer_registration(add: Any, servicer_class: Any, service: str, short: str) -> None:
    methods = {**NRT_SERVICES, **EXT_SERVICES}[short]
    server = _RecordingServer()
    add(servicer_class(), server)
    handlers = server.handlers[service]
    assert {
        name: (bool(h.request_streaming), bool(h.response_streaming))
        for name, h in handlers.items()
    } == {name: (m[2], m[3]) for name, m in methods.items()}


def test_the_docs_page_names_every_method() -> None:
    page = (Path(__file__).parents[2] / "docs" / "wire-api.md").read_text()
    for file in (pb.DESCRIPTOR, ext_pb.DESCRIPTOR):
        for service in file.services_by_name.values():
            assert f"`{service.full_name}`" in page, service.full_name
            for method in service.methods:
                assert f"`{method.name}`" in page, f"{service.full_name}.{method.name}"
    assert "../shared" not in page
