"""A Ray Serve application whose replicas each hold one NeuronCore and serve a NEFF.

Each replica asks Ray for `neuron_cores: 1`; Ray gives it one of its node's NeuronCores in
`NEURON_RT_VISIBLE_CORES`, and our `Client` places the model there, on the daemon of the
replica's node (`NEURON_RTD_ADDRESS`, inherited from `ray start`). Requests come as JSON
through Serve's HTTP proxy. Ray counts a node's NeuronCores with
/opt/aws/neuron/bin/neuron-ls (docs/scale-out.md#ray), so start each node in a shell
where `NEURON_RTD_ADDRESS` names that node's daemon:

    export NEURON_RTD_ADDRESS=unix:$PWD/neuron.sock     # this node's daemon
    ray start --head                                    # Ray finds neuron_cores itself
    python examples/ray_serve.py model.neff --replicas 2
    curl -s -d '{"inputs": {"x": [[0.5, 0.25, 1.0, 0.0]]}}' http://127.0.0.1:8000/

Without a NEFF (`--sample`) it serves a small MLP of `neuron_rtd.neff.samples`. The
application stays up once this script has returned; `serve shutdown -y` ends it. An
answer names the replica's node, its NeuronCores, its daemon and its model:

    {"outputs": {"probs": [[...]]}, "node": "...", "neuron_cores": "2",
     "daemon": "unix:/...", "model_id": 10001}
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from neuron_rtd.client import Client, NrtClientError
from neuron_rtd.neff.samples import build_mlp

SAMPLE_SIZES = (4, 16, 3)  # the --sample MLP: x (1, 4) -> probs (1, 3)


@serve.deployment(ray_actor_options={"resources": {"neuron_cores": 1}}, max_ongoing_requests=8)
class NeuronModel:
    """One replica: the NEFF loaded on this replica's NeuronCore, answering JSON."""

    def __init__(self, neff: bytes) -> None:
        # the daemon from NEURON_RTD_ADDRESS, the NeuronCore from NEURON_RT_VISIBLE_CORES
        self.client = Client()
        self.model = self.client.load(neff)
        self.about = {
            "node": ray.get_runtime_context().get_node_id(),
            "neuron_cores": os.environ.get("NEURON_RT_VISIBLE_CORES", ""),
            "daemon": self.client.address,
            "model_id": self.model.id,
        }

    async def __call__(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _refused('the body must be JSON: {"inputs": {"NAME": [[...]], ...}}')
        inputs = body.get("inputs") if isinstance(body, dict) else None
        if not isinstance(inputs, dict):
            return _refused('the body must name the inputs: {"inputs": {"NAME": [[...]]}}')
        try:
            outputs = await asyncio.to_thread(self.model.infer, inputs)
        except NrtClientError as exc:
            return _refused(str(exc))
        answer = {name: value.tolist() for name, value in outputs.items()}
        return JSONResponse({"outputs": answer, **self.about})

    def __del__(self) -> None:
        self.client.close()


def _refused(message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=400)


def application(neff: bytes, *, replicas: int, per_node: int | None) -> Any:
    """The application: `replicas` replicas of the NEFF, at most `per_node` on a node."""
    options: dict[str, Any] = {"num_replicas": replicas}
    if per_node:
        options["max_replicas_per_node"] = per_node
    return NeuronModel.options(**options).bind(neff)  # type: ignore[attr-defined]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ray_serve.py", description="Serve a NEFF on Ray Serve, one NeuronCore a replica."
    )
    parser.add_argument("neff", nargs="?", type=Path, help="the NEFF to serve")
    parser.add_argument("--sample", action="store_true", help="serve a small sample MLP instead")
    parser.add_argument("--address", default="auto", help="the Ray cluster (default: auto)")
    parser.add_argument("--replicas", type=int, default=1, help="replicas (default 1)")
    parser.add_argument(
        "--max-replicas-per-node", type=int, default=None, help="spread them over the nodes"
    )
    parser.add_argument("--host", default="127.0.0.1", help="the HTTP proxy's host")
    parser.add_argument("--port", type=int, default=8000, help="the HTTP proxy's port")
    args = parser.parse_args(argv)
    if (args.neff is None) == (not args.sample):
        parser.error("give a NEFF or --sample (one of the two)")
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sample:
        neff = build_mlp(SAMPLE_SIZES).neff
    else:
        try:
            neff = args.neff.read_bytes()
        except OSError as exc:
            print(f"ray_serve.py: cannot read {args.neff}: {exc.strerror}", file=sys.stderr)
            return 1
    ray.init(address=args.address, logging_level=logging.WARNING)
    # one proxy, on the head node: two nodes of one host would both want the port
    serve.start(http_options={"host": args.host, "port": args.port, "location": "HeadOnly"})
    app = application(neff, replicas=args.replicas, per_node=args.max_replicas_per_node)
    serve.run(app, name="neuron", route_prefix="/")
    print(f"serving on http://{args.host}:{args.port}/ ({args.replicas} replica(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
