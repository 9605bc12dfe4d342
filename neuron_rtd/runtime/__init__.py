"""The runtime's face: everything outside `neuron_rtd.runtime` uses these names only.

`Runtime` is the transport-free core (NCGs, the model DB, load/start/stop/unload,
infer/post/wait/poll/completed, sessions, shm maps, counters); the gRPC server calls one of
its methods per RPC. `LocalRuntime` runs the same path in-process on a private simulated
machine. Devices reach it through the driver port (`DeviceApi`; `acquire_sim` owns
simulated ones).
"""

from neuron_rtd.runtime.access import (
    Caller,
    User,
    caller,
    group_member,
    group_name,
    may_open,
    socket_caller,
    stranger,
)
from neuron_rtd.runtime.admission import read_model_file
from neuron_rtd.runtime.api import (
    DeviceInfo,
    HwCounters,
    InferResult,
    Input,
    ModelInfo,
    NcgInfo,
    NcUse,
    NeffFile,
    Rows,
    RuntimeOptions,
    SessionRelease,
    ShmInput,
    ShmOutputs,
    Snapshot,
    SystemCounters,
    Topology,
    parse_version,
    wire_bytes,
)
from neuron_rtd.runtime.compute import ComputeGate
from neuron_rtd.runtime.driver import (
    NC_ENGINES,
    DeviceApi,
    DeviceSpec,
    DramBufferApi,
    InstrRecord,
    InstrRecorder,
    NcCounters,
    NeuronCoreApi,
    RunFn,
    SimDevice,
    acquire_sim,
    nc_engine,
    usable_cpus,
)
from neuron_rtd.runtime.local import LocalRuntime
from neuron_rtd.runtime.model import LoadMode, ModelParams, ModelState
from neuron_rtd.runtime.model_table import FIRST_MODEL_ID
from neuron_rtd.runtime.profile import InferenceProfile, ModelProfile, StepRecord
from neuron_rtd.runtime.runtime import Runtime
from neuron_rtd.runtime.sessions import NO_SESSION, SessionId, session_tag
from neuron_rtd.runtime.shm import ShmMapping
from neuron_rtd.runtime.stats import (
    LATENCY_BOUNDS_US,
    Aggregate,
    Histogram,
    MetricSeries,
    NmgrCounters,
    Tally,
)

__all__ = [
    "FIRST_MODEL_ID",
    "LATENCY_BOUNDS_US",
    "NC_ENGINES",
    "NO_SESSION",
    "Aggregate",
    "Caller",
    "ComputeGate",
    "DeviceApi",
    "DeviceInfo",
    "DeviceSpec",
    "DramBufferApi",
    "Histogram",
    "HwCounters",
    "InferResult",
    "InferenceProfile",
    "Input",
    "InstrRecord",
    "InstrRecorder",
    "LoadMode",
    "LocalRuntime",
    "MetricSeries",
    "ModelInfo",
    "ModelParams",
    "ModelProfile",
    "ModelState",
    "NcCounters",
    "NcUse",
    "NcgInfo",
    "NeffFile",
    "NeuronCoreApi",
    "NmgrCounters",
    "Rows",
    "RunFn",
    "Runtime",
    "RuntimeOptions",
    "SessionId",
    "SessionRelease",
    "ShmInput",
    "ShmMapping",
    "ShmOutputs",
    "SimDevice",
    "Snapshot",
    "StepRecord",
    "SystemCounters",
    "Tally",
    "Topology",
    "User",
    "acquire_sim",
    "caller",
    "group_member",
    "group_name",
    "may_open",
    "nc_engine",
    "parse_version",
    "read_model_file",
    "session_tag",
    "socket_caller",
    "stranger",
    "usable_cpus",
    "wire_bytes",
]
