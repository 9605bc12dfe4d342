"""The daemon's heap settings take effect on this (glibc) platform."""

from __future__ import annotations

import platform

import pytest

from neuron_rtd.daemon.memory import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_heap_thresholds_are_accepted() -> None:
    assert keep_freed_memory() is True
