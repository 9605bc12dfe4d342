"""The checked-in generated code is what ``python -m neuron_rtd.protogen`` makes of proto/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from neuron_rtd import protogen


def test_generated_code_is_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    rc = protogen.main(["--check"])
    assert rc == 0, capsys.readouterr().err


@pytest.fixture
def tree_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of proto/ and of the generated package, to break on purpose."""
    proto_dir = tmp_path / "proto"
    out_dir = tmp_path / "_generated"
    shutil.copytree(protogen.default_proto_dir(), proto_dir)
    shutil.copytree(
        protogen.default_out_dir(), out_dir, ignore=shutil.ignore_patterns("__pycache__")
    )
    return proto_dir, out_dir


def _check(proto_dir: Path, out_dir: Path) -> int:
    return protogen.main(["--check", "--proto-dir", str(proto_dir), "--out-dir", str(out_dir)])


def test_check_passes_on_an_untouched_copy(tree_copy: tuple[Path, Path]) -> None:
    assert _check(*tree_copy) == 0


def test_check_reports_a_changed_field(
    tree_copy: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    proto_dir, out_dir = tree_copy
    nmgr = proto_dir / "nrt" / "nmgr.proto"
    text = nmgr.read_text()
    changed = text.replace("uint32 loop_end_value = 4;", "uint64 loop_end_value = 4;")
    assert changed != text
    nmgr.write_text(changed)

    assert _check(proto_dir, out_dir) == 1
    err = capsys.readouterr().err
    assert "stale:   nrt/nmgr_pb2.py" in err
    assert "ext_pb2" not in err  # only the files of the edited .proto are stale


def test_check_reports_missing_and_extra_files(
    tree_copy: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    proto_dir, out_dir = tree_copy
    (out_dir / "nrt" / "ext_pb2_grpc.py").unlink()
    (out_dir / "nrt" / "old_pb2.py").write_text("# left over\n")

    assert _check(proto_dir, out_dir) == 1
    err = capsys.readouterr().err
    assert "missing: nrt/ext_pb2_grpc.py" in err
    assert "extra:   nrt/old_pb2.py" in err


def test_regenerate_repairs_the_copy(tree_copy: tuple[Path, Path]) -> None:
    proto_dir, out_dir = tree_copy
    (out_dir / "nrt" / "nmgr_pb2.py").write_text("# edited by hand\n")
    (out_dir / "nrt" / "old_pb2.py").write_text("# left over\n")
    args = ["--proto-dir", str(proto_dir), "--out-dir", str(out_dir)]

    assert protogen.main(args) == 0
    assert _check(proto_dir, out_dir) == 0
    assert not (out_dir / "nrt" / "old_pb2.py").exists()


def test_imports_are_relative() -> None:
    for name in ("nmgr_pb2_grpc.py", "ext_pb2_grpc.py"):
        text = (protogen.default_out_dir() / "nrt" / name).read_text()
        assert "from nrt import" not in text
        assert f"from . import {name.removesuffix('_grpc.py')} as" in text
