"""BERT-style text encoder, as HuggingFace's BertModel exports to ONNX (opset 17).

inputs "input_ids" int64 [B, S] and "attention_mask" int64 [B, S] (1 = token, 0 = padding).

Embeddings: word embeddings Gather(input_ids) + position embeddings
Gather(Range(0, S)) with S = Gather(Shape(input_ids), 1) + token-type embedding row 0
(broadcast), then LayerNormalization. The attention mask becomes the additive
(1 - Cast(mask)) * -10000, unsqueezed to [B, 1, 1, S].

Each encoder layer: Q, K, V = MatMul + Add bias; Reshape to [B, S, heads, head_dim] with the
shape constant [0, 0, heads, head_dim]; Transpose Q and V to [B, heads, S, head_dim] and K
to [B, heads, head_dim, S]; scores = MatMul(Q, K^T) * 1/sqrt(head_dim) + mask;
Softmax(axis=-1); MatMul with V; Transpose back and Reshape to [0, 0, hidden]; output
projection + residual + LayerNormalization; FFN MatMul + Add, GELU as
x * 0.5 * (1 + Erf(x / sqrt(2))), MatMul + Add, + residual, LayerNormalization.

outputs "last_hidden_state" float32 [B, S, hidden] and "pooler_output" float32 [B, hidden]
(token 0 via Gather on axis 1, Gemm, Tanh). Weights ~ N(0, 0.02) as BERT initialises them;
biases and LayerNorm parameters are small random perturbations of 0 and 1. A padded
position never changes the real ones: with attention_mask 0 there, its keys get -10000
and the real positions' outputs (and the pooler) are the same as without the padding.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from neuron_rtd.models._graph import FLOAT, INT64, GraphBuilder, as_dim, make_model, normal

INIT_STD = 0.02
LN_EPS = 1e-12
MASK_VALUE = -10000.0

# a fast variant for tests (still long enough for 128-token sequences)
SMALL: dict[str, Any] = {
    "layers": 2,
    "hidden": 64,
    "heads": 4,
    "intermediate": 256,
    "vocab": 1000,
    "max_position": 128,
}


class _BertWriter:
    def __init__(self, b: GraphBuilder, rng: np.random.Generator) -> None:
        self.b = b
        self.rng = rng

    def weight(self, name: str, shape: tuple[int, ...]) -> str:
        return self.b.initializer(name, normal(self.rng, shape, INIT_STD))

    def bias(self, name: str, n: int) -> str:
        return self.b.initializer(name, normal(self.rng, (n,), INIT_STD))

    def linear(self, x: str, name: str, n_in: int, n_out: int) -> str:
        """x @ W + b, with W stored [in, out] (transposed, as torch.onnx writes it)."""
        b = self.b
        w = b.initializer(f"{name}.weight", normal(self.rng, (n_in, n_out), INIT_STD))
        y = b.op("MatMul", [x, w])
        return b.op("Add", [self.bias(f"{name}.bias", n_out), y])

    def layer_norm(self, x: str, name: str, n: int) -> str:
        b = self.b
        gamma = 1.0 + normal(self.rng, (n,), INIT_STD)
        beta = normal(self.rng, (n,), INIT_STD)
        with b.scope("LayerNorm"):
            return b.op(
                "LayerNormalization",
                [x, b.initializer(f"{name}.weight", gamma), b.initializer(f"{name}.bias", beta)],
                axis=-1,
                epsilon=LN_EPS,
            )

    def attention(self, x: str, mask: str, prefix: str, hidden: int, heads: int) -> str:
        b = self.b
        head_dim = hidden // heads
        split_shape = b.const([0, 0, heads, head_dim], np.int64, hint="Constant")
        projected: dict[str, str] = {}
        with b.scope("attention", "self"):
            for part, perm in (
                ("query", [0, 2, 1, 3]),
                ("key", [0, 2, 3, 1]),
                ("value", [0, 2, 1, 3]),
            ):
                with b.scope(part):
                    y = self.linear(x, f"{prefix}.attention.self.{part}", hidden, hidden)
                y = b.op("Reshape", [y, split_shape])
                projected[part] = b.op("Transpose", [y], perm=perm)
            scores = b.op("MatMul", [projected["query"], projected["key"]])
            scale = b.const(1.0 / math.sqrt(head_dim), np.float32)
            scores = b.op("Mul", [scores, scale])
            scores = b.op("Add", [scores, mask])
            probs = b.op("Softmax", [scores], axis=-1)
            context = b.op("MatMul", [probs, projected["value"]])
            context = b.op("Transpose", [context], perm=[0, 2, 1, 3])
            merge_shape = b.const([0, 0, hidden], np.int64)
            context = b.op("Reshape", [context, merge_shape])
        with b.scope("attention", "output"):
            with b.scope("dense"):
                y = self.linear(context, f"{prefix}.attention.output.dense", hidden, hidden)
            y = b.op("Add", [y, x])
            return self.layer_norm(y, f"{prefix}.attention.output.LayerNorm", hidden)

    def feed_forward(self, x: str, prefix: str, hidden: int, intermediate: int) -> str:
        b = self.b
        with b.scope("intermediate"):
            with b.scope("dense"):
                h = self.linear(x, f"{prefix}.intermediate.dense", hidden, intermediate)
            with b.scope("intermediate_act_fn"):
                # gelu(x) = x * 0.5 * (1 + erf(x / sqrt(2)))
                t = b.op("Div", [h, b.const(math.sqrt(2.0), np.float32)])
                t = b.op("Erf", [t])
                t = b.op("Add", [t, b.const(1.0, np.float32)])
                t = b.op("Mul", [h, t])
                h = b.op("Mul", [t, b.const(0.5, np.float32)])
        with b.scope("output"):
            with b.scope("dense"):
                y = self.linear(h, f"{prefix}.output.dense", intermediate, hidden)
            y = b.op("Add", [y, x])
            return self.layer_norm(y, f"{prefix}.output.LayerNorm", hidden)


def build(
    layers: int = 4,
    hidden: int = 768,
    heads: int = 12,
    intermediate: int = 3072,
    vocab: int = 30522,
    max_position: int = 512,
    seed: int = 0,
    batch: int | str = "B",
    seq: int | str = "S",
) -> onnx.ModelProto:
    """A BERT-style encoder (see the module docstring); BERT-base has 12 layers.

    `batch` and `seq`: dim names (symbolic) or ints (static). A sequence longer than
    `max_position` fails in the position-embedding Gather at run time.
    """
    bd = as_dim(batch, "batch")
    sd = as_dim(seq, "seq")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    if layers < 1 or intermediate < 1 or vocab < 2 or max_position < 1:
        raise ValueError("need layers >= 1, intermediate >= 1, vocab >= 2, max_position >= 1")
    if isinstance(sd, int) and sd > max_position:
        raise ValueError(f"seq {sd} is longer than max_position {max_position}")
    rng = np.random.default_rng(seed)
    b = GraphBuilder("main_graph")
    w = _BertWriter(b, rng)
    input_ids = b.add_input("input_ids", INT64, [bd, sd])
    attention_mask = b.add_input("attention_mask", INT64, [bd, sd])

    with b.scope("embeddings"):
        with b.scope("word_embeddings"):
            table = w.weight("embeddings.word_embeddings.weight", (vocab, hidden))
            x = b.op("Gather", [table, input_ids])
        shape = b.op("Shape", [input_ids])
        seq_len = b.op("Gather", [shape, b.const(1, np.int64)], axis=0)
        positions = b.op("Range", [b.const(0, np.int64), seq_len, b.const(1, np.int64)])
        with b.scope("position_embeddings"):
            table = w.weight("embeddings.position_embeddings.weight", (max_position, hidden))
            pos = b.op("Gather", [table, positions])
        with b.scope("token_type_embeddings"):
            table = w.weight("embeddings.token_type_embeddings.weight", (2, hidden))
            tok = b.op("Gather", [table, b.const([0], np.int64)])
        x = b.op("Add", [x, tok])
        x = b.op("Add", [x, pos])
        x = w.layer_norm(x, "embeddings.LayerNorm", hidden)

    # extended attention mask: 0 where attended, -10000 on padding, [B, 1, 1, S]
    mask = b.op("Cast", [attention_mask], to=FLOAT)
    mask = b.op("Sub", [b.const(1.0, np.float32), mask])
    mask = b.op("Mul", [mask, b.const(MASK_VALUE, np.float32)])
    mask = b.op("Unsqueeze", [mask, b.const([1, 2], np.int64)])

    for i in range(layers):
        prefix = f"encoder.layer.{i}"
        with b.scope("encoder", f"layer.{i}"):
            x = w.attention(x, mask, prefix, hidden, heads)
            x = w.feed_forward(x, prefix, hidden, intermediate)
    last = b.rename_output(x, "last_hidden_state")

    with b.scope("pooler"):
        first = b.op("Gather", [last, b.const(0, np.int64)], axis=1)
        with b.scope("dense"):
            y = b.op(
                "Gemm",
                [
                    first,
                    w.weight("pooler.dense.weight", (hidden, hidden)),
                    w.bias("pooler.dense.bias", hidden),
                ],
                alpha=1.0,
                beta=1.0,
                transB=1,
            )
        with b.scope("activation"):
            pooled = b.op("Tanh", [y])
    b.rename_output(pooled, "pooler_output")
    b.add_output("last_hidden_state", FLOAT, [bd, sd, hidden])
    b.add_output("pooler_output", FLOAT, [bd, hidden])
    return make_model(
        b,
        __doc__ or "",
        {
            "family": "bert",
            "layers": layers,
            "hidden": hidden,
            "heads": heads,
            "intermediate": intermediate,
            "vocab_size": vocab,
            "max_position": max_position,
            "seed": seed,
        },
    )
