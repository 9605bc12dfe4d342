"""The NEFF model package: read, validate and write, plus sample models.

A NEFF is a 1024-byte header (see `header`) followed by a tar archive (optionally
gzip-compressed) holding `neff.json` (the graph) and, per node and stage, a program JSON
and a weights blob; `casting` holds the one dtype policy for the values a caller gives a
model's inputs. This package imports only the stdlib, numpy and `neuron_rtd.errors`.
"""

from neuron_rtd.neff.builder import InstructionLike, NeffBuilder, StageSpec, write_neff
from neuron_rtd.neff.casting import as_input, input_array, safe_cast, shape_problem
from neuron_rtd.neff.dtypes import ALLOWED_DTYPES
from neuron_rtd.neff.header import (
    FEATURE_GZIP,
    HEADER_SIZE,
    MAGIC,
    NEFF_VERSION,
    PACKAGE_VERSION,
    SUPPORTED_VERSIONS,
    NeffHeader,
)
from neuron_rtd.neff.model import Bucket, Instruction, Neff, Node, NodeKind, Stage, TensorSpec
from neuron_rtd.neff.reader import read_neff, read_neff_file
from neuron_rtd.neff.samples import SampleModel, build_mlp

__all__ = [
    "ALLOWED_DTYPES",
    "FEATURE_GZIP",
    "HEADER_SIZE",
    "MAGIC",
    "NEFF_VERSION",
    "PACKAGE_VERSION",
    "SUPPORTED_VERSIONS",
    "Bucket",
    "Instruction",
    "InstructionLike",
    "Neff",
    "NeffBuilder",
    "NeffHeader",
    "Node",
    "NodeKind",
    "SampleModel",
    "Stage",
    "StageSpec",
    "TensorSpec",
    "as_input",
    "build_mlp",
    "input_array",
    "read_neff",
    "read_neff_file",
    "safe_cast",
    "shape_problem",
    "write_neff",
]
