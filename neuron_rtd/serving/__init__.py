"""The serving core behind the KServe v2 / Triton protocol: a model repository in
Triton's layout (`DIR/NAME/VERSION/model.neff`, an optional `DIR/NAME/config.pbtxt`),
each model's config completed from its NEFF, its versions loaded as ordinary models of
the runtime (`instance_group { count: N }` copies on NCGs of their own), dynamic
batching across clients, per-version statistics, and system shared-memory regions.
Ensembles of its models (`platform: "ensemble"`) run their steps through each model's
own infer path (`neuron_rtd/serving/ensemble.py`).

The front ends (`neuron_rtd/server/kserve.py` for gRPC, `neuron_rtd/server/kserve_http.py`
for HTTP) speak to it through this face only: `ServingApi` (`neuron_rtd/serving/api.py`),
its values and errors, and the protocol's datatype table (`neuron_rtd/serving/datatypes.py`).
"""

from neuron_rtd.serving.api import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    RepositoryModel,
    ServerMetadata,
    ServingApi,
    ServingError,
    SharedMemoryApi,
    ShmRegion,
    Status,
    TensorMeta,
)
from neuron_rtd.serving.datatypes import DTYPES, datatype_of, dtype_of
from neuron_rtd.serving.service import EXTENSIONS, Serving

__all__ = [
    "DTYPES",
    "EXTENSIONS",
    "InferRequest",
    "InferResponse",
    "ModelMetadata",
    "RepositoryModel",
    "ServerMetadata",
    "Serving",
    "ServingApi",
    "ServingError",
    "SharedMemoryApi",
    "ShmRegion",
    "Status",
    "TensorMeta",
    "datatype_of",
    "dtype_of",
]
