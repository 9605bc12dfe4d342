from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class nc_engine_type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    nc_engine_type_pe: _ClassVar[nc_engine_type]
    nc_engine_type_act: _ClassVar[nc_engine_type]
    nc_engine_type_pool: _ClassVar[nc_engine_type]

class nerr(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NERR_OK: _ClassVar[nerr]
    NERR_FAIL: _ClassVar[nerr]
    NERR_INVALID: _ClassVar[nerr]
    NERR_INVALID_HANDLE: _ClassVar[nerr]
    NERR_RESOURCE: _ClassVar[nerr]
    NERR_TIMEOUT: _ClassVar[nerr]
    NERR_HW_ERROR: _ClassVar[nerr]
    NERR_QUEUE_FULL: _ClassVar[nerr]
    NERR_FAILED_STATE: _ClassVar[nerr]
    NERR_RESOURCE_NC: _ClassVar[nerr]
    NERR_UNSUPPORTED_VERSION: _ClassVar[nerr]
    NERR_INFER_PENDING: _ClassVar[nerr]
    NERR_INFER_CANCELLED: _ClassVar[nerr]
    NERR_INFER_BAD_INPUT: _ClassVar[nerr]
    NERR_INFER_COMPLETED_WITH_NUM_ERR: _ClassVar[nerr]
    NERR_INFER_COMPLETED_WITH_ERR: _ClassVar[nerr]

class infer_status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IST_OK: _ClassVar[infer_status]
    IST_COMPLETED_WITH_NUM_ERR: _ClassVar[infer_status]
    IST_COMPLETED_WITH_ERR: _ClassVar[infer_status]
    IST_BAD_INPUT: _ClassVar[infer_status]
    IST_TIMEOUT: _ClassVar[infer_status]
    IST_UNKNOWN: _ClassVar[infer_status]

class infer_error_subtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INFER_ERROR_SUBTYPE_NONE: _ClassVar[infer_error_subtype]
    INFER_ERROR_SUBTYPE_NUMERICAL: _ClassVar[infer_error_subtype]
    INFER_ERROR_SUBTYPE_MODEL: _ClassVar[infer_error_subtype]
    INFER_ERROR_SUBTYPE_TRANSIENT: _ClassVar[infer_error_subtype]
    INFER_ERROR_SUBTYPE_HW_ERROR: _ClassVar[infer_error_subtype]
    INFER_ERROR_SUBTYPE_RT: _ClassVar[infer_error_subtype]

class metric_type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NMGR_METRIC_INFER_LATENCY: _ClassVar[metric_type]
    NMGR_METRIC_INFER_ON_INFA_LATENCY: _ClassVar[metric_type]
    NMGR_METRIC_MODEL_START_LATENCY: _ClassVar[metric_type]
    NMGR_METRIC_MODEL_STOP_LATENCY: _ClassVar[metric_type]
    NMGR_METRIC_MODEL_LOAD_LATENCY: _ClassVar[metric_type]
    NMGR_METRIC_MODEL_UNLOAD_LATENCY: _ClassVar[metric_type]
    NMGR_METRIC_MODEL_SIZE: _ClassVar[metric_type]
    NMGR_METRIC_MODEL_NUM_NC: _ClassVar[metric_type]
    NMGR_METRIC_MODEL_MAJOR_VERSION: _ClassVar[metric_type]
    NMGR_METRIC_INFER_ON_INFA_CYCLESx1k: _ClassVar[metric_type]
    NMGR_METRIC_NUM: _ClassVar[metric_type]
nc_engine_type_pe: nc_engine_type
nc_engine_type_act: nc_engine_type
nc_engine_type_pool: nc_engine_type
NERR_OK: nerr
NERR_FAIL: nerr
NERR_INVALID: nerr
NERR_INVALID_HANDLE: nerr
NERR_RESOURCE: nerr
NERR_TIMEOUT: nerr
NERR_HW_ERROR: nerr
NERR_QUEUE_FULL: nerr
NERR_FAILED_STATE: nerr
NERR_RESOURCE_NC: nerr
NERR_UNSUPPORTED_VERSION: nerr
NERR_INFER_PENDING: nerr
NERR_INFER_CANCELLED: nerr
NERR_INFER_BAD_INPUT: nerr
NERR_INFER_COMPLETED_WITH_NUM_ERR: nerr
NERR_INFER_COMPLETED_WITH_ERR: nerr
IST_OK: infer_status
IST_COMPLETED_WITH_NUM_ERR: infer_status
IST_COMPLETED_WITH_ERR: infer_status
IST_BAD_INPUT: infer_status
IST_TIMEOUT: infer_status
IST_UNKNOWN: infer_status
INFER_ERROR_SUBTYPE_NONE: infer_error_subtype
INFER_ERROR_SUBTYPE_NUMERICAL: infer_error_subtype
INFER_ERROR_SUBTYPE_MODEL: infer_error_subtype
INFER_ERROR_SUBTYPE_TRANSIENT: infer_error_subtype
INFER_ERROR_SUBTYPE_HW_ERROR: infer_error_subtype
INFER_ERROR_SUBTYPE_RT: infer_error_subtype
NMGR_METRIC_INFER_LATENCY: metric_type
NMGR_METRIC_INFER_ON_INFA_LATENCY: metric_type
NMGR_METRIC_MODEL_START_LATENCY: metric_type
NMGR_METRIC_MODEL_STOP_LATENCY: metric_type
NMGR_METRIC_MODEL_LOAD_LATENCY: metric_type
NMGR_METRIC_MODEL_UNLOAD_LATENCY: metric_type
NMGR_METRIC_MODEL_SIZE: metric_type
NMGR_METRIC_MODEL_NUM_NC: metric_type
NMGR_METRIC_MODEL_MAJOR_VERSION: metric_type
NMGR_METRIC_INFER_ON_INFA_CYCLESx1k: metric_type
NMGR_METRIC_NUM: metric_type

class status(_message.Message):
    __slots__ = ("code", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    details: bytes
    def __init__(self, code: _Optional[int] = ..., details: _Optional[bytes] = ...) -> None: ...

class return_code(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: int
    def __init__(self, data: _Optional[int] = ...) -> None: ...

class h_nn(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class h_eg(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class h_model(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class version(_message.Message):
    __slots__ = ("full_version", "major_num", "minor_num")
    FULL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAJOR_NUM_FIELD_NUMBER: _ClassVar[int]
    MINOR_NUM_FIELD_NUMBER: _ClassVar[int]
    full_version: str
    major_num: int
    minor_num: int
    def __init__(self, full_version: _Optional[str] = ..., major_num: _Optional[int] = ..., minor_num: _Optional[int] = ...) -> None: ...

class u32(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: int
    def __init__(self, data: _Optional[int] = ...) -> None: ...

class address(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: int
    def __init__(self, data: _Optional[int] = ...) -> None: ...

class empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class session_monitor_request(_message.Message):
    __slots__ = ("framework_name", "framework_version", "fal_version")
    FRAMEWORK_NAME_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORK_VERSION_FIELD_NUMBER: _ClassVar[int]
    FAL_VERSION_FIELD_NUMBER: _ClassVar[int]
    framework_name: str
    framework_version: version
    fal_version: version
    def __init__(self, framework_name: _Optional[str] = ..., framework_version: _Optional[_Union[version, _Mapping]] = ..., fal_version: _Optional[_Union[version, _Mapping]] = ...) -> None: ...

class session_monitor_response(_message.Message):
    __slots__ = ("session_id", "runtime_version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    runtime_version: version
    def __init__(self, session_id: _Optional[int] = ..., runtime_version: _Optional[_Union[version, _Mapping]] = ...) -> None: ...

class model_params(_message.Message):
    __slots__ = ("timeout", "ninfer", "enable_tracing", "io_data_host", "fmap_in_huge_tlb", "enable_node_profiling")
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    NINFER_FIELD_NUMBER: _ClassVar[int]
    ENABLE_TRACING_FIELD_NUMBER: _ClassVar[int]
    IO_DATA_HOST_FIELD_NUMBER: _ClassVar[int]
    FMAP_IN_HUGE_TLB_FIELD_NUMBER: _ClassVar[int]
    ENABLE_NODE_PROFILING_FIELD_NUMBER: _ClassVar[int]
    timeout: u32
    ninfer: u32
    enable_tracing: u32
    io_data_host: u32
    fmap_in_huge_tlb: u32
    enable_node_profiling: u32
    def __init__(self, timeout: _Optional[_Union[u32, _Mapping]] = ..., ninfer: _Optional[_Union[u32, _Mapping]] = ..., enable_tracing: _Optional[_Union[u32, _Mapping]] = ..., io_data_host: _Optional[_Union[u32, _Mapping]] = ..., fmap_in_huge_tlb: _Optional[_Union[u32, _Mapping]] = ..., enable_node_profiling: _Optional[_Union[u32, _Mapping]] = ...) -> None: ...

class file_chunk(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: bytes
    def __init__(self, chunk: _Optional[bytes] = ...) -> None: ...

class shared_mem_buf(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class infer_io(_message.Message):
    __slots__ = ("buf", "buf_shm", "name")
    BUF_FIELD_NUMBER: _ClassVar[int]
    BUF_SHM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    buf: bytes
    buf_shm: shared_mem_buf
    name: str
    def __init__(self, buf: _Optional[bytes] = ..., buf_shm: _Optional[_Union[shared_mem_buf, _Mapping]] = ..., name: _Optional[str] = ...) -> None: ...

class load_request(_message.Message):
    __slots__ = ("h_eg", "model_params", "neff_size", "neff_chunk", "neff_file", "session_id")
    H_EG_FIELD_NUMBER: _ClassVar[int]
    MODEL_PARAMS_FIELD_NUMBER: _ClassVar[int]
    NEFF_SIZE_FIELD_NUMBER: _ClassVar[int]
    NEFF_CHUNK_FIELD_NUMBER: _ClassVar[int]
    NEFF_FILE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    h_eg: h_eg
    model_params: model_params
    neff_size: int
    neff_chunk: file_chunk
    neff_file: str
    session_id: int
    def __init__(self, h_eg: _Optional[_Union[h_eg, _Mapping]] = ..., model_params: _Optional[_Union[model_params, _Mapping]] = ..., neff_size: _Optional[int] = ..., neff_chunk: _Optional[_Union[file_chunk, _Mapping]] = ..., neff_file: _Optional[str] = ..., session_id: _Optional[int] = ...) -> None: ...

class load_response(_message.Message):
    __slots__ = ("status", "h_nn")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    H_NN_FIELD_NUMBER: _ClassVar[int]
    status: status
    h_nn: h_nn
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ..., h_nn: _Optional[_Union[h_nn, _Mapping]] = ...) -> None: ...

class unload_request(_message.Message):
    __slots__ = ("h_nn",)
    H_NN_FIELD_NUMBER: _ClassVar[int]
    h_nn: h_nn
    def __init__(self, h_nn: _Optional[_Union[h_nn, _Mapping]] = ...) -> None: ...

class unload_response(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: status
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class start_request(_message.Message):
    __slots__ = ("h_nn",)
    H_NN_FIELD_NUMBER: _ClassVar[int]
    h_nn: h_nn
    def __init__(self, h_nn: _Optional[_Union[h_nn, _Mapping]] = ...) -> None: ...

class start_response(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: status
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class stop_request(_message.Message):
    __slots__ = ("h_nn",)
    H_NN_FIELD_NUMBER: _ClassVar[int]
    h_nn: h_nn
    def __init__(self, h_nn: _Optional[_Union[h_nn, _Mapping]] = ...) -> None: ...

class stop_response(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: status
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class infer_request(_message.Message):
    __slots__ = ("h_nn", "ifmap", "shm_ofmap", "loop_end_value")
    H_NN_FIELD_NUMBER: _ClassVar[int]
    IFMAP_FIELD_NUMBER: _ClassVar[int]
    SHM_OFMAP_FIELD_NUMBER: _ClassVar[int]
    LOOP_END_VALUE_FIELD_NUMBER: _ClassVar[int]
    h_nn: h_nn
    ifmap: _containers.RepeatedCompositeFieldContainer[infer_io]
    shm_ofmap: _containers.RepeatedCompositeFieldContainer[infer_io]
    loop_end_value: int
    def __init__(self, h_nn: _Optional[_Union[h_nn, _Mapping]] = ..., ifmap: _Optional[_Iterable[_Union[infer_io, _Mapping]]] = ..., shm_ofmap: _Optional[_Iterable[_Union[infer_io, _Mapping]]] = ..., loop_end_value: _Optional[int] = ...) -> None: ...

class infer_wait_request(_message.Message):
    __slots__ = ("cookie", "shm_ofmap")
    COOKIE_FIELD_NUMBER: _ClassVar[int]
    SHM_OFMAP_FIELD_NUMBER: _ClassVar[int]
    cookie: int
    shm_ofmap: _containers.RepeatedCompositeFieldContainer[infer_io]
    def __init__(self, cookie: _Optional[int] = ..., shm_ofmap: _Optional[_Iterable[_Union[infer_io, _Mapping]]] = ...) -> None: ...

class infer_response(_message.Message):
    __slots__ = ("status", "ofmap")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OFMAP_FIELD_NUMBER: _ClassVar[int]
    status: status
    ofmap: _containers.RepeatedCompositeFieldContainer[infer_io]
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ..., ofmap: _Optional[_Iterable[_Union[infer_io, _Mapping]]] = ...) -> None: ...

class infer_post_response(_message.Message):
    __slots__ = ("status", "cookie")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COOKIE_FIELD_NUMBER: _ClassVar[int]
    status: status
    cookie: int
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ..., cookie: _Optional[int] = ...) -> None: ...

class infer_check_completion_request(_message.Message):
    __slots__ = ("cookie",)
    COOKIE_FIELD_NUMBER: _ClassVar[int]
    cookie: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cookie: _Optional[_Iterable[int]] = ...) -> None: ...

class infer_check_completion_response(_message.Message):
    __slots__ = ("status", "cookie")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COOKIE_FIELD_NUMBER: _ClassVar[int]
    status: status
    cookie: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ..., cookie: _Optional[_Iterable[int]] = ...) -> None: ...

class create_eg_request(_message.Message):
    __slots__ = ("nc_count", "session_id")
    NC_COUNT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    nc_count: int
    session_id: int
    def __init__(self, nc_count: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class create_eg_response(_message.Message):
    __slots__ = ("status", "h_eg", "nc_count")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    H_EG_FIELD_NUMBER: _ClassVar[int]
    NC_COUNT_FIELD_NUMBER: _ClassVar[int]
    status: status
    h_eg: h_eg
    nc_count: int
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ..., h_eg: _Optional[_Union[h_eg, _Mapping]] = ..., nc_count: _Optional[int] = ...) -> None: ...

class destroy_eg_request(_message.Message):
    __slots__ = ("h_eg",)
    H_EG_FIELD_NUMBER: _ClassVar[int]
    h_eg: h_eg
    def __init__(self, h_eg: _Optional[_Union[h_eg, _Mapping]] = ...) -> None: ...

class destroy_eg_response(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: status
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class eg_info(_message.Message):
    __slots__ = ("eg", "vnc_start_index", "nc_count", "mla_start_index", "nc_start_index")
    EG_FIELD_NUMBER: _ClassVar[int]
    VNC_START_INDEX_FIELD_NUMBER: _ClassVar[int]
    NC_COUNT_FIELD_NUMBER: _ClassVar[int]
    MLA_START_INDEX_FIELD_NUMBER: _ClassVar[int]
    NC_START_INDEX_FIELD_NUMBER: _ClassVar[int]
    eg: h_eg
    vnc_start_index: int
    nc_count: int
    mla_start_index: int
    nc_start_index: int
    def __init__(self, eg: _Optional[_Union[h_eg, _Mapping]] = ..., vnc_start_index: _Optional[int] = ..., nc_count: _Optional[int] = ..., mla_start_index: _Optional[int] = ..., nc_start_index: _Optional[int] = ...) -> None: ...

class out_list_egs(_message.Message):
    __slots__ = ("eg_info", "mla_count", "nc_count", "status")
    EG_INFO_FIELD_NUMBER: _ClassVar[int]
    MLA_COUNT_FIELD_NUMBER: _ClassVar[int]
    NC_COUNT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    eg_info: _containers.RepeatedCompositeFieldContainer[eg_info]
    mla_count: int
    nc_count: int
    status: status
    def __init__(self, eg_info: _Optional[_Iterable[_Union[eg_info, _Mapping]]] = ..., mla_count: _Optional[int] = ..., nc_count: _Optional[int] = ..., status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class hugetlb_shm(_message.Message):
    __slots__ = ("path", "size")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class shm_map_request(_message.Message):
    __slots__ = ("path", "path_hugetlb", "mmap_prot", "session_id")
    PATH_FIELD_NUMBER: _ClassVar[int]
    PATH_HUGETLB_FIELD_NUMBER: _ClassVar[int]
    MMAP_PROT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    path: str
    path_hugetlb: hugetlb_shm
    mmap_prot: int
    session_id: int
    def __init__(self, path: _Optional[str] = ..., path_hugetlb: _Optional[_Union[hugetlb_shm, _Mapping]] = ..., mmap_prot: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class shm_map_response(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: status
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class shm_unmap_request(_message.Message):
    __slots__ = ("path", "mmap_prot")
    PATH_FIELD_NUMBER: _ClassVar[int]
    MMAP_PROT_FIELD_NUMBER: _ClassVar[int]
    path: str
    mmap_prot: int
    def __init__(self, path: _Optional[str] = ..., mmap_prot: _Optional[int] = ...) -> None: ...

class shm_unmap_response(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: status
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class nc_counters(_message.Message):
    __slots__ = ("virtual_nc_id", "pe_num_idle_cycles", "pe_num_wait_event_cycles", "pe_matmul_num_wait_event_cycles", "pe_num_executed_instr", "pe_matmul_num_executed_instr", "pool_num_idle_cycles", "pool_num_wait_event_cycles", "pool_num_executed_instr", "act_num_idle_cycles", "act_num_wait_event_cycles", "act_num_executed_instr", "sb_rmw_count", "macs_count")
    VIRTUAL_NC_ID_FIELD_NUMBER: _ClassVar[int]
    PE_NUM_IDLE_CYCLES_FIELD_NUMBER: _ClassVar[int]
    PE_NUM_WAIT_EVENT_CYCLES_FIELD_NUMBER: _ClassVar[int]
    PE_MATMUL_NUM_WAIT_EVENT_CYCLES_FIELD_NUMBER: _ClassVar[int]
    PE_NUM_EXECUTED_INSTR_FIELD_NUMBER: _ClassVar[int]
    PE_MATMUL_NUM_EXECUTED_INSTR_FIELD_NUMBER: _ClassVar[int]
    POOL_NUM_IDLE_CYCLES_FIELD_NUMBER: _ClassVar[int]
    POOL_NUM_WAIT_EVENT_CYCLES_FIELD_NUMBER: _ClassVar[int]
    POOL_NUM_EXECUTED_INSTR_FIELD_NUMBER: _ClassVar[int]
    ACT_NUM_IDLE_CYCLES_FIELD_NUMBER: _ClassVar[int]
    ACT_NUM_WAIT_EVENT_CYCLES_FIELD_NUMBER: _ClassVar[int]
    ACT_NUM_EXECUTED_INSTR_FIELD_NUMBER: _ClassVar[int]
    SB_RMW_COUNT_FIELD_NUMBER: _ClassVar[int]
    MACS_COUNT_FIELD_NUMBER: _ClassVar[int]
    virtual_nc_id: int
    pe_num_idle_cycles: int
    pe_num_wait_event_cycles: int
    pe_matmul_num_wait_event_cycles: int
    pe_num_executed_instr: int
    pe_matmul_num_executed_instr: int
    pool_num_idle_cycles: int
    pool_num_wait_event_cycles: int
    pool_num_executed_instr: int
    act_num_idle_cycles: int
    act_num_wait_event_cycles: int
    act_num_executed_instr: int
    sb_rmw_count: int
    macs_count: int
    def __init__(self, virtual_nc_id: _Optional[int] = ..., pe_num_idle_cycles: _Optional[int] = ..., pe_num_wait_event_cycles: _Optional[int] = ..., pe_matmul_num_wait_event_cycles: _Optional[int] = ..., pe_num_executed_instr: _Optional[int] = ..., pe_matmul_num_executed_instr: _Optional[int] = ..., pool_num_idle_cycles: _Optional[int] = ..., pool_num_wait_event_cycles: _Optional[int] = ..., pool_num_executed_instr: _Optional[int] = ..., act_num_idle_cycles: _Optional[int] = ..., act_num_wait_event_cycles: _Optional[int] = ..., act_num_executed_instr: _Optional[int] = ..., sb_rmw_count: _Optional[int] = ..., macs_count: _Optional[int] = ...) -> None: ...

class infer_error_subtype_count(_message.Message):
    __slots__ = ("error_subtype", "count")
    ERROR_SUBTYPE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    error_subtype: infer_error_subtype
    count: int
    def __init__(self, error_subtype: _Optional[_Union[infer_error_subtype, str]] = ..., count: _Optional[int] = ...) -> None: ...

class infer_status_counts(_message.Message):
    __slots__ = ("infer_status", "count")
    INFER_STATUS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    infer_status: infer_status
    count: int
    def __init__(self, infer_status: _Optional[_Union[infer_status, str]] = ..., count: _Optional[int] = ...) -> None: ...

class nmgr_counters(_message.Message):
    __slots__ = ("infer_error_subtype_counts", "infer_status_counts", "infer_queue_drop_count", "infer_count", "model_start_count", "model_stop_count", "model_load_count", "model_unload_count", "neff_version_max_major", "neff_version_max_minor", "neff_version_min_major", "neff_version_min_minor", "neff_size_bytes_max", "neff_num_ncs_max")
    INFER_ERROR_SUBTYPE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    INFER_STATUS_COUNTS_FIELD_NUMBER: _ClassVar[int]
    INFER_QUEUE_DROP_COUNT_FIELD_NUMBER: _ClassVar[int]
    INFER_COUNT_FIELD_NUMBER: _ClassVar[int]
    MODEL_START_COUNT_FIELD_NUMBER: _ClassVar[int]
    MODEL_STOP_COUNT_FIELD_NUMBER: _ClassVar[int]
    MODEL_LOAD_COUNT_FIELD_NUMBER: _ClassVar[int]
    MODEL_UNLOAD_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEFF_VERSION_MAX_MAJOR_FIELD_NUMBER: _ClassVar[int]
    NEFF_VERSION_MAX_MINOR_FIELD_NUMBER: _ClassVar[int]
    NEFF_VERSION_MIN_MAJOR_FIELD_NUMBER: _ClassVar[int]
    NEFF_VERSION_MIN_MINOR_FIELD_NUMBER: _ClassVar[int]
    NEFF_SIZE_BYTES_MAX_FIELD_NUMBER: _ClassVar[int]
    NEFF_NUM_NCS_MAX_FIELD_NUMBER: _ClassVar[int]
    infer_error_subtype_counts: _containers.RepeatedCompositeFieldContainer[infer_error_subtype_count]
    infer_status_counts: _containers.RepeatedCompositeFieldContainer[infer_status_counts]
    infer_queue_drop_count: int
    infer_count: int
    model_start_count: int
    model_stop_count: int
    model_load_count: int
    model_unload_count: int
    neff_version_max_major: int
    neff_version_max_minor: int
    neff_version_min_major: int
    neff_version_min_minor: int
    neff_size_bytes_max: int
    neff_num_ncs_max: int
    def __init__(self, infer_error_subtype_counts: _Optional[_Iterable[_Union[infer_error_subtype_count, _Mapping]]] = ..., infer_status_counts: _Optional[_Iterable[_Union[infer_status_counts, _Mapping]]] = ..., infer_queue_drop_count: _Optional[int] = ..., infer_count: _Optional[int] = ..., model_start_count: _Optional[int] = ..., model_stop_count: _Optional[int] = ..., model_load_count: _Optional[int] = ..., model_unload_count: _Optional[int] = ..., neff_version_max_major: _Optional[int] = ..., neff_version_max_minor: _Optional[int] = ..., neff_version_min_major: _Optional[int] = ..., neff_version_min_minor: _Optional[int] = ..., neff_size_bytes_max: _Optional[int] = ..., neff_num_ncs_max: _Optional[int] = ...) -> None: ...

class memory_counters(_message.Message):
    __slots__ = ("infa_id", "mem_used_host", "mem_used_infa_0", "mem_used_infa_1")
    INFA_ID_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_HOST_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_INFA_0_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_INFA_1_FIELD_NUMBER: _ClassVar[int]
    infa_id: int
    mem_used_host: int
    mem_used_infa_0: int
    mem_used_infa_1: int
    def __init__(self, infa_id: _Optional[int] = ..., mem_used_host: _Optional[int] = ..., mem_used_infa_0: _Optional[int] = ..., mem_used_infa_1: _Optional[int] = ...) -> None: ...

class system_counters(_message.Message):
    __slots__ = ("num_logs_error", "num_logs_warning", "memory_counters")
    NUM_LOGS_ERROR_FIELD_NUMBER: _ClassVar[int]
    NUM_LOGS_WARNING_FIELD_NUMBER: _ClassVar[int]
    MEMORY_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    num_logs_error: int
    num_logs_warning: int
    memory_counters: _containers.RepeatedCompositeFieldContainer[memory_counters]
    def __init__(self, num_logs_error: _Optional[int] = ..., num_logs_warning: _Optional[int] = ..., memory_counters: _Optional[_Iterable[_Union[memory_counters, _Mapping]]] = ...) -> None: ...

class aggregate(_message.Message):
    __slots__ = ("min", "max", "count", "sum", "values", "counts")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    min: float
    max: float
    count: float
    sum: float
    values: _containers.RepeatedScalarFieldContainer[float]
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, min: _Optional[float] = ..., max: _Optional[float] = ..., count: _Optional[float] = ..., sum: _Optional[float] = ..., values: _Optional[_Iterable[float]] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class metric_data(_message.Message):
    __slots__ = ("ts_nanos_since_epoch", "value_double", "value_agg")
    TS_NANOS_SINCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    VALUE_DOUBLE_FIELD_NUMBER: _ClassVar[int]
    VALUE_AGG_FIELD_NUMBER: _ClassVar[int]
    ts_nanos_since_epoch: int
    value_double: float
    value_agg: aggregate
    def __init__(self, ts_nanos_since_epoch: _Optional[int] = ..., value_double: _Optional[float] = ..., value_agg: _Optional[_Union[aggregate, _Mapping]] = ...) -> None: ...

class metric(_message.Message):
    __slots__ = ("metric_type", "data", "overflow")
    METRIC_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_FIELD_NUMBER: _ClassVar[int]
    metric_type: metric_type
    data: _containers.RepeatedCompositeFieldContainer[metric_data]
    overflow: bool
    def __init__(self, metric_type: _Optional[_Union[metric_type, str]] = ..., data: _Optional[_Iterable[_Union[metric_data, _Mapping]]] = ..., overflow: _Optional[bool] = ...) -> None: ...

class read_all_metrics_request(_message.Message):
    __slots__ = ("summarize_period",)
    SUMMARIZE_PERIOD_FIELD_NUMBER: _ClassVar[int]
    summarize_period: int
    def __init__(self, summarize_period: _Optional[int] = ...) -> None: ...

class read_all_metrics_response(_message.Message):
    __slots__ = ("nmgr_metrics", "status")
    NMGR_METRICS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    nmgr_metrics: _containers.RepeatedCompositeFieldContainer[metric]
    status: status
    def __init__(self, nmgr_metrics: _Optional[_Iterable[_Union[metric, _Mapping]]] = ..., status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class read_nc_counters_request(_message.Message):
    __slots__ = ("vnc_id",)
    VNC_ID_FIELD_NUMBER: _ClassVar[int]
    vnc_id: int
    def __init__(self, vnc_id: _Optional[int] = ...) -> None: ...

class read_nc_counters_response(_message.Message):
    __slots__ = ("nc_counters", "status")
    NC_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    nc_counters: nc_counters
    status: status
    def __init__(self, nc_counters: _Optional[_Union[nc_counters, _Mapping]] = ..., status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class read_inference_counters_response(_message.Message):
    __slots__ = ("nmgr_counters",)
    NMGR_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    nmgr_counters: nmgr_counters
    def __init__(self, nmgr_counters: _Optional[_Union[nmgr_counters, _Mapping]] = ...) -> None: ...

class read_all_counters_request(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class read_all_counters_response(_message.Message):
    __slots__ = ("nc_counters", "nmgr_counters", "system_counters", "status")
    NC_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    NMGR_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    nc_counters: _containers.RepeatedCompositeFieldContainer[nc_counters]
    nmgr_counters: nmgr_counters
    system_counters: system_counters
    status: status
    def __init__(self, nc_counters: _Optional[_Iterable[_Union[nc_counters, _Mapping]]] = ..., nmgr_counters: _Optional[_Union[nmgr_counters, _Mapping]] = ..., system_counters: _Optional[_Union[system_counters, _Mapping]] = ..., status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class hw_counters(_message.Message):
    __slots__ = ("bdf", "device_index", "mem_ecc_corr", "mem_ecc_uncorr", "sram_ecc_corr", "sram_ecc_uncorr", "transfer_adjustment_cnt")
    BDF_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEM_ECC_CORR_FIELD_NUMBER: _ClassVar[int]
    MEM_ECC_UNCORR_FIELD_NUMBER: _ClassVar[int]
    SRAM_ECC_CORR_FIELD_NUMBER: _ClassVar[int]
    SRAM_ECC_UNCORR_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ADJUSTMENT_CNT_FIELD_NUMBER: _ClassVar[int]
    bdf: str
    device_index: int
    mem_ecc_corr: int
    mem_ecc_uncorr: int
    sram_ecc_corr: int
    sram_ecc_uncorr: int
    transfer_adjustment_cnt: int
    def __init__(self, bdf: _Optional[str] = ..., device_index: _Optional[int] = ..., mem_ecc_corr: _Optional[int] = ..., mem_ecc_uncorr: _Optional[int] = ..., sram_ecc_corr: _Optional[int] = ..., sram_ecc_uncorr: _Optional[int] = ..., transfer_adjustment_cnt: _Optional[int] = ...) -> None: ...

class get_hw_counters_request(_message.Message):
    __slots__ = ("bdf", "device_id")
    BDF_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    bdf: str
    device_id: int
    def __init__(self, bdf: _Optional[str] = ..., device_id: _Optional[int] = ...) -> None: ...

class get_hw_counters_response(_message.Message):
    __slots__ = ("counters", "status")
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    counters: hw_counters
    status: status
    def __init__(self, counters: _Optional[_Union[hw_counters, _Mapping]] = ..., status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class get_all_hw_counters_response(_message.Message):
    __slots__ = ("counters", "status")
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    counters: _containers.RepeatedCompositeFieldContainer[hw_counters]
    status: status
    def __init__(self, counters: _Optional[_Iterable[_Union[hw_counters, _Mapping]]] = ..., status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class random_seed_request(_message.Message):
    __slots__ = ("h_eg", "seed")
    H_EG_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    h_eg: h_eg
    seed: int
    def __init__(self, h_eg: _Optional[_Union[h_eg, _Mapping]] = ..., seed: _Optional[int] = ...) -> None: ...

class random_seed_response(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: status
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class get_version_request(_message.Message):
    __slots__ = ("framework_name", "framework_version", "fal_version")
    FRAMEWORK_NAME_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORK_VERSION_FIELD_NUMBER: _ClassVar[int]
    FAL_VERSION_FIELD_NUMBER: _ClassVar[int]
    framework_name: str
    framework_version: version
    fal_version: version
    def __init__(self, framework_name: _Optional[str] = ..., framework_version: _Optional[_Union[version, _Mapping]] = ..., fal_version: _Optional[_Union[version, _Mapping]] = ...) -> None: ...

class get_version_response(_message.Message):
    __slots__ = ("runtime_version",)
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    runtime_version: version
    def __init__(self, runtime_version: _Optional[_Union[version, _Mapping]] = ...) -> None: ...

class nc_time_in_use(_message.Message):
    __slots__ = ("virtual_nc_id", "time_in_use")
    VIRTUAL_NC_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_IN_USE_FIELD_NUMBER: _ClassVar[int]
    virtual_nc_id: int
    time_in_use: int
    def __init__(self, virtual_nc_id: _Optional[int] = ..., time_in_use: _Optional[int] = ...) -> None: ...

class read_nc_time_in_use_request(_message.Message):
    __slots__ = ("vnc_id",)
    VNC_ID_FIELD_NUMBER: _ClassVar[int]
    vnc_id: int
    def __init__(self, vnc_id: _Optional[int] = ...) -> None: ...

class read_nc_time_in_use_response(_message.Message):
    __slots__ = ("nc_time_in_use", "status")
    NC_TIME_IN_USE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    nc_time_in_use: nc_time_in_use
    status: status
    def __init__(self, nc_time_in_use: _Optional[_Union[nc_time_in_use, _Mapping]] = ..., status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...

class set_static_transfer_adjustment_request(_message.Message):
    __slots__ = ("transfer_adjust_cnt",)
    TRANSFER_ADJUST_CNT_FIELD_NUMBER: _ClassVar[int]
    transfer_adjust_cnt: int
    def __init__(self, transfer_adjust_cnt: _Optional[int] = ...) -> None: ...

class set_static_transfer_adjustment_response(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: status
    def __init__(self, status: _Optional[_Union[status, _Mapping]] = ...) -> None: ...
