"""Hand-written code stays ruff-clean, ruff-formatted and mypy-clean (generated code is
excluded), and the layers hold (the import-linter contracts in pyproject.toml). The
project's own rules are `tests/project/test_house_rules.py`'s."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff() -> None:
    done = run("ruff", "check", ".")
    assert done.returncode == 0, done.stdout + done.stderr
    done = run("ruff", "format", "--check", ".")  # one layout: `ruff format` gives it
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy() -> None:
    done = run("mypy")
    assert done.returncode == 0, done.stdout + done.stderr


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_layers_hold() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("neuron_rtd/server/nmgr.py", "neuron_rtd.runtime.model"),
        # a runtime module the face's contract once left out (it named 12 of 21 by hand)
        ("neuron_rtd/server/nmgr.py", "neuron_rtd.runtime.sessions"),
        ("neuron_rtd/daemon/fronts.py", "neuron_rtd.serving.service"),
    ],
)
def test_a_wrong_import_breaks_the_layers(tmp_path: Path, module: str, imported: str) -> None:
    """The contracts are not vacuous: code reaching past a face (the runtime's, the
    serving core's) into a module behind it, in a copy of the tree with that one import
    added, fails them."""
    for part in ("neuron_rtd", "driver_sim"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    source = tmp_path / module
    source.write_text(source.read_text() + f"\nimport {imported}  # noqa\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    importer = module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {imported}" in done.stdout


def test_architecture_names_what_exists() -> None:
    """Every `path` and `path:function` ARCHITECTURE.md names is there."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = re.findall(r"`((?:neuron_rtd|driver_sim)/[\w/.]*)(?::([\w.]+))?`", text)
    assert len(named) > 20
    for path, symbol in named:
        where = ROOT / path
        assert where.exists(), f"ARCHITECTURE.md names {path}, which is gone"
        if symbol:
            source = where.read_text()
            for name in symbol.split("."):
                assert re.search(rf"^\s*(?:def|class) {name}\b", source, re.M), (
                    f"ARCHITECTURE.md names {path}:{symbol}; {name} is not defined there"
                )
