"""Client shared memory in process: every bad case is a clean error, never a SIGBUS."""

from __future__ import annotations

import ctypes
import fcntl
import os
from pathlib import Path

import pytest

from neuron_rtd.errors import BadInput, InvalidError
from neuron_rtd.runtime.sessions import SessionId
from neuron_rtd.runtime.shm import (
    PARALLEL_READ_BYTES,
    PROT_READ,
    PROT_WRITE,
    ShmMapping,
    ShmTable,
)

RW = PROT_READ | PROT_WRITE
F_SEAL_FUTURE_WRITE = 0x10  # linux/fcntl.h; not in Python's fcntl


def at(table: ShmTable, path: str, caller: int | None = None, owner: int = 0) -> ShmMapping:
    """The mapping a call names (presenting session `caller`, on a model of session
    `owner`)."""
    presented = None if caller is None else SessionId(caller)
    return table.find(path, presented, SessionId(owner), "ifmap 'x'")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path


def make(root: Path, name: str, data: bytes) -> None:
    (root / name).write_bytes(data)


def test_round_trip_and_the_name_may_be_unlinked_after_mapping(root: Path) -> None:
    table = ShmTable(root=root)
    make(root, "aws_neuron_runtime_1", b"abcdefgh")
    table.map("/aws_neuron_runtime_1", RW, session_id=SessionId(7))
    (root / "aws_neuron_runtime_1").unlink()  # as the client may do right after shm_map
    mapping = at(table, "/aws_neuron_runtime_1", caller=7)
    assert at(table, "/aws_neuron_runtime_1", owner=7) is mapping  # by the model's session
    assert table.read(mapping, 4, "ifmap 'x'") == b"abcd"
    table.write(mapping, b"WXYZ", "ofmap 'y'")
    assert table.read(mapping, 8, "ifmap 'x'") == b"WXYZefgh"
    assert table.size(mapping, "x") == 8
    assert table.unmap_session(SessionId(7)) == ["/aws_neuron_runtime_1"] and len(table) == 0


def test_bad_names_are_refused(root: Path) -> None:
    table = ShmTable(root=root)
    for path in ("../etc/passwd", "/a/b", "", "/..", "..", "/", "/x y", "/" + "a" * 300):
        with pytest.raises(InvalidError, match="not a plain shared memory name"):
            table.map(path, RW)


def test_missing_object_directory_and_symlink_are_refused(root: Path) -> None:
    table = ShmTable(root=root)
    with pytest.raises(InvalidError, match=r"cannot map ./nothing. \(no such object"):
        table.map("/nothing", RW)
    (root / "folder").mkdir()
    with pytest.raises(InvalidError, match="'/folder' is not a shared memory object"):
        table.map("/folder", PROT_READ)
    outside = root / "outside"
    outside.write_bytes(b"secret")
    (root / "link").symlink_to(outside)
    with pytest.raises(InvalidError, match="cannot map '/link'"):
        table.map("/link", RW)
    assert len(table) == 0


def test_unmapped_too_small_and_shrunk_objects_are_clean_errors(root: Path) -> None:
    table = ShmTable(root=root)
    with pytest.raises(BadInput, match="'/x' is not mapped"):
        at(table, "/x")
    make(root, "small", b"12")
    table.map("/small", RW)
    small = at(table, "/small")
    with pytest.raises(BadInput, match="holds 2 bytes, the tensor takes 4"):
        table.read(small, 4, "ifmap 'x'")
    with pytest.raises(BadInput, match="holds 2 bytes, the tensor takes 4"):
        table.write(small, b"1234", "ofmap 'y'")
    assert (root / "small").read_bytes() == b"12"  # not grown by the write
    make(root, "shrinks", bytes(4096))
    table.map("/shrinks", RW)
    os.truncate(root / "shrinks", 100)  # the client shrinks it while it is mapped
    with pytest.raises(BadInput, match="holds 100 bytes, the tensor takes 4096"):
        table.read(at(table, "/shrinks"), 4096, "ifmap 'x'")


def test_read_only_mapping_refuses_outputs(root: Path) -> None:
    table = ShmTable(root=root)
    make(root, "ro", bytes(8))
    table.map("/ro", PROT_READ)
    with pytest.raises(BadInput, match="without PROT_WRITE"):
        table.write(at(table, "/ro"), b"12345678", "ofmap 'y'")


def test_unmap_while_in_use_is_deferred(root: Path) -> None:
    table = ShmTable(root=root)
    make(root, "busy", b"abcd")
    table.map("/busy", RW)
    busy = at(table, "/busy")
    with table._use(busy, "ifmap 'x'") as fd:
        table.unmap("/busy")
        assert os.pread(fd, 4, 0) == b"abcd"  # still open for its user
    with pytest.raises(OSError):
        os.fstat(fd)  # closed once the user let it go
    with pytest.raises(InvalidError, match="is not mapped"):
        table.unmap("/busy")
    with pytest.raises(BadInput, match="was unmapped"):  # named before, used after
        table.read(busy, 4, "ifmap 'x'")


def test_disabled_shared_memory_says_so(root: Path) -> None:
    make(root, "x", b"1")
    with pytest.raises(InvalidError, match="shmem_enabled false"):
        ShmTable(root=root, enabled=False).map("/x", RW)


def test_large_tensors_are_read_in_parts_exactly(root: Path) -> None:
    table = ShmTable(root=root)
    data = os.urandom((PARALLEL_READ_BYTES * 2) + 12345)
    make(root, "big", data)
    table.map("/big", PROT_READ)
    big = at(table, "/big")
    assert table.read(big, len(data), "ifmap 'x'") == data
    os.truncate(root / "big", len(data) - 1000)  # the client shrinks it: the last part is short
    with pytest.raises(BadInput, match=f"holds {len(data) - 1000} bytes, the tensor takes"):
        table.read(big, len(data), "ifmap 'x'")
    os.truncate(root / "big", PARALLEL_READ_BYTES // 2)  # now the first part is short too
    with pytest.raises(BadInput, match=f"holds {PARALLEL_READ_BYTES // 2} bytes"):
        table.read(big, len(data), "ifmap 'x'")


def test_a_name_is_per_session_and_never_taken_over(root: Path) -> None:
    """Client A maps '/t' and unlinks it; B makes a new '/t' and maps it in its own
    session: A's calls still reach A's object, B's reach B's."""
    table = ShmTable(root=root)
    make(root, "t", b"AAAA")
    table.map("/t", RW, session_id=SessionId(1))
    (root / "t").unlink()
    make(root, "t", b"BBBB")
    table.map("/t", RW, session_id=SessionId(2))
    assert table.read(at(table, "/t", caller=1), 4, "x") == b"AAAA"
    assert table.read(at(table, "/t", owner=1), 4, "x") == b"AAAA"
    assert table.read(at(table, "/t", caller=2), 4, "x") == b"BBBB"
    with pytest.raises(BadInput, match="not mapped for session"):
        at(table, "/t", caller=3)
    table.unmap("/t", SessionId(2))
    assert table.read(at(table, "/t", caller=1), 4, "x") == b"AAAA"


def test_a_passed_object_is_named_only_by_calls_presenting_its_session(root: Path) -> None:
    table = ShmTable(root=root)
    make(root, "p", b"mine")
    fd = os.open(root / "p", os.O_RDWR)
    (root / "p").unlink()  # passed, never named on disk
    table.adopt(fd, "/p", RW, session_id=SessionId(5))
    assert table.read(at(table, "/p", caller=5), 4, "x") == b"mine"
    with pytest.raises(BadInput, match="named only by calls that present it"):
        at(table, "/p", owner=5)  # a call on the session's model that presents nothing
    with pytest.raises(BadInput, match="not mapped for session"):
        at(table, "/p", caller=6)
    assert table.unmap_session(SessionId(5)) == ["/p"]


def test_a_passed_descriptor_that_is_no_regular_file_is_refused_and_closed(root: Path) -> None:
    table = ShmTable(root=root)
    read_end, write_end = os.pipe()
    with pytest.raises(InvalidError, match="not a shared memory object"):
        table.adopt(read_end, "/pipe", RW, session_id=SessionId(5))
    with pytest.raises(OSError):
        os.fstat(read_end)  # closed by the refusal
    os.close(write_end)


def memfd(data: bytes, seals: int = 0) -> int:
    fd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def test_a_passed_object_sealed_against_shrinking_is_mapped_and_copied_exactly(
    root: Path,
) -> None:
    table = ShmTable(root=root)
    fd = memfd(bytes(range(256)) * 64, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    table.adopt(os.dup(fd), "/sealed", RW, session_id=SessionId(5))
    mapping = at(table, "/sealed", caller=5)
    assert mapping.view is not None and len(mapping.view) == 16384
    assert table.read(mapping, 300, "x") == (bytes(range(256)) * 2)[:300]
    table.write(mapping, b"\xff" * 10, "y")
    assert os.pread(fd, 12, 0) == b"\xff" * 10 + bytes([10, 11])  # the client sees it
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 4)  # the seal: nobody can pull pages from under the daemon
    # a hole punched in it reads as zeros, no SIGBUS (FALLOC_FL_PUNCH_HOLE|KEEP_SIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.fallocate(fd, 3, ctypes.c_long(0), ctypes.c_long(8192)) == 0
    assert table.read(mapping, 8192 + 4, "x")[8188:] == b"\x00" * 4 + bytes(range(4))
    with pytest.raises(BadInput, match="holds 16384 bytes"):
        table.read(mapping, 16385, "x")  # past its end: the kernel's short read says so
    assert table.unmap_session(SessionId(5)) == ["/sealed"]
    assert mapping.view.closed
    os.close(fd)


def test_unsealed_or_unmappable_passed_objects_go_through_the_kernel(root: Path) -> None:
    table = ShmTable(root=root)
    plain = memfd(b"abcd")  # could be shrunk any time: never mapped
    future = memfd(b"efgh", fcntl.F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE)  # no writable map
    table.adopt(plain, "/plain", RW, session_id=SessionId(5))
    table.adopt(future, "/future", RW, session_id=SessionId(5))
    table.adopt(memfd(b"ijkl", fcntl.F_SEAL_SHRINK), "/ro", PROT_READ, session_id=SessionId(5))
    assert at(table, "/plain", caller=5).view is None
    assert at(table, "/future", caller=5).view is None
    assert at(table, "/ro", caller=5).view is not None  # read-only: mapped read-only
    assert [table.read(at(table, p, caller=5), 4, "x") for p in ("/plain", "/future", "/ro")] == [
        b"abcd",
        b"efgh",
        b"ijkl",
    ]
    with pytest.raises(BadInput, match="without PROT_WRITE"):
        table.write(at(table, "/ro", caller=5), b"z", "y")
    table.close()
