"""Our copy of the KServe v2 / Triton protocol is the published one: the descriptors of
proto/grpc_service.proto and proto/model_config.proto equal those of Triton's own client
library (which is also what lets one process import both)."""

from __future__ import annotations

from types import ModuleType

import pytest
import tritonclient.grpc as triton_grpc
from google.protobuf import descriptor_pb2

from neuron_rtd.proto import KSERVE_SERVICE, kserve_pb, model_config_pb


def described(module: ModuleType) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(kserve_pb, "service_pb2"), (model_config_pb, "model_config_pb2")],
)
def test_the_schema_is_the_published_one(ours: ModuleType, theirs: str) -> None:
    published = described(getattr(triton_grpc, theirs))
    mine = described(ours)
    assert mine.name == published.name
    assert mine == published


def test_the_service_name_is_the_protocols() -> None:
    (service,) = kserve_pb.DESCRIPTOR.services_by_name.values()
    assert service.full_name == KSERVE_SERVICE
    assert "ModelInfer" in service.methods_by_name
