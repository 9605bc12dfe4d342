"""Winograd convolution (an internal NC instruction the compiler emits for 3x3 convs)."""

from __future__ import annotations
