from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class describe_request(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ext_device(_message.Message):
    __slots__ = ("index", "bdf", "nc_count", "memory_bytes", "memory_used", "hw_counters")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    BDF_FIELD_NUMBER: _ClassVar[int]
    NC_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    HW_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    index: int
    bdf: str
    nc_count: int
    memory_bytes: int
    memory_used: int
    hw_counters: ext_hw_counters
    def __init__(self, index: _Optional[int] = ..., bdf: _Optional[str] = ..., nc_count: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., memory_used: _Optional[int] = ..., hw_counters: _Optional[_Union[ext_hw_counters, _Mapping]] = ...) -> None: ...

class ext_hw_counters(_message.Message):
    __slots__ = ("mem_ecc_corr", "mem_ecc_uncorr", "sram_ecc_corr", "sram_ecc_uncorr", "nc_errors", "nc_hangs", "dma_timeouts", "init_failures")
    MEM_ECC_CORR_FIELD_NUMBER: _ClassVar[int]
    MEM_ECC_UNCORR_FIELD_NUMBER: _ClassVar[int]
    SRAM_ECC_CORR_FIELD_NUMBER: _ClassVar[int]
    SRAM_ECC_UNCORR_FIELD_NUMBER: _ClassVar[int]
    NC_ERRORS_FIELD_NUMBER: _ClassVar[int]
    NC_HANGS_FIELD_NUMBER: _ClassVar[int]
    DMA_TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    INIT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    mem_ecc_corr: int
    mem_ecc_uncorr: int
    sram_ecc_corr: int
    sram_ecc_uncorr: int
    nc_errors: int
    nc_hangs: int
    dma_timeouts: int
    init_failures: int
    def __init__(self, mem_ecc_corr: _Optional[int] = ..., mem_ecc_uncorr: _Optional[int] = ..., sram_ecc_corr: _Optional[int] = ..., sram_ecc_uncorr: _Optional[int] = ..., nc_errors: _Optional[int] = ..., nc_hangs: _Optional[int] = ..., dma_timeouts: _Optional[int] = ..., init_failures: _Optional[int] = ...) -> None: ...

class describe_response(_message.Message):
    __slots__ = ("runtime_version", "pid", "address", "sim_root", "instance_type", "devices", "start_time_ns", "status_code", "details", "peer_socket")
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SIM_ROOT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    START_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    PEER_SOCKET_FIELD_NUMBER: _ClassVar[int]
    runtime_version: str
    pid: int
    address: str
    sim_root: str
    instance_type: str
    devices: _containers.RepeatedCompositeFieldContainer[ext_device]
    start_time_ns: int
    status_code: int
    details: str
    peer_socket: str
    def __init__(self, runtime_version: _Optional[str] = ..., pid: _Optional[int] = ..., address: _Optional[str] = ..., sim_root: _Optional[str] = ..., instance_type: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[ext_device, _Mapping]]] = ..., start_time_ns: _Optional[int] = ..., status_code: _Optional[int] = ..., details: _Optional[str] = ..., peer_socket: _Optional[str] = ...) -> None: ...

class peer_request(_message.Message):
    __slots__ = ("shm_share", "ticket", "infer")
    SHM_SHARE_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    INFER_FIELD_NUMBER: _ClassVar[int]
    shm_share: shm_share_request
    ticket: peer_ticket_request
    infer: peer_infer_request
    def __init__(self, shm_share: _Optional[_Union[shm_share_request, _Mapping]] = ..., ticket: _Optional[_Union[peer_ticket_request, _Mapping]] = ..., infer: _Optional[_Union[peer_infer_request, _Mapping]] = ...) -> None: ...

class shm_share_request(_message.Message):
    __slots__ = ("session_id", "path", "mmap_prot")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MMAP_PROT_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    path: str
    mmap_prot: int
    def __init__(self, session_id: _Optional[int] = ..., path: _Optional[str] = ..., mmap_prot: _Optional[int] = ...) -> None: ...

class peer_ticket_request(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class peer_infer_request(_message.Message):
    __slots__ = ("session_id", "infer_request")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INFER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    infer_request: bytes
    def __init__(self, session_id: _Optional[int] = ..., infer_request: _Optional[bytes] = ...) -> None: ...

class peer_response(_message.Message):
    __slots__ = ("status_code", "details", "ticket", "infer_response")
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    INFER_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    status_code: int
    details: str
    ticket: int
    infer_response: bytes
    def __init__(self, status_code: _Optional[int] = ..., details: _Optional[str] = ..., ticket: _Optional[int] = ..., infer_response: _Optional[bytes] = ...) -> None: ...

class create_ncg_request(_message.Message):
    __slots__ = ("nc_count", "session_id", "visible_ncs", "implicit")
    NC_COUNT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    VISIBLE_NCS_FIELD_NUMBER: _ClassVar[int]
    IMPLICIT_FIELD_NUMBER: _ClassVar[int]
    nc_count: int
    session_id: int
    visible_ncs: _containers.RepeatedScalarFieldContainer[int]
    implicit: bool
    def __init__(self, nc_count: _Optional[int] = ..., session_id: _Optional[int] = ..., visible_ncs: _Optional[_Iterable[int]] = ..., implicit: _Optional[bool] = ...) -> None: ...

class create_ncg_response(_message.Message):
    __slots__ = ("status_code", "details", "ncg_id", "nc_count", "first_nc")
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    NCG_ID_FIELD_NUMBER: _ClassVar[int]
    NC_COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_NC_FIELD_NUMBER: _ClassVar[int]
    status_code: int
    details: str
    ncg_id: int
    nc_count: int
    first_nc: int
    def __init__(self, status_code: _Optional[int] = ..., details: _Optional[str] = ..., ncg_id: _Optional[int] = ..., nc_count: _Optional[int] = ..., first_nc: _Optional[int] = ...) -> None: ...

class snapshot_request(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ext_nc(_message.Message):
    __slots__ = ("vnc", "device_index", "nc_index", "busy_ns", "ncg_id")
    VNC_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    NC_INDEX_FIELD_NUMBER: _ClassVar[int]
    BUSY_NS_FIELD_NUMBER: _ClassVar[int]
    NCG_ID_FIELD_NUMBER: _ClassVar[int]
    vnc: int
    device_index: int
    nc_index: int
    busy_ns: int
    ncg_id: int
    def __init__(self, vnc: _Optional[int] = ..., device_index: _Optional[int] = ..., nc_index: _Optional[int] = ..., busy_ns: _Optional[int] = ..., ncg_id: _Optional[int] = ...) -> None: ...

class ext_ncg(_message.Message):
    __slots__ = ("id", "vnc_start", "nc_count", "device_index", "implicit", "model_ids", "session")
    ID_FIELD_NUMBER: _ClassVar[int]
    VNC_START_FIELD_NUMBER: _ClassVar[int]
    NC_COUNT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    IMPLICIT_FIELD_NUMBER: _ClassVar[int]
    MODEL_IDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    id: int
    vnc_start: int
    nc_count: int
    device_index: int
    implicit: bool
    model_ids: _containers.RepeatedScalarFieldContainer[int]
    session: str
    def __init__(self, id: _Optional[int] = ..., vnc_start: _Optional[int] = ..., nc_count: _Optional[int] = ..., device_index: _Optional[int] = ..., implicit: _Optional[bool] = ..., model_ids: _Optional[_Iterable[int]] = ..., session: _Optional[str] = ...) -> None: ...

class ext_infer_tally(_message.Message):
    __slots__ = ("completed", "completed_with_err", "completed_with_num_err", "timed_out", "incorrect_input", "failed_to_queue", "cancelled")
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_WITH_ERR_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_WITH_NUM_ERR_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    INCORRECT_INPUT_FIELD_NUMBER: _ClassVar[int]
    FAILED_TO_QUEUE_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    completed: int
    completed_with_err: int
    completed_with_num_err: int
    timed_out: int
    incorrect_input: int
    failed_to_queue: int
    cancelled: int
    def __init__(self, completed: _Optional[int] = ..., completed_with_err: _Optional[int] = ..., completed_with_num_err: _Optional[int] = ..., timed_out: _Optional[int] = ..., incorrect_input: _Optional[int] = ..., failed_to_queue: _Optional[int] = ..., cancelled: _Optional[int] = ...) -> None: ...

class ext_model(_message.Message):
    __slots__ = ("id", "name", "ncg_id", "state", "mode", "vncs", "device_bytes", "host_bytes", "ninfer", "timeout_s", "in_flight", "tally", "failure", "nc_count", "inputs", "outputs", "session")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NCG_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    VNCS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    NINFER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TALLY_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    NC_COUNT_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    ncg_id: int
    state: str
    mode: str
    vncs: _containers.RepeatedScalarFieldContainer[int]
    device_bytes: int
    host_bytes: int
    ninfer: int
    timeout_s: float
    in_flight: int
    tally: ext_infer_tally
    failure: str
    nc_count: int
    inputs: _containers.RepeatedCompositeFieldContainer[ext_tensor]
    outputs: _containers.RepeatedCompositeFieldContainer[ext_tensor]
    session: str
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., ncg_id: _Optional[int] = ..., state: _Optional[str] = ..., mode: _Optional[str] = ..., vncs: _Optional[_Iterable[int]] = ..., device_bytes: _Optional[int] = ..., host_bytes: _Optional[int] = ..., ninfer: _Optional[int] = ..., timeout_s: _Optional[float] = ..., in_flight: _Optional[int] = ..., tally: _Optional[_Union[ext_infer_tally, _Mapping]] = ..., failure: _Optional[str] = ..., nc_count: _Optional[int] = ..., inputs: _Optional[_Iterable[_Union[ext_tensor, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[ext_tensor, _Mapping]]] = ..., session: _Optional[str] = ...) -> None: ...

class ext_tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ext_histogram(_message.Message):
    __slots__ = ("bounds_us", "counts", "total", "sum_us")
    BOUNDS_US_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SUM_US_FIELD_NUMBER: _ClassVar[int]
    bounds_us: _containers.RepeatedScalarFieldContainer[float]
    counts: _containers.RepeatedScalarFieldContainer[int]
    total: int
    sum_us: float
    def __init__(self, bounds_us: _Optional[_Iterable[float]] = ..., counts: _Optional[_Iterable[int]] = ..., total: _Optional[int] = ..., sum_us: _Optional[float] = ...) -> None: ...

class snapshot_response(_message.Message):
    __slots__ = ("time_ns", "cpu_user_s", "cpu_system_s", "rss_bytes", "ncs", "ncgs", "models", "latency", "nc_latency", "status_code", "details")
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    CPU_USER_S_FIELD_NUMBER: _ClassVar[int]
    CPU_SYSTEM_S_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    NCS_FIELD_NUMBER: _ClassVar[int]
    NCGS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    NC_LATENCY_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    time_ns: int
    cpu_user_s: float
    cpu_system_s: float
    rss_bytes: int
    ncs: _containers.RepeatedCompositeFieldContainer[ext_nc]
    ncgs: _containers.RepeatedCompositeFieldContainer[ext_ncg]
    models: _containers.RepeatedCompositeFieldContainer[ext_model]
    latency: ext_histogram
    nc_latency: ext_histogram
    status_code: int
    details: str
    def __init__(self, time_ns: _Optional[int] = ..., cpu_user_s: _Optional[float] = ..., cpu_system_s: _Optional[float] = ..., rss_bytes: _Optional[int] = ..., ncs: _Optional[_Iterable[_Union[ext_nc, _Mapping]]] = ..., ncgs: _Optional[_Iterable[_Union[ext_ncg, _Mapping]]] = ..., models: _Optional[_Iterable[_Union[ext_model, _Mapping]]] = ..., latency: _Optional[_Union[ext_histogram, _Mapping]] = ..., nc_latency: _Optional[_Union[ext_histogram, _Mapping]] = ..., status_code: _Optional[int] = ..., details: _Optional[str] = ...) -> None: ...

class profile_request(_message.Message):
    __slots__ = ("model_id", "last")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    model_id: int
    last: int
    def __init__(self, model_id: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class profile_shape(_message.Message):
    __slots__ = ("dims",)
    DIMS_FIELD_NUMBER: _ClassVar[int]
    dims: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dims: _Optional[_Iterable[int]] = ...) -> None: ...

class profile_instr(_message.Message):
    __slots__ = ("index", "op", "engine", "input_shapes", "output_shapes", "start_ns", "host_ns", "macs", "cycles")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SHAPES_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    HOST_NS_FIELD_NUMBER: _ClassVar[int]
    MACS_FIELD_NUMBER: _ClassVar[int]
    CYCLES_FIELD_NUMBER: _ClassVar[int]
    index: int
    op: str
    engine: str
    input_shapes: _containers.RepeatedCompositeFieldContainer[profile_shape]
    output_shapes: _containers.RepeatedCompositeFieldContainer[profile_shape]
    start_ns: int
    host_ns: int
    macs: int
    cycles: int
    def __init__(self, index: _Optional[int] = ..., op: _Optional[str] = ..., engine: _Optional[str] = ..., input_shapes: _Optional[_Iterable[_Union[profile_shape, _Mapping]]] = ..., output_shapes: _Optional[_Iterable[_Union[profile_shape, _Mapping]]] = ..., start_ns: _Optional[int] = ..., host_ns: _Optional[int] = ..., macs: _Optional[int] = ..., cycles: _Optional[int] = ...) -> None: ...

class profile_step(_message.Message):
    __slots__ = ("node", "stage", "vnc", "start_ns", "host_ns", "cycles", "instrs", "input_shapes", "output_shapes")
    NODE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    VNC_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    HOST_NS_FIELD_NUMBER: _ClassVar[int]
    CYCLES_FIELD_NUMBER: _ClassVar[int]
    INSTRS_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SHAPES_FIELD_NUMBER: _ClassVar[int]
    node: str
    stage: int
    vnc: int
    start_ns: int
    host_ns: int
    cycles: int
    instrs: _containers.RepeatedCompositeFieldContainer[profile_instr]
    input_shapes: _containers.RepeatedCompositeFieldContainer[profile_shape]
    output_shapes: _containers.RepeatedCompositeFieldContainer[profile_shape]
    def __init__(self, node: _Optional[str] = ..., stage: _Optional[int] = ..., vnc: _Optional[int] = ..., start_ns: _Optional[int] = ..., host_ns: _Optional[int] = ..., cycles: _Optional[int] = ..., instrs: _Optional[_Iterable[_Union[profile_instr, _Mapping]]] = ..., input_shapes: _Optional[_Iterable[_Union[profile_shape, _Mapping]]] = ..., output_shapes: _Optional[_Iterable[_Union[profile_shape, _Mapping]]] = ...) -> None: ...

class profile_inference(_message.Message):
    __slots__ = ("seq", "time_ns", "host_ns", "cycles", "steps")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    HOST_NS_FIELD_NUMBER: _ClassVar[int]
    CYCLES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time_ns: int
    host_ns: int
    cycles: int
    steps: _containers.RepeatedCompositeFieldContainer[profile_step]
    def __init__(self, seq: _Optional[int] = ..., time_ns: _Optional[int] = ..., host_ns: _Optional[int] = ..., cycles: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[profile_step, _Mapping]]] = ...) -> None: ...

class profile_response(_message.Message):
    __slots__ = ("status_code", "details", "model_id", "model_name", "nc_clock_hz", "recorded", "inferences")
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    NC_CLOCK_HZ_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    INFERENCES_FIELD_NUMBER: _ClassVar[int]
    status_code: int
    details: str
    model_id: int
    model_name: str
    nc_clock_hz: int
    recorded: int
    inferences: _containers.RepeatedCompositeFieldContainer[profile_inference]
    def __init__(self, status_code: _Optional[int] = ..., details: _Optional[str] = ..., model_id: _Optional[int] = ..., model_name: _Optional[str] = ..., nc_clock_hz: _Optional[int] = ..., recorded: _Optional[int] = ..., inferences: _Optional[_Iterable[_Union[profile_inference, _Mapping]]] = ...) -> None: ...
