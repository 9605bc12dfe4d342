"""The NeuronCore's engines and the deterministic model of what work costs on them.

Every instruction runs on one engine: matmul-type ops on PE (the systolic array),
activations and softmax on ACT, elementwise, pooling, reductions and data movement on POOL.

Cost model (deterministic, from tensor shapes only):
- MACs: a matmul-type op producing `Y` with contraction length `K` costs `Y.size * K`
  MACs (MatMul: K = A.shape[-1]; Gemm: K = the shared dimension after transposes);
  every other op costs 0 MACs. The integer products of the quantized ops (QLinearConv,
  QLinearMatMul, MatMulInteger, ConvInteger, QGemm) count their int8 MACs the same way,
  at the same PE rate: the real chip's int8 rate is twice its fp16/bf16 rate, which this
  model does not give (its PE cycles are dtype-blind).
- Cycles: each instruction costs `ISSUE_CYCLES` on its engine plus, on PE,
  ceil(MACs / PE_MACS_PER_CYCLE) (a 128 x 128 array), and on ACT and POOL,
  ceil(output elements / LANES) (128 lanes).
- Side work: an op that also runs instructions on other engines (a recurrent layer's
  per-step products on PE, its gates on ACT and POOL) counts them there, each costing
  `ISSUE_CYCLES` plus, on ACT and POOL, its share of ceil(elements / LANES)
  (`side_cycles`); its MACs are all counted with its own instruction.
- Clock: `NC_CLOCK_HZ` = 1.4 GHz. An engine's idle cycles are the cycles elapsed since
  the device's last reset (or claim) minus that engine's busy cycles, at least 0.
  The model has no cross-engine synchronisation, so wait-event cycles are always 0.
"""

from __future__ import annotations

import enum

NC_CLOCK_HZ = 1_400_000_000
PE_MACS_PER_CYCLE = 128 * 128
LANES = 128
ISSUE_CYCLES = 64


class Engine(enum.IntEnum):
    """The engines of a NeuronCore; the value is the engine's slot in cycle counters."""

    PE = 0
    ACT = 1
    POOL = 2


def engine_cycles(engine: Engine, macs: int, output_elements: int) -> int:
    """Cycles one instruction keeps `engine` busy."""
    if engine is Engine.PE:
        return ISSUE_CYCLES + -(-macs // PE_MACS_PER_CYCLE)
    return ISSUE_CYCLES + -(-output_elements // LANES)


def elapsed_cycles(elapsed_ns: int) -> int:
    """Clock cycles in `elapsed_ns` nanoseconds at `NC_CLOCK_HZ`."""
    return max(0, elapsed_ns) * NC_CLOCK_HZ // 1_000_000_000


def side_cycles(engine: Engine, instructions: int, elements: int) -> int:
    """Cycles `instructions` of an op's side work keep `engine` busy, writing `elements`
    in all (their MACs are counted with the op's own instruction)."""
    if engine is Engine.PE:
        return ISSUE_CYCLES * instructions
    return ISSUE_CYCLES * instructions + -(-elements // LANES)
