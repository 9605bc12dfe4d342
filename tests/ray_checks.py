"""The Ray side of tests/daemon/client/test_ray.py, run as a Ray driver in a process of its own:
`python tests/ray_checks.py RAY_ADDRESS`. It waits for the cluster's two nodes, runs on
each node a task and a (detached) actor asking for `neuron_cores`, each loading a model
with our Client, and prints JSON: the nodes' resources, and what each task and actor saw
(its node, NEURON_RT_VISIBLE_CORES, its daemon, the machine-wide NCs of its model)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from neuron_rtd.client import Client
from neuron_rtd.neff.samples import build_mlp

NODES = 2
WAIT_S = 60.0


def placed(client: Client, model_id: int) -> list[int]:
    """The machine-wide NCs of the model, as its daemon's snapshot says."""
    snapshot = client.connection.snapshot()
    where = {nc.vnc: nc.device_index * 4 + nc.nc_index for nc in snapshot.ncs}
    (model,) = [m for m in snapshot.models if m.id == model_id]
    return sorted(where[vnc] for vnc in model.vncs)


def seen(client: Client, model_id: int) -> dict[str, Any]:
    return {
        "node": ray.get_runtime_context().get_node_id(),
        "visible": os.environ.get("NEURON_RT_VISIBLE_CORES"),
        "daemon": client.address,
        "model_id": model_id,
        "ncs": placed(client, model_id),
    }


@ray.remote(resources={"neuron_cores": 2}, num_cpus=0)
def two_core_task() -> dict[str, Any]:
    with Client() as client:
        model = client.load(build_mlp((16, 8, 8, 4), stages_per_node=2).neff)
        return seen(client, model.id)


@ray.remote(resources={"neuron_cores": 1}, num_cpus=0)
class OneCoreActor:
    def __init__(self) -> None:
        self.client = Client()
        self.model = self.client.load(build_mlp((16, 8, 4)).neff)

    def where(self) -> dict[str, Any]:
        return seen(self.client, self.model.id)


def main(address: str) -> int:
    ray.init(address=address, namespace="neuron-rtd-checks", logging_level=logging.WARNING)
    deadline = time.monotonic() + WAIT_S
    nodes: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        if len(nodes) == NODES and all("neuron_cores" in n["Resources"] for n in nodes):
            break
        time.sleep(0.5)
    tasks, actors = [], []
    for node in nodes:
        on_it = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        tasks.append(two_core_task.options(scheduling_strategy=on_it).remote())
        actor = OneCoreActor.options(  # type: ignore[attr-defined]
            scheduling_strategy=on_it, lifetime="detached", name=f"one-{node['NodeID'][:8]}"
        ).remote()
        actors.append(actor.where.remote())
    report = {
        "nodes": [{"id": n["NodeID"], "resources": n["Resources"]} for n in nodes],
        "tasks": ray.get(tasks, timeout=WAIT_S),
        "actors": ray.get(actors, timeout=WAIT_S),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
