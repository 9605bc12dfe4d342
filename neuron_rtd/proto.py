"""The wire API, as the rest of the code imports it.

The generated modules live in ``neuron_rtd._generated`` (see ``neuron_rtd.protogen``);
nothing else imports them directly, so a change of layout touches this file only.

- ``pb`` / ``pb_grpc``: package ``nrt`` (proto/nrt/nmgr.proto), the original API.
- ``ext_pb`` / ``ext_pb_grpc``: package ``nrt.ext`` (proto/nrt/ext.proto), our additions.
- ``tf_pb``: package ``nrt.tf`` (proto/nrt/tf_example.proto), the Example records of
  TFRecord data sets, byte for byte as TensorFlow's.
- ``kserve_pb`` / ``kserve_pb_grpc``: package ``inference`` (proto/grpc_service.proto), the
  KServe v2 / Triton gRPC protocol, and ``model_config_pb`` (proto/model_config.proto), its
  model configuration (config.pbtxt), both as published.
- ``deviceplugin_pb`` / ``deviceplugin_pb_grpc``: package ``v1beta1``
  (proto/deviceplugin/v1beta1/api.proto), the kubelet's device plugin API, as published.
"""

from __future__ import annotations

from neuron_rtd._generated import grpc_service_pb2 as kserve_pb
from neuron_rtd._generated import grpc_service_pb2_grpc as kserve_pb_grpc
from neuron_rtd._generated import model_config_pb2 as model_config_pb
from neuron_rtd._generated.deviceplugin.v1beta1 import api_pb2 as deviceplugin_pb
from neuron_rtd._generated.deviceplugin.v1beta1 import api_pb2_grpc as deviceplugin_pb_grpc
from neuron_rtd._generated.nrt import ext_pb2 as ext_pb
from neuron_rtd._generated.nrt import ext_pb2_grpc as ext_pb_grpc
from neuron_rtd._generated.nrt import nmgr_pb2 as pb
from neuron_rtd._generated.nrt import nmgr_pb2_grpc as pb_grpc
from neuron_rtd._generated.nrt import tf_example_pb2 as tf_pb

__all__ = [
    "CHANNEL_OPTIONS",
    "DEVICE_PLUGIN_VERSION",
    "KSERVE_SERVICE",
    "NMGR_EXT",
    "NMGR_SESSION_MANAGER",
    "NMGR_STREAM",
    "NMGR_V1",
    "SESSION_METADATA",
    "TICKET_METADATA",
    "deviceplugin_pb",
    "deviceplugin_pb_grpc",
    "ext_pb",
    "ext_pb_grpc",
    "kserve_pb",
    "kserve_pb_grpc",
    "model_config_pb",
    "pb",
    "pb_grpc",
    "tf_pb",
]

# Every channel and server of the wire API: no message size limits (tensors and NEFFs
# go inline when shared memory is off).
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]

# Full service names: the first part of each method's HTTP/2 path ("/nrt.nmgr_v1/load").
NMGR_V1 = "nrt.nmgr_v1"
NMGR_SESSION_MANAGER = "nrt.nmgr_session_manager"
NMGR_STREAM = "nrt.nmgr_stream"
NMGR_EXT = "nrt.ext.nmgr_ext"
KSERVE_SERVICE = "inference.GRPCInferenceService"
# The device plugin API's version, as a plugin names it when it registers (its proto package)
DEVICE_PLUGIN_VERSION = "v1beta1"

# gRPC metadata our clients send (docs/wire-api.md): the session a call presents, and on
# session_monitor the peer ticket that names the caller's user.
SESSION_METADATA = "nrt-session-id"
TICKET_METADATA = "nrt-peer-ticket"
# The peer socket's bound on one message, either way (an infer request or its answer, tensors
# in shared memory): the daemon's lanes and the client's hold to it.
MAX_PEER_MESSAGE = 64 << 10
