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
    __slots__ = ("runtime_version", "pid", "address", "sim_root", "instance_type", "devices", "start_time_ns", "status_code", "details")
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SIM_ROOT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    START_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    runtime_version: str
    pid: int
    address: str
    sim_root: str
    instance_type: str
    devices: _containers.RepeatedCompositeFieldContainer[ext_device]
    start_time_ns: int
    status_code: int
    details: str
    def __init__(self, runtime_version: _Optional[str] = ..., pid: _Optional[int] = ..., address: _Optional[str] = ..., sim_root: _Optional[str] = ..., instance_type: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[ext_device, _Mapping]]] = ..., start_time_ns: _Optional[int] = ..., status_code: _Optional[int] = ..., details: _Optional[str] = ...) -> None: ...
