"""ResNet-18-style image classifier, as torchvision's resnet18 exports to ONNX.

input "input" float32 [N, 3, H, H] (ImageNet-normalised pixels) -> Conv 7x7/2 ->
BatchNormalization -> Relu -> MaxPool 3x3/2 -> four stages of basic blocks
(Conv 3x3 - BN - Relu - Conv 3x3 - BN, + identity or Conv 1x1/2 - BN downsample, Relu)
with width x 1, 2, 4, 8 channels -> GlobalAveragePool -> Flatten -> Gemm (transB=1) ->
Softmax -> output "probs" [N, classes].

Conv and BatchNormalization stay separate nodes (as an export without BN folding leaves
them), so a compiler has something to fold. Conv weights are He-initialised (fan-in);
BN gammas and betas are random around what trained nets show (smaller gammas at the end
of residual branches), and the BN running statistics are calibrated: the graph is run
once in onnxruntime with BN in training mode on a couple of normalised random images, and
each BN keeps that batch's mean and variance (jittered a little) as its running mean and
variance. Activations stay well-scaled at any depth, and the classifier weights are scaled
so the logits spread about 2.5 across classes: the softmax is peaked, never one-hot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from neuron_rtd import onnxrt
from neuron_rtd.models._graph import (
    FLOAT,
    GraphBuilder,
    as_dim,
    make_model,
    normal,
    uniform,
)

# ImageNet normalisation the model expects on its input
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BN_EPS = 1e-5
BN_MOMENTUM = 0.9
LOGIT_SPREAD = 2.5

# a fast variant for tests: a quarter of the channels, 64x64 images, 100 classes
SMALL: dict[str, Any] = {"width": 16, "image": 64, "num_classes": 100}


def normalise(pixels: np.ndarray) -> np.ndarray:
    """[N, 3, H, W] pixels in [0, 1) -> the model's input (ImageNet mean/std per channel)."""
    mean = np.array(MEAN, np.float32)[:, None, None]
    std = np.array(STD, np.float32)[:, None, None]
    return ((pixels - mean) / std).astype(np.float32)


@dataclass
class _PendingBN:
    """A BN node written in training mode, waiting for its calibrated statistics."""

    node: onnx.NodeProto
    mean_name: str
    var_name: str


class _ResNetWriter:
    def __init__(self, b: GraphBuilder, rng: np.random.Generator) -> None:
        self.b = b
        self.rng = rng
        self.pending: list[_PendingBN] = []

    def conv(self, x: str, cin: int, name: str, cout: int, k: int, stride: int) -> str:
        w = normal(self.rng, (cout, cin, k, k), math.sqrt(2.0 / (cin * k * k)))
        pad = k // 2
        with self.b.scope(name):
            return self.b.op(
                "Conv",
                [x, self.b.initializer(f"{name}.weight", w)],
                dilations=[1, 1],
                group=1,
                kernel_shape=[k, k],
                pads=[pad, pad, pad, pad],
                strides=[stride, stride],
            )

    def bn(self, x: str, c: int, name: str, gamma: tuple[float, float]) -> str:
        scale = uniform(self.rng, (c,), *gamma)
        bias = normal(self.rng, (c,), 0.1) - np.float32(0.05)
        mean_name = f"{name}.running_mean"
        var_name = f"{name}.running_var"
        with self.b.scope(name):
            # training mode for the calibration run; `calibrate` turns it into inference
            y = self.b.ops(
                "BatchNormalization",
                [
                    x,
                    self.b.initializer(f"{name}.weight", scale),
                    self.b.initializer(f"{name}.bias", bias),
                    self.b.initializer(mean_name, np.zeros(c, np.float32)),
                    self.b.initializer(var_name, np.ones(c, np.float32)),
                ],
                3,
                epsilon=BN_EPS,
                momentum=0.0,
                training_mode=1,
            )[0]
        self.pending.append(_PendingBN(self.b.nodes[-1], mean_name, var_name))
        return y

    def relu(self, x: str, name: str) -> str:
        with self.b.scope(name):
            return self.b.op("Relu", [x])

    def block(self, x: str, cin: int, name: str, cout: int, stride: int) -> str:
        """A basic block: conv-bn-relu-conv-bn, + shortcut, relu."""
        y = self.conv(x, cin, f"{name}.conv1", cout, 3, stride)
        y = self.bn(y, cout, f"{name}.bn1", (0.7, 1.3))
        y = self.relu(y, f"{name}/relu")
        y = self.conv(y, cout, f"{name}.conv2", cout, 3, 1)
        y = self.bn(y, cout, f"{name}.bn2", (0.3, 0.7))
        if stride != 1 or cin != cout:
            s = self.conv(x, cin, f"{name}.downsample.0", cout, 1, stride)
            s = self.bn(s, cout, f"{name}.downsample.1", (0.3, 0.7))
        else:
            s = x
        with self.b.scope(name):
            out = self.b.op("Add", [y, s])
        return self.relu(out, f"{name}/relu_1")

    def calibrate(self, features: str, pixels: np.ndarray) -> np.ndarray:
        """Run the graph so far with BN in training mode: set every BN's running stats.

        Returns the values of `features` (the pooled features) on that batch.
        """
        b = self.b
        model = make_model(b, "", {})
        # the calibration batch, whatever batch the model declares
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "calibration_batch"
        del model.graph.output[:]
        stats = [name for p in self.pending for name in p.node.output[1:]]
        for name in [features, *stats]:
            model.graph.output.append(helper.make_empty_tensor_value_info(name))
        session = onnxrt.session(model, threads=1, optimize=False)
        values = session.run(None, {b.inputs[0].name: pixels})
        by_name = {i.name: i for i in b.initializers}
        for k, p in enumerate(self.pending):
            mean, var = values[1 + 2 * k], values[2 + 2 * k]
            c = mean.shape[0]
            sd = np.sqrt(var)
            mean = mean + normal(self.rng, (c,), 0.05) * sd
            var = var * np.exp(normal(self.rng, (c,), 0.1))
            by_name[p.mean_name].CopyFrom(numpy_helper.from_array(mean, p.mean_name))
            by_name[p.var_name].CopyFrom(numpy_helper.from_array(var, p.var_name))
            del p.node.output[1:]
            del p.node.attribute[:]
            p.node.attribute.extend(
                [
                    helper.make_attribute("epsilon", BN_EPS),
                    helper.make_attribute("momentum", BN_MOMENTUM),
                ]
            )
        feats: np.ndarray = values[0]
        return feats


def build(
    depth_blocks: Sequence[int] = (2, 2, 2, 2),
    num_classes: int = 1000,
    seed: int = 0,
    batch: int | str = "N",
    *,
    width: int = 64,
    image: int = 224,
) -> onnx.ModelProto:
    """A ResNet-18-style classifier (see the module docstring).

    `depth_blocks`: basic blocks per stage (ResNet-18: 2,2,2,2; ResNet-34: 3,4,6,3).
    `width`: channels of the stem and first stage (stages have width x 1, 2, 4, 8).
    `image`: input height and width (224 for ImageNet; the small variant uses 64).
    `batch`: a dim name (symbolic) or an int (static).
    """
    n = as_dim(batch, "batch")
    depth_blocks = tuple(int(d) for d in depth_blocks)
    if image < 32 or image % 32:
        raise ValueError(f"image must be a multiple of 32, got {image}")
    if width < 1 or num_classes < 2 or not depth_blocks or min(depth_blocks) < 1:
        raise ValueError("need width >= 1, num_classes >= 2, and >= 1 block in each stage")
    rng = np.random.default_rng(seed)
    b = GraphBuilder("main_graph")
    w = _ResNetWriter(b, rng)
    x = b.add_input("input", FLOAT, [n, 3, image, image])

    y = w.conv(x, 3, "conv1", width, 7, 2)
    y = w.bn(y, width, "bn1", (0.7, 1.3))
    y = w.relu(y, "relu")
    with b.scope("maxpool"):
        y = b.op(
            "MaxPool",
            [y],
            ceil_mode=0,
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            strides=[2, 2],
        )
    channels = width
    for stage, blocks in enumerate(depth_blocks):
        cout = width * 2**stage
        for i in range(blocks):
            stride = 2 if stage > 0 and i == 0 else 1
            y = w.block(y, channels, f"layer{stage + 1}.{i}", cout, stride)
            channels = cout
    with b.scope("avgpool"):
        y = b.op("GlobalAveragePool", [y])
    y = b.op("Flatten", [y], axis=1)

    # enough images that the last stage's BN sees >= 64 positions per channel
    final = image // 32
    n_calib = max(2, math.ceil(64 / (final * final)))
    calib = np.random.default_rng([seed, 1]).random((n_calib, 3, image, image), np.float32)
    features = w.calibrate(y, normalise(calib))
    # scale the classifier so logits spread about LOGIT_SPREAD across classes
    norm = float(np.sqrt(np.mean(np.sum(features.astype(np.float64) ** 2, axis=1))))
    fc_w = normal(rng, (num_classes, channels), LOGIT_SPREAD / max(norm, 1e-6))
    fc_b = normal(rng, (num_classes,), 0.1)
    with b.scope("fc"):
        y = b.op(
            "Gemm",
            [y, b.initializer("fc.weight", fc_w), b.initializer("fc.bias", fc_b)],
            alpha=1.0,
            beta=1.0,
            transB=1,
        )
    with b.scope("softmax"):
        y = b.op("Softmax", [y], axis=1)
    b.rename_output(y, "probs")
    b.add_output("probs", FLOAT, [n, num_classes])
    return make_model(
        b,
        __doc__ or "",
        {
            "family": "resnet",
            "depth_blocks": ",".join(str(d) for d in depth_blocks),
            "width": width,
            "image": image,
            "num_classes": num_classes,
            "seed": seed,
            "input_preprocess": "imagenet",
        },
    )
