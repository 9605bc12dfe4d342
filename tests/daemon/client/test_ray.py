"""Ray on two simulated machines: a local cluster of two nodes on this host, each started
(`ray start`) where `NEURON_RTD_ADDRESS` names its own daemon, so that Ray counts each
node's NeuronCores with /opt/aws/neuron/bin/neuron-ls and sets NEURON_RT_VISIBLE_CORES for
each task, actor and Serve replica, which our Client honours.

Selected with `-m ray`. Prints its figures (cluster start, request latency through Serve's
HTTP proxy) for docs/scale-out.md."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.visible import parse_indices

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.daemon]

ROOT = Path(__file__).parents[3]
SDK_NEURON_LS = Path("/opt/aws/neuron/bin/neuron-ls")
RAY = str(Path(sys.executable).parent / "ray")
NCS_PER_NODE = 4  # an inf1.xlarge: one device
START_TIMEOUT_S = 60.0
STOP_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RayNode:
    """`ray start --block` in a process group of its own, its output in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [RAY, "start", "--block", "--disable-usage-stats", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ray runtime started" not in self.log.read_text(errors="replace"):
            assert self.proc.poll() is None, self.log.read_text(errors="replace")
            assert time.monotonic() < deadline, self.log.read_text(errors="replace")
            time.sleep(0.2)

    def signal(self, signum: int) -> None:
        """`signum` to its process group (the node's processes: its raylet and workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)


def stop_nodes(nodes: list[RayNode]) -> None:
    """SIGTERM to every node at once (ray start --block takes its node down), SIGKILL to
    what is left after STOP_S: the cluster goes with the test."""
    for node in nodes:
        node.signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_S
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    for node in nodes:
        node.signal(signal.SIGKILL)
        node.proc.wait()


def ray_env(home: Path) -> dict[str, str]:
    """The environment of the cluster's and its drivers' processes: none of this user's
    Ray settings (RAY_*: an address, an auth mode or token) and a HOME of the test's own,
    so that nothing another Ray run left on the machine (~/.ray/auth_token, which turns
    token authentication on) reaches them; no NeuronCores or daemon chosen."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    for name in ("NEURON_RT_VISIBLE_CORES", "NEURON_RTD_ADDRESS"):
        env.pop(name, None)
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0")
    return env


def node_env(home: Path, daemon: DaemonProcess) -> dict[str, str]:
    env = ray_env(home)
    env.update(NEURON_RTD_ADDRESS=daemon.address, NEURON_SIM_ROOT=daemon.sim_root)
    # Serve's proxy (on the head) sends a request to a replica of its own node while one
    # is free: spread them, so that both nodes' replicas answer sequential requests
    env["RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING"] = "0"
    return env


@pytest.fixture(scope="module")
def cluster(module_work: Path) -> Iterator[dict[str, Any]]:
    if not os.access(SDK_NEURON_LS, os.X_OK):
        pytest.skip(f"no {SDK_NEURON_LS}: scripts/bootstrap.sh links it (as root)")
    config = module_work / "xlarge.json"
    config.write_text('{"sim": {"instance_type": "inf1.xlarge"}}\n')
    daemons = [
        DaemonProcess(sim_root=module_work / f"sim{i}", args=["-c", str(config)]).start()
        for i in range(2)
    ]
    home = module_work / "home"
    home.mkdir()
    # Ray's socket paths stay short (module_work's is); the folder goes with module_work
    # too, after whatever a node's last process wrote there as it stopped
    temp = module_work / "ray"
    port = free_port()
    common = ["--num-cpus=2", "--object-store-memory=80000000"]
    nodes: list[RayNode] = []
    try:
        began = time.monotonic()
        head = RayNode(
            [
                "--head",
                f"--port={port}",
                f"--temp-dir={temp}",
                "--include-dashboard=false",
                *common,
            ],
            node_env(home, daemons[0]),
            module_work / "head.log",
        )
        nodes.append(head)
        head.wait_started()
        worker = RayNode(
            [f"--address=127.0.0.1:{port}", *common],
            node_env(home, daemons[1]),
            module_work / "w.log",
        )
        nodes.append(worker)
        worker.wait_started()
        started_s = time.monotonic() - began
        print(f"\nfigure: two Ray nodes started in {started_s:.1f} s")
        yield {
            "address": f"127.0.0.1:{port}",
            "daemons": daemons,
            "work": module_work,
            "env": ray_env(home),
        }
    finally:
        stop_nodes(nodes)
        for daemon in daemons:
            daemon.stop()
        shutil.rmtree(temp, ignore_errors=True)  # the cluster's sessions, logs, sockets


def run_python(*args: str, env: dict[str, str], timeout: float = 120) -> str:
    """`python ARGS` with `env` (`ray_env`'s: a Ray driver joins the cluster as its nodes)."""
    done = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def list_models(address: str, env: dict[str, str]) -> dict[int, list[int]]:
    """neuron-cli list-model -j on a daemon: each model's NCs (a whole machine: its vncs
    are the machine-wide indices)."""
    out = run_python("-m", "neuron_rtd.cli.neuron_cli", "-a", address, "list-model", "-j", env=env)
    return {m["model_id"]: m["vncs"] for m in json.loads(out)}


def test_tasks_and_actors_get_neuron_cores_and_their_models_sit_there(
    cluster: dict[str, Any],
) -> None:
    began = time.monotonic()
    out = run_python(str(ROOT / "tests" / "ray_checks.py"), cluster["address"], env=cluster["env"])
    report = json.loads(out.strip().splitlines()[-1])  # after whatever Ray printed
    print(f"figure: tasks and actors on both nodes answered in {time.monotonic() - began:.1f} s")
    # Ray found each node's NeuronCores itself, through neuron-ls
    assert [n["resources"].get("neuron_cores") for n in report["nodes"]] == [NCS_PER_NODE] * 2
    daemons = {d.address for d in cluster["daemons"]}
    for kind, count in (("tasks", 2), ("actors", 1)):
        seen = report[kind]
        assert {s["node"] for s in seen} == {n["id"] for n in report["nodes"]}
        assert {s["daemon"] for s in seen} == daemons  # each on its own node's daemon
        for one in seen:
            visible = parse_indices(one["visible"], "NEURON_RT_VISIBLE_CORES")
            assert len(visible) == count
            assert set(one["ncs"]) == visible, one  # the model sits on Ray's cores
    for actor in report["actors"]:  # still held by the detached actors: neuron-cli sees it
        assert list_models(actor["daemon"], cluster["env"])[actor["model_id"]] == actor["ncs"]


def post(url: str, body: object) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_serve_replicas_on_both_nodes_answer_through_the_http_proxy(
    cluster: dict[str, Any],
) -> None:
    sample = build_mlp((4, 16, 3))
    neff = cluster["work"] / "mlp.neff"
    neff.write_bytes(sample.neff)
    http = free_port()
    began = time.monotonic()
    run_python(
        str(ROOT / "examples" / "ray_serve.py"),
        str(neff),
        f"--address={cluster['address']}",
        f"--port={http}",
        "--replicas=2",
        "--max-replicas-per-node=1",
        env=cluster["env"],
        timeout=180,
    )
    print(f"figure: Serve application of 2 replicas up in {time.monotonic() - began:.1f} s")
    url = f"http://127.0.0.1:{http}/"
    x = [[0.5, 0.25, 1.0, 0.0]]
    expected = sample.reference({"x": np.asarray(x, np.float32)})["probs"]
    answered: dict[str, dict[str, Any]] = {}
    latencies = []
    for _ in range(40):
        sent = time.monotonic()
        status, body = post(url, {"inputs": {"x": x}})
        latencies.append(time.monotonic() - sent)
        assert status == 200, body
        np.testing.assert_allclose(body["outputs"]["probs"], expected, rtol=1e-4, atol=1e-5)
        answered[body["node"]] = body
    assert len(answered) == 2  # a replica on each node answered
    assert {b["daemon"] for b in answered.values()} == {d.address for d in cluster["daemons"]}
    for body in answered.values():
        (core,) = parse_indices(body["neuron_cores"], "NEURON_RT_VISIBLE_CORES")
        assert list_models(body["daemon"], cluster["env"])[body["model_id"]] == [core]
    print(
        f"figure: request through Serve's HTTP proxy: median "
        f"{statistics.median(latencies) * 1000:.1f} ms over {len(latencies)}"
    )
    status, body = post(url, {"x": x})  # no "inputs": refused, saying what to send
    assert status == 400 and "must name the inputs" in body["error"]
    status, body = post(url, {"inputs": {"x": [[1.0, 2.0]]}})  # a wrong shape
    assert status == 400 and "NERR_INFER_BAD_INPUT" in body["error"]
