"""The project's packaging metadata: what pip and the Debian package build from."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_license_is_an_spdx_expression_so_setuptools_warns_nothing() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # a table ({text = ...}) makes setuptools >= 77 print a deprecation warning per build step
    assert meta["project"]["license"] == "Apache-2.0"
    assert meta["build-system"]["requires"] == ["setuptools>=77"]
