"""NN ops of the NeuronCore: convolutions, pooling, normalizations, resizing."""

from __future__ import annotations
