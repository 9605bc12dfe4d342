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
    __slots__ = ("index", "bdf", "nc_count", "memory_bytes", "memory_used")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    BDF_FIELD_NUMBER: _ClassVar[int]
    NC_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    index: int
    bdf: str
    nc_count: int
    memory_bytes: int
    memory_used: int
    def __init__(self, index: _Optional[int] = ..., bdf: _Optional[str] = ..., nc_count: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., memory_used: _Optional[int] = ...) -> None: ...

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
