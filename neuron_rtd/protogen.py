"""Regenerate (or check) the Python code of the wire API from ``proto/``.

    python -m neuron_rtd.protogen            # rewrite neuron_rtd/_generated/
    python -m neuron_rtd.protogen --check    # exit 1 if it is stale, listing the files

The compiler is ``grpc_tools.protoc``, run in-process with its bundled include path (for
the well-known types). For each ``proto/<dir>/<name>.proto`` it emits ``<name>_pb2.py``,
``<name>_pb2.pyi`` and ``<name>_pb2_grpc.py`` under ``neuron_rtd/_generated/<dir>/``.
protoc writes cross-file imports as absolute ones (``from nrt import nmgr_pb2``), which
only work with the output dir on ``sys.path``; they are rewritten into relative imports so
the code imports as a subpackage (``neuron_rtd._generated.nrt.nmgr_pb2_grpc``). Each
package dir gets an ``__init__.py`` that marks it as generated. Output is a pure function
of the ``.proto`` files and the pinned grpcio-tools version, so ``--check`` can compare
byte for byte.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

GENERATED_MARKER = "GENERATED CODE -- DO NOT EDIT."

_INIT_TEMPLATE = '''"""{package}: {marker}

Python code of the wire API, compiled from the .proto files under proto/ by grpc_tools
(neuron_rtd/protogen.py). Edit the .proto files, never these, and regenerate with:

    python -m neuron_rtd.protogen

``python -m neuron_rtd.protogen --check`` (run by the tests) fails when this drifts.
"""
'''

# ``from nrt import nmgr_pb2`` / ``from nrt.sub import x_pb2`` / ``import x_pb2`` (root-level
# proto), at the start of a line, as protoc writes them in .py and .pyi files.
_FROM_IMPORT_RE = re.compile(r"^from ([A-Za-z_][\w.]*) import (\w+_pb2)\b", re.MULTILINE)
_PLAIN_IMPORT_RE = re.compile(r"^import (\w+_pb2) as\b", re.MULTILINE)


def repo_root() -> Path:
    """The project root: the parent of the ``neuron_rtd`` package dir."""
    return Path(__file__).resolve().parent.parent


def default_proto_dir() -> Path:
    return repo_root() / "proto"


def default_out_dir() -> Path:
    return repo_root() / "neuron_rtd" / "_generated"


@dataclass(frozen=True, kw_only=True)
class Drift:
    """Differences between the checked-in generated tree and a fresh generation."""

    stale: list[str]
    missing: list[str]
    extra: list[str]

    @property
    def clean(self) -> bool:
        return not (self.stale or self.missing or self.extra)

    def lines(self) -> list[str]:
        return (
            [f"stale:   {p}" for p in self.stale]
            + [f"missing: {p}" for p in self.missing]
            + [f"extra:   {p}" for p in self.extra]
        )


class ProtocError(RuntimeError):
    """protoc refused the .proto files (its messages went to stderr)."""


def find_protos(proto_dir: Path) -> list[str]:
    """The .proto files under ``proto_dir``, relative to it, POSIX-style, sorted."""
    return sorted(p.relative_to(proto_dir).as_posix() for p in proto_dir.rglob("*.proto"))


def _well_known_include() -> str:
    from importlib import resources

    return str(resources.files("grpc_tools") / "_proto")


def _run_protoc(proto_dir: Path, protos: list[str], out_dir: Path) -> None:
    from grpc_tools import protoc

    args = [
        "grpc_tools.protoc",
        f"--proto_path={proto_dir}",
        f"--proto_path={_well_known_include()}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise ProtocError(f"protoc failed with exit code {rc} on {', '.join(protos)}")


def _relative_import(importer_pkg: list[str], target_pkg: list[str]) -> str:
    """The ``from`` part that reaches ``target_pkg`` from a module in ``importer_pkg``."""
    common = 0
    while (
        common < min(len(importer_pkg), len(target_pkg))
        and importer_pkg[common] == target_pkg[common]
    ):
        common += 1
    dots = "." * (len(importer_pkg) - common + 1)
    return dots + ".".join(target_pkg[common:])


def relativize_imports(text: str, *, importer_pkg: list[str], local_modules: set[str]) -> str:
    """Rewrite protoc's absolute imports of our own generated modules as relative ones.

    ``local_modules`` holds dotted names (``nrt.nmgr_pb2``) of the modules generated in
    this run; imports of anything else (``google.protobuf``) are left alone.
    """

    def from_import(m: re.Match[str]) -> str:
        package, module = m.group(1), m.group(2)
        if f"{package}.{module}" not in local_modules:
            return m.group(0)
        return f"from {_relative_import(importer_pkg, package.split('.'))} import {module}"

    def plain_import(m: re.Match[str]) -> str:
        module = m.group(1)
        if module not in local_modules:
            return m.group(0)
        return f"from {_relative_import(importer_pkg, [])} import {module} as"

    text = _FROM_IMPORT_RE.sub(from_import, text)
    return _PLAIN_IMPORT_RE.sub(plain_import, text)


def _package_dirs(files: Iterable[str]) -> set[str]:
    """Every package dir (relative, POSIX, "" for the root) holding or above ``files``."""
    dirs = {""}
    for f in files:
        parts = f.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return dirs


def _init_text(package_dir: str) -> str:
    package = "neuron_rtd._generated" + ("." + package_dir.replace("/", ".") if package_dir else "")
    return _INIT_TEMPLATE.format(package=package, marker=GENERATED_MARKER)


def generate(proto_dir: Path, *, work_dir: Path) -> dict[str, str]:
    """Compile every .proto under ``proto_dir``; return {relative path: file text}.

    ``work_dir`` is an empty scratch dir for protoc's raw output.
    """
    protos = find_protos(proto_dir)
    if not protos:
        raise ProtocError(f"no .proto files under {proto_dir}")
    _run_protoc(proto_dir, protos, work_dir)

    local_modules = {p[: -len(".proto")].replace("/", ".") + "_pb2" for p in protos}
    result: dict[str, str] = {}
    for path in sorted(work_dir.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(work_dir).as_posix()
        importer_pkg = rel.split("/")[:-1]
        text = path.read_text(encoding="utf-8")
        result[rel] = relativize_imports(
            text, importer_pkg=importer_pkg, local_modules=local_modules
        )
    for package_dir in _package_dirs(result):
        init = f"{package_dir}/__init__.py" if package_dir else "__init__.py"
        result[init] = _init_text(package_dir)
    return dict(sorted(result.items()))


def _existing_files(out_dir: Path) -> dict[str, Path]:
    """Files of a generated tree, relative path -> path, bytecode caches left out."""
    if not out_dir.is_dir():
        return {}
    return {
        p.relative_to(out_dir).as_posix(): p
        for p in sorted(out_dir.rglob("*"))
        if p.is_file() and "__pycache__" not in p.relative_to(out_dir).parts
    }


def compare(expected: dict[str, str], out_dir: Path) -> Drift:
    existing = _existing_files(out_dir)
    stale = [
        rel
        for rel, text in expected.items()
        if rel in existing and existing[rel].read_bytes() != text.encode("utf-8")
    ]
    missing = [rel for rel in expected if rel not in existing]
    extra = [rel for rel in existing if rel not in expected]
    return Drift(stale=stale, missing=missing, extra=extra)


def _owned_by_generator(out_dir: Path) -> bool:
    """True if ``out_dir`` is absent, empty, or marked generated (safe to prune)."""
    init = out_dir / "__init__.py"
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return True
    return init.is_file() and GENERATED_MARKER in init.read_text(encoding="utf-8")


def write_tree(expected: dict[str, str], out_dir: Path) -> Drift:
    """Make ``out_dir`` hold exactly ``expected``; return what had to change."""
    if not _owned_by_generator(out_dir):
        raise ProtocError(
            f"{out_dir} exists but its __init__.py lacks the generated marker; "
            "refusing to overwrite it"
        )
    drift = compare(expected, out_dir)
    for rel in [*drift.stale, *drift.missing]:
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(expected[rel].encode("utf-8"))
    for rel in drift.extra:
        (out_dir / rel).unlink()
    # Drop package dirs that the removals left without files.
    for d in sorted((p for p in out_dir.rglob("*") if p.is_dir()), reverse=True):
        if d.name == "__pycache__":
            continue
        if not any(f.is_file() for f in d.rglob("*") if "__pycache__" not in f.parts):
            shutil.rmtree(d)
    return drift


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m neuron_rtd.protogen",
        description="Regenerate the wire API's Python code from the .proto files.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="generate into a temp dir and exit 1 if the checked-in code differs",
    )
    parser.add_argument(
        "--proto-dir",
        type=Path,
        default=None,
        help="dir holding the .proto files (default: <repo>/proto)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="generated package dir (default: <repo>/neuron_rtd/_generated)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    proto_dir: Path = (args.proto_dir or default_proto_dir()).resolve()
    out_dir: Path = (args.out_dir or default_out_dir()).resolve()

    try:
        with tempfile.TemporaryDirectory(prefix="protogen-") as tmp:
            expected = generate(proto_dir, work_dir=Path(tmp))
            drift = compare(expected, out_dir) if args.check else write_tree(expected, out_dir)
    except ProtocError as exc:
        print(f"protogen: {exc}", file=sys.stderr)
        return 2

    if args.check:
        if drift.clean:
            print(f"protogen: {out_dir} is up to date with {proto_dir}")
            return 0
        print(f"protogen: {out_dir} is out of date with {proto_dir}:", file=sys.stderr)
        for line in drift.lines():
            print(f"  {line}", file=sys.stderr)
        print("protogen: run `python -m neuron_rtd.protogen` to regenerate", file=sys.stderr)
        return 1

    for rel in drift.stale:
        print(f"protogen: updated {rel}")
    for rel in drift.missing:
        print(f"protogen: created {rel}")
    for rel in drift.extra:
        print(f"protogen: removed {rel}")
    print(f"protogen: {out_dir} regenerated from {proto_dir} ({len(expected)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
