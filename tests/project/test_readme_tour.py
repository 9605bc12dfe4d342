"""The README as a newcomer walks it: the five-minute tour run exactly as written, and every
link of the README and docs/ leading somewhere."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
TOUR_HEADING = "## A five-minute tour"
SERVING_HEADING = "## Serving with Triton's clients"


def tour_blocks(readme: str, heading: str = TOUR_HEADING) -> list[tuple[str, str]]:
    """(language, code) of each fenced block under `heading`, in order."""
    section = readme.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w*)\n(.*?)^```$", section, re.M | re.S)


def tour_script(blocks: list[tuple[str, str]]) -> str:
    """One bash script: the shell blocks' lines as they are, each Python block fed to
    `python` where it stands (as pasting it into `python` in that shell does)."""
    parts = []
    for language, code in blocks:
        assert language in ("sh", "python"), f"a {language!r} block in the tour: sh or python"
        parts.append(code if language == "sh" else f"python - <<'TOUR'\n{code}TOUR\n")
    return "".join(parts)


def test_the_tour_is_shell_and_python_and_says_how_to_begin() -> None:
    readme = README.read_text()
    blocks = tour_blocks(readme)
    assert [language for language, _ in blocks].count("python") == 1
    assert len(blocks) >= 4
    intro = readme.split(f"\n{TOUR_HEADING}\n", 1)[1].split("```", 1)[0]
    assert ". .venv/bin/activate" in intro and 'cd "$(mktemp -d)"' in intro


@pytest.mark.daemon
def test_the_tour_runs_as_written(work: Path) -> None:
    """In a fresh folder, the venv's commands first on PATH (`. .venv/bin/activate`), no
    NEURON_* variable of the caller's: every line as written, the daemon stopped at the end."""
    said = run_as_written(tour_script(tour_blocks(README.read_text())), work)
    address = f"unix:{work}/neuron.sock"
    assert f"| {address} |" in said  # neuron-ls: the devices, owned by the tour's daemon
    assert "total: 50 ops on the NC, 0 on the CPU" in said
    assert "Loaded model 10001 (main_graph) on NCG 1: READY" in said
    assert "probs: float32 (1, 100)" in said and "Unloaded model 10001" in said
    python = re.search(r"^(\d+)\n(\[[\d, ]+\])$", said, re.M)  # one call, then 8 futures
    assert python is not None, said
    assert json.loads(python[2]) == [int(python[1])] * 8
    assert f"neuron-top 0.1.0  |  neuron-rtd 0.1.0  |  inf1.6xlarge  |  {address}" in said
    (report,) = [json.loads(line) for line in said.splitlines() if line.startswith("{")]
    (runtime,) = report["neuron_runtime_data"]
    assert (runtime["address"], runtime["error"]) == (address, "")
    assert said.rstrip().endswith("[NRTD:RunServer] Stopped")  # kill %1: drained, let go
    assert sorted(p.name for p in work.iterdir()) == [
        "daemon.log",
        "in.npz",
        "resnet.neff",
        "resnet.onnx",
        "sim",
    ]


@pytest.mark.daemon
def test_the_serving_section_runs_as_written(work: Path) -> None:
    """ "Serving with Triton's clients" likewise (its HTTP port made a free one): the
    repository's model served to tritonclient over gRPC and HTTP, seen by neuron-cli."""
    blocks = tour_blocks(README.read_text(), SERVING_HEADING)
    assert [language for language, _ in blocks] == ["sh", "python", "sh"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = tour_script(blocks).replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    said = run_as_written(script, work)
    lines = said.splitlines()
    assert "8" in lines  # max_batch_size, completed from the NEFF's buckets
    assert re.search(r"^\[\d+ \d+ \d+\]$", said, re.M), said  # 3 images' classes
    assert "True 3" in lines  # ready over HTTP, and the 3 rows counted
    # the repository model under its repository name (its NEFF says main_graph)
    assert re.search(r"^Found 1 model\n10001 READY \d+ resnet$", said, re.M), said


def run_as_written(script: str, work: Path) -> str:
    """What `script` says, run by bash in `work` with the venv's commands first on PATH
    and no NEURON_* variable of the caller's; fails the test unless it ends well."""
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON")}
    env |= {"PATH": f"{venv_bin}:{env['PATH']}", "VIRTUAL_ENV": str(venv_bin.parent)}
    tour = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its group holds the daemon it starts
    )
    try:
        said, _ = tour.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(tour.pid, signal.SIGKILL)
        said, _ = tour.communicate()
        log = (work / "daemon.log").read_text() if (work / "daemon.log").exists() else ""
        pytest.fail(f"the tour did not end in 300 s:\n{said}\ndaemon.log:\n{log}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(tour.pid, signal.SIGKILL)  # a daemon the tour left
    assert tour.returncode == 0, said
    assert "Traceback" not in said and not re.search(r"^[\w-]+: error", said, re.M), said
    return said


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.M | re.S)
    return {github_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize(
    "page", [README, ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
)
def test_every_link_leads_somewhere(page: Path) -> None:
    """Each relative link names a file of the checkout, and each #anchor a heading there."""
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"\w+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.is_file(), f"{page.name} links to {target}: no such file"
        if anchor:
            assert anchor in anchors(linked), f"{page.name} links to {target}: no such heading"


def test_the_docs_keep_what_the_readme_held() -> None:
    """The depth the README used to hold, each in its page (a sample of each section)."""
    held = {
        "client.md": ["NEURONCORE_GROUP_SIZES=2,2", "NrtConnectionError", "client.attach"],
        "wire-api.md": ["grpc.health.v1.Health", "ProtoReflectionDescriptorDatabase"],
        "operations.md": ["| `session_max_per_peer` |", "tests/client_deaths.py", "preadv"],
        "packaging.md": ["RuntimeDirectoryPreserve=yes", "packaging/install.sh", "lintian"],
        "tools.md": ["Found 2 models", "neuroncore_utilization_ratio", "ui.perfetto.dev"],
        "streaming.md": ["--max-record-mb", "bench/stream.py", "O_EXCL|O_NOFOLLOW"],
        "internals.md": ["--auto-cast", "NEURON_SIM_FAULTS", "bench/sessions.py"],
    }
    for page, facts in held.items():
        text = (ROOT / "docs" / page).read_text()
        for fact in facts:
            assert fact in text, f"docs/{page} lost {fact!r}"
