"""The project's own rules, which no outside linter knows, checked over the tree (`make lint`
runs it; `tests/project/test_house_rules.py` runs it and proves each rule can fail):

- `long`: no hand-written module (under `neuron_rtd/` and `driver_sim/`, generated code
  aside) is over 500 lines unless its first lines say why, in a comment
  `# long: <the reason>` (a marker with no reason counts as none);
- `classes`: no two classes of one name among those modules (private `_Name` included);
- `contracts`: every one of those modules is covered by an import contract of
  `pyproject.toml` (a layer of the layers contract, or a shared module's), and each
  package face (`FACES`) is guarded as a whole: a forbidden contract bars every module
  behind it, from every layer above it;
- `citations`: every repository file a comment or docstring names (a page under `docs/`,
  `neuron_rtd/runtime/shm.py:Name`, `ARCHITECTURE.md`) exists, in the `.py` files of
  `CITING`, resolved against the repository's root (a path starting `../` is outside it
  on purpose and is not checked);
- `test-names`: no two Python files under `tests/` of one file name: pytest imports a
  test module (and the helper modules of the folders on its `pythonpath`) by its file
  name alone, so the second of two is "import file mismatch", an error that stops it.

Usage: `python scripts/house_rules.py [--root DIR]`; exit 1 with one line per violation.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("neuron_rtd", "driver_sim")  # the hand-written code the rules cover
GENERATED = ("neuron_rtd/_generated",)
CITING = ("neuron_rtd", "driver_sim", "tests", "bench", "scripts")
MAX_LINES = 500
LONG_MARKER = re.compile(r"^#\s*long:(.*)$")
MARKER_LINES = 5  # where the marker may stand: the module's first lines
# Packages whose face (their __init__) is all that code outside them may import.
FACES = ("neuron_rtd.runtime", "neuron_rtd.serving", "neuron_rtd.server")
# A path a comment or docstring may cite: under a directory, or a top-level .md file.
CITED = re.compile(
    r"(?<![\w./-])((?:\.\./)*(?:[\w-]+/)+[\w.-]+\.(?:md|py|pyi|proto|toml|json|pbtxt|sh|txt))"
    r"|(?<![\w./-])([A-Z][A-Z0-9_-]*\.md)\b"
)


def modules(root: Path) -> Iterator[Path]:
    """The hand-written modules, in a stable order."""
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if not any(relative.startswith(g + "/") for g in GENERATED):
                yield path


def dotted(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def check_long(root: Path) -> list[str]:
    found = []
    for path in modules(root):
        lines = path.read_text().splitlines()
        if len(lines) <= MAX_LINES:
            continue
        reasons = [m.group(1).strip() for m in map(LONG_MARKER.match, lines[:MARKER_LINES]) if m]
        where = path.relative_to(root).as_posix()
        if not reasons:
            found.append(
                f"{where}: {len(lines)} lines (over {MAX_LINES}): split it by concept, "
                f"or say why not in a '# long: <reason>' comment in its first {MARKER_LINES} lines"
            )
        elif not any(reasons):
            found.append(f"{where}: {len(lines)} lines, and its '# long:' marker gives no reason")
    return found


def check_classes(root: Path) -> list[str]:
    defined: dict[str, list[str]] = defaultdict(list)
    for path in modules(root):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                defined[node.name].append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return [
        f"class {name} is defined {len(places)} times: {', '.join(places)}"
        for name, places in sorted(defined.items())
        if len(places) > 1
    ]


def _under(module: str, packages: set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _matches(module: str, expression: str) -> bool:
    """Whether an import-linter module expression (`a.b`, `a.*`, `a.**`) names `module`,
    as a package (its submodules included, import-linter's default)."""
    pattern = re.escape(expression).replace(r"\*\*", r"[\w.]+").replace(r"\*", r"\w+")
    return re.fullmatch(rf"{pattern}(\.[\w.]+)?", module) is not None


def check_contracts(root: Path) -> list[str]:
    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    layered = [c for c in contracts if c["type"] == "layers"]
    layers = [{p.strip() for p in layer.split("|")} for c in layered for layer in c["layers"]]
    covered = {p for layer in layers for p in layer}
    for contract in contracts:
        # a shared modules' contract: its sources may import no layer at all
        if contract["type"] == "forbidden" and covered <= set(contract["forbidden_modules"]):
            covered = covered | set(contract["source_modules"])
    found = []
    everything = [dotted(root, path) for path in modules(root)]
    for path, module in zip(modules(root), everything, strict=True):
        if module in PACKAGES and path.name == "__init__.py" and not _imports(path):
            continue  # a root package's own __init__ that imports nothing (its version)
        if not _under(module, covered):
            found.append(
                f"{module}: in no import contract (pyproject.toml): give it a layer, "
                "or add it to the shared modules' contract"
            )
    for face in FACES:
        level = next((i for i, layer in enumerate(layers) if _under(face, layer)), None)
        above = {p for layer in layers[:level] for p in layer} if level is not None else set()
        behind = [m for m in everything if m.startswith(face + ".")]
        faced = [  # contracts that bar modules behind the face, not the face itself
            c
            for c in contracts
            if c["type"] == "forbidden"
            and not any(_matches(face, e) for e in c["forbidden_modules"])
        ]
        guarded = [
            c
            for c in faced
            if all(any(_matches(m, e) for e in c["forbidden_modules"]) for m in behind)
        ]
        sources = {s for c in guarded for s in c["source_modules"]}
        if not guarded:
            open_ = [
                m
                for m in behind
                if not any(any(_matches(m, e) for e in c["forbidden_modules"]) for c in faced)
            ]
            found.append(
                f"{face}: no forbidden contract guards all of its modules "
                f"(unguarded: {', '.join(open_) or 'none, but no one contract has them all'})"
            )
        elif missing := sorted(above - sources - {face}):
            found.append(f"{face}: its face's contract does not cover {', '.join(missing)}")
    return found


def _imports(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(tree))


def _prose(source: str) -> Iterator[tuple[int, str]]:
    """A module's comments and docstrings, each with its first line."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                yield first.lineno, first.value.value


def check_citations(root: Path) -> list[str]:
    tops = {p.name for p in root.iterdir() if p.is_dir()} | {*CITING, "docs", "proto", "spec"}
    found = []
    for top in CITING:
        for path in sorted((root / top).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if any(relative.startswith(g + "/") for g in GENERATED):
                continue
            for line, text in _prose(path.read_text()):
                for match in CITED.finditer(text):
                    cited = match.group(1) or match.group(2)
                    if cited.startswith("../") or (
                        "/" in cited and cited.split("/")[0] not in tops
                    ):
                        continue
                    if not (root / cited).exists():
                        found.append(f"{relative}:{line}: cites {cited}, which is not there")
    return found


def check_test_names(root: Path) -> list[str]:
    by_name: dict[str, list[str]] = defaultdict(list)
    tests = root / "tests"
    if tests.is_dir():
        for path in sorted(tests.rglob("*.py")):
            # (pytest names each conftest.py by its folder)
            if path.name not in ("__init__.py", "conftest.py") and "__pycache__" not in path.parts:
                by_name[path.name].append(path.relative_to(root).as_posix())
    return [
        f"{name} is the name of {len(places)} test files: {', '.join(places)}; pytest "
        "imports them by file name, so give each its own"
        for name, places in sorted(by_name.items())
        if len(places) > 1
    ]


RULES = {
    "long": check_long,
    "classes": check_classes,
    "contracts": check_contracts,
    "citations": check_citations,
    "test-names": check_test_names,
}


def violations(root: Path) -> dict[str, list[str]]:
    return {name: rule(root) for name, rule in RULES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this)")
    args = parser.parse_args(argv)
    failed = 0
    for name, found in violations(args.root).items():
        for line in found:
            print(f"{name}: {line}")
        failed += len(found)
    if failed:
        print(f"house rules: {failed} violation(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
