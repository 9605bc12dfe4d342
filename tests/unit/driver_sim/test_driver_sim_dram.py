"""driver_sim DRAM: the first-fit allocator, exhaustion, buffers and lazy backing."""

from __future__ import annotations

import numpy as np
import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from driver_sim import CHANNEL_BYTES, Device, DramExhausted, DriverError, Machine
from driver_sim.dram import ALIGN, ChannelAllocator


def test_allocations_are_aligned_and_rounded_up() -> None:
    channel = ChannelAllocator(1 << 20)
    addresses = [channel.allocate(n) for n in (1, 64, 65, 0, 200)]
    assert addresses == [0, 64, 128, 256, 320]
    assert all(a is not None and a % ALIGN == 0 for a in addresses)
    assert channel.used == 64 + 64 + 128 + 64 + 256


def _allocate(channel: ChannelAllocator, nbytes: int) -> int:
    address = channel.allocate(nbytes)
    assert address is not None
    return address


def test_first_fit_reuses_the_first_hole_that_fits() -> None:
    channel = ChannelAllocator(1 << 20)
    a = _allocate(channel, 128)
    b = _allocate(channel, 64)
    c = _allocate(channel, 256)
    d = _allocate(channel, 64)
    assert (a, b, c, d) == (0, 128, 192, 448)
    channel.free(b)
    channel.free(c)  # merges with b's hole: one hole [128, 448)
    assert channel.free_blocks() == [(128, 320), (512, (1 << 20) - 512)]
    assert channel.allocate(300) == 128  # fits in the merged hole
    assert channel.allocate(64) == 512  # the merged hole is full: the next one
    channel.free(a)
    assert channel.allocate(64) == 0  # the first hole, not the last one


def test_freeing_everything_coalesces_to_one_block() -> None:
    channel = ChannelAllocator(1 << 16)
    addresses = [_allocate(channel, 100) for _ in range(20)]
    for address in addresses[::2] + addresses[1::2]:
        channel.free(address)
    assert channel.free_blocks() == [(0, 1 << 16)]
    assert channel.used == 0


def test_allocator_reports_no_fit() -> None:
    channel = ChannelAllocator(1024)
    assert channel.allocate(1024) == 0
    assert channel.allocate(1) is None
    with pytest.raises(KeyError):
        channel.free(64)


def test_exhaustion_message_has_the_numbers(device: Device) -> None:
    device.dram_alloc(1, 10)
    with pytest.raises(DramExhausted) as caught:
        device.dram_alloc(1, 5 * 2**30)
    err = caught.value
    assert str(err) == (
        "device 0 (0000:00:1c.0) DRAM channel 1: cannot allocate 5368709120 bytes (5.0 GiB): "
        "4294967232 bytes free of 4294967296 (largest free block 4294967232)"
    )
    assert (err.device_index, err.channel, err.requested) == (0, 1, 5 * 2**30)
    assert (err.free, err.total, err.largest_free) == (CHANNEL_BYTES - 64, CHANNEL_BYTES, err.free)


def test_exhaustion_after_fragmentation(device: Device) -> None:
    gib = 2**30
    blocks = [device.dram_alloc(0, gib) for _ in range(4)]
    device.dram_free(blocks[0])
    device.dram_free(blocks[2])
    with pytest.raises(DramExhausted) as caught:
        device.dram_alloc(0, gib + 1)
    assert (caught.value.free, caught.value.largest_free) == (2 * gib, gib)
    assert device.dram_alloc(0, gib).address == 0


def test_dram_used_is_seen_from_the_tree(device: Device, machine: Machine) -> None:
    a = device.dram_alloc(0, 1000, tag="weights")
    device.dram_alloc(1, 0)
    assert device.dram_used() == (1024, 64)
    assert Machine.open(machine.root).device_info(0).dram_used == (1024, 64)
    device.dram_free(a)
    assert device.dram_used() == (0, 64)
    assert machine.device_info(0).dram_used == (0, 64)


def test_double_free_and_foreign_free(device: Device, machine: Machine) -> None:
    buf = device.dram_alloc(0, 128, tag="x")
    device.dram_free(buf)
    with pytest.raises(DriverError, match="double free"):
        device.dram_free(buf)
    (other,) = machine.acquire([1], address="unix:/t.sock", version="1")
    foreign = other.dram_alloc(0, 128)
    with pytest.raises(DriverError):
        device.dram_free(foreign)
    other.release()


def test_bad_channel_and_size(device: Device) -> None:
    with pytest.raises(ValueError, match="channel"):
        device.dram_alloc(2, 64)
    with pytest.raises(ValueError, match="negative"):
        device.dram_alloc(0, -1)


def test_buffer_write_read_view(device: Device) -> None:
    buf = device.dram_alloc(0, 64, tag="io")
    assert (buf.device_index, buf.channel, buf.nbytes, buf.tag) == (0, 0, 64, "io")
    buf.write(b"hello", offset=3)
    assert bytes(buf.read(3, 5)) == b"hello"
    values = np.arange(16, dtype=np.float32)
    buf.write(values)
    view = buf.view(np.float32, (4, 4))
    np.testing.assert_array_equal(view, values.reshape(4, 4))
    view[0, 0] = 42.0  # zero-copy: writes land in the buffer
    assert np.frombuffer(buf.read(0, 4), dtype=np.float32)[0] == 42.0
    buf.write(np.arange(8, dtype=np.int64)[::2])  # non-contiguous source
    np.testing.assert_array_equal(buf.view(np.int64, 4), [0, 2, 4, 6])
    assert len(buf.read()) == 64
    with pytest.raises(ValueError):
        buf.view(np.float32, (5, 4))
    with pytest.raises(ValueError):
        buf.write(bytes(65))
    with pytest.raises(ValueError):
        buf.read(60, 8)
    device.dram_free(buf)
    with pytest.raises(DriverError, match="freed"):
        buf.view(np.uint8, 1)


def test_large_buffers_cost_no_resident_memory(device: Device) -> None:
    process = psutil.Process()
    before = process.memory_info().rss
    big = device.dram_alloc(0, 2 * 2**30, tag="io")
    view = big.view(np.float32, (2**29,))
    big.write(b"x" * 4096, offset=2**30)
    view[:1024] = 1.0
    grown = process.memory_info().rss - before
    assert grown < 16 * 2**20, f"RSS grew by {grown} bytes"
    device.dram_free(big)
