"""The NeuronCore's op library: numpy kernels with ONNX semantics, one module per concept.

`registry` holds the registry (`KERNELS`, `Kernel`, the `kernel` decorator) and what the
op modules share (attribute parsers, dtype sets, support checks, helpers); it imports no
op module. Importing an op module registers its kernels, and this package imports each
of them: linalg, elementwise, activation, logic, reduce, shape (views) and rearrange (new
tensors: Pad, DepthToSpace, OneHot, Unique...), create, cast, conv and
winograd, pool, norm, resize, random, recurrent, attention (Attention, LinearAttention,
RotaryEmbedding), loss, scatter (indexed reads and writes), grid (GridSample,
AffineGrid), signal (windows, DFT, STFT), detection (NonMaxSuppression, RoiAlign),
bits (bitwise ops, shifts, Mod, BitCast), quant (int8 arithmetic: QuantizeLinear...),
qproducts (the int8 products: MatMulInteger, QLinearConv, QGemm...), qlinear
(onnxruntime's quantized element-wise and pooling ops, computed through float),
qfunctions (float functions of int8 tensors computed exactly: QuantizedLookup,
QuantizedSoftmax, QuantizedLayerNorm).
`window` holds the sliding-window geometry that conv and pool share, `sequence` the
recurrent layers' (time-major inputs, sequence lengths, the scan over steps).
"""

from driver_sim.ops import (  # noqa: F401 (imported to register their kernels)
    activation,
    attention,
    bits,
    cast,
    conv,
    create,
    detection,
    elementwise,
    grid,
    linalg,
    logic,
    loss,
    norm,
    pool,
    qfunctions,
    qlinear,
    qproducts,
    quant,
    random,
    rearrange,
    recurrent,
    reduce,
    resize,
    scatter,
    shape,
    signal,
    winograd,
)
from driver_sim.ops.registry import (
    KERNELS,
    REQUIRED,
    Attr,
    ComputeFn,
    Kernel,
    MacCount,
    Shape,
    SideWork,
    SupportCheck,
    kernel,
    supported_ops,
)

__all__ = [
    "KERNELS",
    "REQUIRED",
    "Attr",
    "ComputeFn",
    "Kernel",
    "MacCount",
    "Shape",
    "SideWork",
    "SupportCheck",
    "kernel",
    "supported_ops",
]
