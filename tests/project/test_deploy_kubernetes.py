"""The manifests of deploy/kubernetes/: each document is read into the Kubernetes Python
client's model of its kind, and every field of the YAML must be one that model has (a
typo such as `volumeMount` or `hostpath` would otherwise be dropped silently by the
client, and refused or ignored by the API server). Then what ties them together: the
daemon's config is one it accepts, the plugin's flags are ones it takes and name the
daemon's socket, and the inference pods ask for NeuronCores."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from neuron_rtd.cli import neuron_device_plugin
from neuron_rtd.daemon.config import config_from_dict

DEPLOY = Path(__file__).parents[2] / "deploy" / "kubernetes"
MANIFESTS = (
    "neuron-rtd-daemonset.yaml",
    "device-plugin-daemonset.yaml",
    "inference-deployment.yaml",
)
MODELS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("apps/v1", "Deployment"): "V1Deployment",
}
PRIMITIVES = {"str", "int", "float", "bool", "date", "datetime", "object"}


class _Response:
    """What ApiClient.deserialize reads: a response's body."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.data = json.dumps(doc)


def unknown_fields(value: Any, type_name: str, where: str) -> list[str]:
    """The paths of `value`'s fields that the model `type_name` (as the client's
    `openapi_types` spell it) does not have."""
    if value is None or type_name in PRIMITIVES:
        return []
    if listed := re.fullmatch(r"list\[(.+)\]", type_name):
        assert isinstance(value, list), f"{where}: expected a list"
        return [
            bad
            for i, item in enumerate(value)
            for bad in unknown_fields(item, listed.group(1), f"{where}[{i}]")
        ]
    if mapped := re.fullmatch(r"dict[(\[]str, (.+)[)\]]", type_name):
        assert isinstance(value, dict), f"{where}: expected a mapping"
        return [
            bad
            for key, item in value.items()
            for bad in unknown_fields(item, mapped.group(1), f"{where}.{key}")
        ]
    model = getattr(client.models, type_name)
    assert isinstance(value, dict), f"{where}: expected a {type_name} mapping"
    attribute_of = {key: attribute for attribute, key in model.attribute_map.items()}
    found = []
    for key, item in value.items():
        if key not in attribute_of:
            found.append(f"{where}.{key} (not a field of {type_name})")
        else:
            found += unknown_fields(item, model.openapi_types[attribute_of[key]], f"{where}.{key}")
    return found


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def read(doc: dict[str, Any]) -> Any:
    """The document as its kind's model (the client's own deserialization)."""
    model = MODELS[doc["apiVersion"], doc["kind"]]
    return client.ApiClient().deserialize(_Response(doc), model)


def the(name: str, kind: str) -> Any:
    (doc,) = [read(d) for d in documents(name) if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("name", MANIFESTS)
def test_every_document_is_its_kinds_model_with_no_unknown_field(name: str) -> None:
    docs = documents(name)
    assert docs
    for doc in docs:
        assert (doc.get("apiVersion"), doc.get("kind")) in MODELS, doc.get("kind")
        where = f"{name}:{doc['kind']}/{doc['metadata']['name']}"
        assert unknown_fields(doc, MODELS[doc["apiVersion"], doc["kind"]], where) == []
        assert read(doc).metadata.name == doc["metadata"]["name"]


def test_the_walk_finds_a_misspelt_field() -> None:
    (doc,) = documents("device-plugin-daemonset.yaml")
    container = doc["spec"]["template"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")
    assert unknown_fields(doc, "V1DaemonSet", "ds") == [
        "ds.spec.template.spec.containers[0].volumeMount (not a field of V1Container)"
    ]


def _mounts(pod: Any) -> dict[str, str]:
    """Each mount path of the pod's first container -> the host path behind it."""
    host = {v.name: v.host_path.path for v in pod.volumes if v.host_path}
    return {m.mount_path: host.get(m.name, "") for m in pod.containers[0].volume_mounts}


def test_the_daemon_the_plugin_and_the_pods_agree() -> None:
    daemon = the("neuron-rtd-daemonset.yaml", "DaemonSet").spec.template.spec
    config_map = the("neuron-rtd-daemonset.yaml", "ConfigMap")
    config = config_from_dict(json.loads(config_map.data["neuron-rtd.json"]))
    socket = config.server_address.removeprefix("unix:")
    assert _mounts(daemon)[str(Path(socket).parent)] == str(Path(socket).parent)

    plugin = the("device-plugin-daemonset.yaml", "DaemonSet").spec.template.spec
    command = plugin.containers[0].command
    assert command[0] == "neuron-device-plugin"
    plugin_config = neuron_device_plugin.config_of(neuron_device_plugin.parse_args(command[1:]))
    assert str(plugin_config.runtime_socket) == socket
    assert plugin_config.instance_type == config.sim.instance_type
    sim_root = {e.name: e.value for e in plugin.containers[0].env}["NEURON_SIM_ROOT"]
    assert sim_root == config.sim.root
    assert _mounts(plugin)[sim_root] == _mounts(daemon)[sim_root] == sim_root
    kubelet = str(plugin_config.plugin_dir)
    assert _mounts(plugin)[kubelet] == kubelet == "/var/lib/kubelet/device-plugins"
    assert plugin.node_selector == daemon.node_selector

    inference = the("inference-deployment.yaml", "Deployment").spec.template.spec
    assert inference.containers[0].resources.limits["aws.amazon.com/neuroncore"] == "2"
    worker = the("inference-deployment.yaml", "ConfigMap").data["worker.py"]
    compile(worker, "worker.py", "exec")
