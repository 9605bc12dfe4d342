"""Elementwise, activation, reduction and data-movement ops of the NeuronCore."""

from __future__ import annotations
