"""The project's own rules (`scripts/house_rules.py`, run by `make lint`) hold on the tree,
and each of them fails on a tree that breaks it: a check that cannot fail keeps nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("house_rules", ROOT / "scripts/house_rules.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["house_rules"] = module  # dataclasses and typing look a module up here
    spec.loader.exec_module(module)
    return module


rules = _load()

PYPROJECT = """
[[tool.importlinter.contracts]]
name = "layers"
type = "layers"
layers = ["neuron_rtd.top", "neuron_rtd.runtime", "driver_sim"]

[[tool.importlinter.contracts]]
name = "shared"
type = "forbidden"
source_modules = ["neuron_rtd.errors"]
forbidden_modules = ["neuron_rtd.top", "neuron_rtd.runtime", "driver_sim"]

[[tool.importlinter.contracts]]
name = "runtime face"
type = "forbidden"
source_modules = [SOURCES]
forbidden_modules = [BEHIND]
"""


def tree(root: Path, files: dict[str, str], sources: str = '"neuron_rtd.top"') -> Path:
    """A small repository: `files` (path -> text) and a pyproject with three layers
    (`top` over `runtime` over `driver_sim`), a shared module and the runtime's face."""
    behind = '"neuron_rtd.runtime.*"'
    for path, text in {
        "neuron_rtd/__init__.py": '__version__ = "0"\n',
        "neuron_rtd/errors.py": "",
        "neuron_rtd/top/__init__.py": "",
        "neuron_rtd/runtime/__init__.py": "",
        "neuron_rtd/runtime/core.py": "",
        "driver_sim/__init__.py": "",
        **files,
    }.items():
        if path == "BEHIND":
            behind = text
            continue
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    pyproject = PYPROJECT.replace("SOURCES", sources).replace("BEHIND", behind)
    (root / "pyproject.toml").write_text("[tool.importlinter]\n" + pyproject)
    return root


def test_the_tree_keeps_the_house_rules() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/house_rules.py"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_synthetic_tree_that_keeps_them_passes(tmp_path: Path) -> None:
    assert rules.violations(tree(tmp_path, {})) == {name: [] for name in rules.RULES}


@pytest.mark.parametrize(
    ("head", "fails"),
    [
        ("", True),
        ("# long: a table of the NC's opcodes, one row each\n", False),
        ("# long:\n", True),
        ("# long:   \n", True),
        ("\n" * 5 + "# long: too far down\n", True),
    ],
)
def test_a_long_module_needs_a_reason_at_its_top(tmp_path: Path, head: str, fails: bool) -> None:
    body = "x = 1\n" * 501
    found = rules.check_long(tree(tmp_path, {"neuron_rtd/top/big.py": head + body}))
    assert bool(found) == fails, found
    assert all("neuron_rtd/top/big.py" in line for line in found)


def test_long_counts_hand_written_modules_only(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "neuron_rtd/top/edge.py": "x = 1\n" * 500,
            "neuron_rtd/_generated/big_pb2.py": "x = 1\n" * 900,
        },
    )
    assert rules.check_long(root) == []


def test_two_classes_of_one_name_fail_private_ones_too(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "neuron_rtd/top/a.py": "class _Stream:\n    pass\n",
            "driver_sim/b.py": "def f() -> None:\n    class _Stream:\n        pass\n",
        },
    )
    (found,) = rules.check_classes(root)
    assert "class _Stream is defined 2 times" in found
    assert "neuron_rtd/top/a.py:1" in found and "driver_sim/b.py:2" in found


def test_two_test_files_of_one_name_fail(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {"tests/unit/a/test_axes.py": "", "tests/unit/b/test_axes.py": "", "tests/x.py": ""},
    )
    (found,) = rules.check_test_names(root)
    assert "test_axes.py" in found and "tests/unit/a/test_axes.py" in found, found
    assert "tests/unit/b/test_axes.py" in found


def test_a_module_no_contract_covers_fails(tmp_path: Path) -> None:
    (found,) = rules.check_contracts(tree(tmp_path, {"neuron_rtd/stray.py": ""}))
    assert found.startswith("neuron_rtd.stray: in no import contract")


def test_a_face_listed_by_hand_must_list_every_module_behind_it(tmp_path: Path) -> None:
    """The runtime's face contract once named 12 of its 21 modules: a module added behind
    a face listed by hand is unguarded, and that fails."""
    files = {"neuron_rtd/runtime/newer.py": "", "BEHIND": '"neuron_rtd.runtime.core"'}
    (found,) = rules.check_contracts(tree(tmp_path, files))
    assert "neuron_rtd.runtime: no forbidden contract guards all" in found
    assert "neuron_rtd.runtime.newer" in found


def test_a_face_must_be_guarded_from_every_layer_above(tmp_path: Path) -> None:
    (found,) = rules.check_contracts(tree(tmp_path, {}, sources='"neuron_rtd.errors"'))
    assert found == "neuron_rtd.runtime: its face's contract does not cover neuron_rtd.top"


def test_the_real_faces_are_whole(tmp_path: Path) -> None:
    """On this repository's modules: the runtime's face contract as it was (12 modules
    named by hand) fails the rule."""
    for part in ("neuron_rtd", "driver_sim"):
        (tmp_path / part).symlink_to(ROOT / part)
    text = (ROOT / "pyproject.toml").read_text()
    named = ("api", "dataplane", "driver", "host", "inflight", "loader", "local", "model")
    twelve = ", ".join(
        f'"neuron_rtd.runtime.{m}"' for m in (*named, "ncg", "runtime", "shm", "stats")
    )
    assert '["neuron_rtd.runtime.*"]' in text
    (tmp_path / "pyproject.toml").write_text(text.replace('"neuron_rtd.runtime.*"', twelve))
    found = rules.check_contracts(tmp_path)
    assert any("neuron_rtd.runtime: no forbidden contract guards all" in f for f in found)
    assert any("neuron_rtd.runtime.sessions" in f for f in found)


def test_a_cited_file_that_is_not_there_fails(tmp_path: Path) -> None:
    source = (
        '"""See docs/design.md and ARCHITECTURE.md; the spec: ../shared/spec/api.md."""\n'
        "# the fake: tests/fake_device.py:FakeDevice; a bucket: DIR/NAME/config.pbtxt\n"
        "PATH = 'docs/not_a_citation.md'  # a string in code is not a citation\n"
    )
    root = tree(tmp_path, {"tests/test_x.py": source})
    assert sorted(rules.check_citations(root)) == [
        "tests/test_x.py:1: cites ARCHITECTURE.md, which is not there",
        "tests/test_x.py:1: cites docs/design.md, which is not there",
        "tests/test_x.py:2: cites tests/fake_device.py, which is not there",
    ]
    for path in ("docs/design.md", "ARCHITECTURE.md", "tests/fake_device.py"):
        (root / path).parent.mkdir(exist_ok=True)
        (root / path).write_text("")
    assert rules.check_citations(root) == []


def test_the_checker_exits_1_and_names_each_violation(tmp_path: Path) -> None:
    root = tree(
        tmp_path, {"neuron_rtd/top/a.py": "class A: ...\n", "driver_sim/a.py": "class A: ...\n"}
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/house_rules.py"), "--root", str(root)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stdout.startswith("classes: class A is defined 2 times")
