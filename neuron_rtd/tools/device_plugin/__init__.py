"""The kubelet device plugin (`neuron-device-plugin`): a node's NeuronCores and Neuron
devices offered to Kubernetes as the extended resources `aws.amazon.com/neuroncore` and
`aws.amazon.com/neuron`, over the kubelet's device plugin API v1beta1
(proto/deviceplugin/v1beta1/api.proto).

By concept: what each resource offers and what a container given some of it gets
(`resources`), the devices' health read from the simulated machine (`health`), which
units to prefer for a container (`preferred`), the DevicePlugin service on each
resource's socket (`servicer`), and the plugin's life beside the kubelet: serve,
register, re-register when the kubelet restarts (`kubelet`).
"""

from neuron_rtd.tools.device_plugin.kubelet import PluginConfig, RegistrationRefused, run
from neuron_rtd.tools.device_plugin.resources import (
    NEURON_RESOURCE,
    NEURONCORE_RESOURCE,
    Resource,
    resources_of,
)

__all__ = [
    "NEURONCORE_RESOURCE",
    "NEURON_RESOURCE",
    "PluginConfig",
    "RegistrationRefused",
    "Resource",
    "resources_of",
    "run",
]
