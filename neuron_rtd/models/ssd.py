"""SSD-style single-image object detector with its post-processing inside the graph.

input "image" float32 [1, 3, H, H], pixels in [0, 1).

Backbone: four Conv 3x3/2 + Relu (strides 2, 4, 8, 16). A small FPN: 1x1 lateral convs on
the stride-8 and stride-16 maps, the coarser one upsampled x2 by Resize (nearest) and
added to the finer one, then a 3x3 smoothing Conv + Relu. Heads on both levels (a 3x3 Conv
for class logits, one for box deltas, 3 anchors per location: aspect ratios 1, 2, 1/2,
sizes 4x the stride), flattened with Transpose + Reshape and concatenated over levels.

Post-processing: the anchors are one constant initializer [A, 4] (cx, cy, w, h in pixels);
deltas decode as SSD does (centre += 0.1 * d * size, size *= Exp(0.2 * d), Clip-ed before
the Exp) into corner boxes (x1, y1, x2, y2). Class scores: Sigmoid; per anchor the best
class by ReduceMax/ArgMax; TopK keeps the best `pre_nms_top_k` anchors, whose boxes,
scores and classes are Gather-ed; NonMaxSuppression (class-agnostic, center_point_box=0,
with IoU and score thresholds) selects up to `max_detections` of them, which are Gather-ed
again; Where clamps box coordinates below 0 to 0. An If on "anything selected?" gives
empty [0, 4] / [0] / [0] tensors when nothing is, else runs a Loop over the D selected
detections that clips each box's far corner to the image size (a scan output per box).

outputs "boxes" float32 [D, 4] (x1, y1, x2, y2 pixels), "scores" float32 [D], "classes"
int64 [D], D = the number of detections (0 <= D <= max_detections), in decreasing score
order. The random weights and default thresholds are tuned so that random images give a
handful of detections, a different number for different images.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from neuron_rtd import onnxrt
from neuron_rtd.models._graph import (
    BOOL,
    FLOAT,
    INT64,
    GraphBuilder,
    make_model,
    normal,
)

ASPECT_RATIOS = (1.0, 2.0, 0.5)
CENTER_VARIANCE = 0.1
SIZE_VARIANCE = 0.2
CLASS_PRIOR_BIAS = -3.0
IOU_THRESHOLD = 0.5
CALIBRATION_IMAGES = 5

# a fast variant for tests: the defaults are already small
SMALL: dict[str, Any] = {"image": 128, "width": 8}


def anchors(image: int, strides: tuple[int, ...] = (8, 16)) -> np.ndarray:
    """[A, 4] (cx, cy, w, h) in pixels, level by level, row-major over the map, then ratio.

    The order is the order the heads' outputs take after Transpose [0, 2, 3, 1] + Reshape.
    """
    rows = []
    for stride in strides:
        size = 4.0 * stride
        cells = image // stride
        for y in range(cells):
            for x in range(cells):
                for ratio in ASPECT_RATIOS:
                    rows.append(
                        (
                            (x + 0.5) * stride,
                            (y + 0.5) * stride,
                            size * math.sqrt(ratio),
                            size / math.sqrt(ratio),
                        )
                    )
    return np.array(rows, np.float32)


def _calibrate_threshold(b: GraphBuilder, image: int, max_detections: int, seed: int) -> float:
    """The score threshold at which the median random image keeps max_detections // 2 boxes.

    The graph in `b` runs with the threshold at -1 (every box passes), so each image's
    "scores" are its greedy-NMS selection in decreasing score order; a threshold only cuts
    that list, so the midpoint between the target-th and the next score keeps `target`.
    """
    model = make_model(b, "", {})
    session = onnxrt.session(model, threads=1)
    rng = np.random.default_rng([seed, 1])
    target = max(1, max_detections // 2)
    cuts = []
    for _ in range(CALIBRATION_IMAGES):
        pixels = rng.random((1, 3, image, image), dtype=np.float32)
        (scores,) = session.run(["scores"], {"image": pixels})
        if len(scores) > target:
            cuts.append(0.5 * (float(scores[target - 1]) + float(scores[target])))
        else:
            cuts.append(0.5 * float(scores[-1]) if len(scores) else 0.0)
    return float(np.median(cuts))


class _SSDWriter:
    def __init__(self, b: GraphBuilder, rng: np.random.Generator) -> None:
        self.b = b
        self.rng = rng

    def conv(
        self,
        x: str,
        name: str,
        cin: int,
        cout: int,
        k: int,
        stride: int,
        *,
        std: float | None = None,
        bias: float = 0.0,
        zero_mean: bool = False,
    ) -> str:
        b = self.b
        w = normal(self.rng, (cout, cin, k, k), std or math.sqrt(2.0 / (cin * k * k)))
        if zero_mean:
            # blind to the features' common positive level: scores follow the image
            w -= w.mean(axis=(1, 2, 3), keepdims=True)
        bv = np.float32(bias) + normal(self.rng, (cout,), 0.01)
        pad = k // 2
        with b.scope(name):
            return b.op(
                "Conv",
                [x, b.initializer(f"{name}.weight", w), b.initializer(f"{name}.bias", bv)],
                dilations=[1, 1],
                group=1,
                kernel_shape=[k, k],
                pads=[pad, pad, pad, pad],
                strides=[stride, stride],
            )

    def flatten_head(self, x: str, per_anchor: int) -> str:
        """[1, A*k, H, W] -> [H*W*A, k]."""
        b = self.b
        y = b.op("Transpose", [x], perm=[0, 2, 3, 1])
        return b.op("Reshape", [y, b.const([-1, per_anchor], np.int64)])


def build(
    image: int = 128,
    num_classes: int = 8,
    max_detections: int = 20,
    seed: int = 0,
    *,
    width: int = 16,
    pre_nms_top_k: int = 100,
    iou_threshold: float = IOU_THRESHOLD,
    score_threshold: float | None = None,
) -> onnx.ModelProto:
    """An SSD-style detector (see the module docstring).

    `image`: input height and width, a multiple of 16. `width`: channels of the first conv
    (the backbone has width x 1, 2, 4, 8, the FPN width x 4). `pre_nms_top_k`: anchors kept
    by TopK before NMS (at most all of them). `score_threshold`: NMS's; None calibrates it
    so that, on random images, about half of `max_detections` boxes pass (the median
    image of a few gives exactly max_detections // 2).
    """
    if image < 32 or image % 16:
        raise ValueError(f"image must be a multiple of 16, >= 32; got {image}")
    if num_classes < 1 or max_detections < 1 or width < 1 or pre_nms_top_k < 1:
        raise ValueError("need num_classes, max_detections, width and pre_nms_top_k >= 1")
    rng = np.random.default_rng(seed)
    b = GraphBuilder("main_graph")
    w = _SSDWriter(b, rng)
    x = b.add_input("image", FLOAT, [1, 3, image, image])

    # backbone: strides 2, 4, 8, 16
    chans = [3, width, 2 * width, 4 * width, 8 * width]
    feats = []
    y = x
    for i in range(4):
        y = w.conv(y, f"backbone.{2 * i}", chans[i], chans[i + 1], 3, 2)
        with b.scope(f"backbone.{2 * i + 1}"):
            y = b.op("Relu", [y])
        feats.append(y)
    c3, c4 = feats[2], feats[3]

    # FPN: upsample the stride-16 map and merge it into the stride-8 one
    fpn = 4 * width
    lat3 = w.conv(c3, "fpn.lateral.0", chans[3], fpn, 1, 1)
    p4 = w.conv(c4, "fpn.lateral.1", chans[4], fpn, 1, 1)
    with b.scope("fpn", "upsample"):
        up = b.op(
            "Resize",
            [p4, "", b.const([1.0, 1.0, 2.0, 2.0], np.float32)],
            coordinate_transformation_mode="asymmetric",
            cubic_coeff_a=-0.75,
            mode="nearest",
            nearest_mode="floor",
        )
    with b.scope("fpn"):
        p3 = b.op("Add", [lat3, up])
    p3 = w.conv(p3, "fpn.smooth", fpn, fpn, 3, 1)
    with b.scope("fpn", "relu"):
        p3 = b.op("Relu", [p3])

    # heads, 3 anchors per location
    n_ratios = len(ASPECT_RATIOS)
    cls_parts, box_parts = [], []
    for level, p in enumerate((p3, p4)):
        logits = w.conv(
            p,
            f"head.cls.{level}",
            fpn,
            n_ratios * num_classes,
            3,
            1,
            std=1.0 / math.sqrt(fpn * 9),
            bias=CLASS_PRIOR_BIAS,
            zero_mean=True,
        )
        deltas = w.conv(
            p, f"head.box.{level}", fpn, n_ratios * 4, 3, 1, std=0.5 / math.sqrt(fpn * 9)
        )
        with b.scope("head", f"flatten.{level}"):
            cls_parts.append(w.flatten_head(logits, num_classes))
            box_parts.append(w.flatten_head(deltas, 4))
    with b.scope("head"):
        logits = b.op("Concat", cls_parts, axis=0)
        deltas = b.op("Concat", box_parts, axis=0)

    # decode: deltas against the anchors -> corner boxes
    anchor_table = anchors(image)
    total = anchor_table.shape[0]
    with b.scope("decode"):
        a = b.initializer("anchors", anchor_table)
        two = b.const([2, 2], np.int64, hint="split")
        a_xy, a_wh = b.ops("Split", [a, two], 2, axis=1)
        d_xy, d_wh = b.ops("Split", [deltas, two], 2, axis=1)
        centre = b.op("Mul", [d_xy, b.const(CENTER_VARIANCE, np.float32)])
        centre = b.op("Mul", [centre, a_wh])
        centre = b.op("Add", [centre, a_xy])
        grow = b.op("Mul", [d_wh, b.const(SIZE_VARIANCE, np.float32)])
        grow = b.op("Clip", [grow, "", b.const(math.log(1000.0 / 16.0), np.float32)])
        size = b.op("Mul", [b.op("Exp", [grow]), a_wh])
        half = b.op("Mul", [size, b.const(0.5, np.float32)])
        lo = b.op("Sub", [centre, half])
        hi = b.op("Add", [centre, half])
        boxes = b.op("Concat", [lo, hi], axis=1)

    # scores: best class per anchor, then the top-k anchors
    k = min(pre_nms_top_k, total)
    with b.scope("postprocess"):
        probs = b.op("Sigmoid", [logits])
        best = b.op("ReduceMax", [probs], axes=[1], keepdims=0)
        best_class = b.op("ArgMax", [probs], axis=1, keepdims=0, select_last_index=0)
        top_scores, top_index = b.ops(
            "TopK", [best, b.const([k], np.int64)], 2, axis=0, largest=1, sorted=1
        )
        top_boxes = b.op("Gather", [boxes, top_index], axis=0)
        top_classes = b.op("Gather", [best_class, top_index], axis=0)

        nms_boxes = b.op("Unsqueeze", [top_boxes, b.const([0], np.int64)])
        nms_scores = b.op("Reshape", [top_scores, b.const([1, 1, -1], np.int64)])
        selected = b.op(
            "NonMaxSuppression",
            [
                nms_boxes,
                nms_scores,
                b.const([max_detections], np.int64),
                b.const([iou_threshold], np.float32),
                threshold_name := b.const([-1.0], np.float32, hint="score_threshold"),
            ],
            center_point_box=0,
        )
        keep = b.op("Gather", [selected, b.const(2, np.int64)], axis=1)
        det_boxes = b.op("Gather", [top_boxes, keep], axis=0)
        det_scores = b.op("Gather", [top_scores, keep], axis=0)
        det_classes = b.op("Gather", [top_classes, keep], axis=0)
        zero = b.const(0.0, np.float32)
        det_boxes = b.op("Where", [b.op("Less", [det_boxes, zero]), zero, det_boxes])

        count = b.op("Gather", [b.op("Shape", [keep]), b.const(0, np.int64)], axis=0)
        any_selected = b.op("Greater", [count, b.const(0, np.int64)])

        # then: clip each selected box to the image in a Loop; else: empty outputs
        then_g = b.subgraph("then_branch")
        with then_g.scope("clip"):
            body = then_g.subgraph("loop_body")
            index = body.add_input(body.fresh("i"), INT64, [])
            cond_in = body.add_input(body.fresh("cond_in"), BOOL, [])
            box = body.op("Gather", [det_boxes, index], axis=0)
            limit = body.const([float(image)] * 4, np.float32, hint="limit")
            clipped = body.op("Min", [box, limit])
            cond_out = body.op("Identity", [cond_in])
            body.add_output(cond_out, BOOL, [])
            body.add_output(clipped, FLOAT, [4])
            (clipped_boxes,) = then_g.ops("Loop", [count, ""], 1, body=body.graph())
            kept_scores = then_g.op("Identity", [det_scores])
            kept_classes = then_g.op("Identity", [det_classes])
        then_g.add_output(clipped_boxes, FLOAT, [None, 4])
        then_g.add_output(kept_scores, FLOAT, [None])
        then_g.add_output(kept_classes, INT64, [None])

        else_g = b.subgraph("else_branch")
        with else_g.scope("empty"):
            empty_boxes = else_g.const(np.zeros((0, 4), np.float32), hint="boxes")
            empty_scores = else_g.const(np.zeros((0,), np.float32), hint="scores")
            empty_classes = else_g.const(np.zeros((0,), np.int64), hint="classes")
        else_g.add_output(empty_boxes, FLOAT, [0, 4])
        else_g.add_output(empty_scores, FLOAT, [0])
        else_g.add_output(empty_classes, INT64, [0])

        outs = b.ops(
            "If",
            [any_selected],
            3,
            then_branch=then_g.graph(),
            else_branch=else_g.graph(),
        )
    for value, name in zip(outs, ("boxes", "scores", "classes"), strict=True):
        b.rename_output(value, name)
    b.add_output("boxes", FLOAT, ["D", 4])
    b.add_output("scores", FLOAT, ["D"])
    b.add_output("classes", INT64, ["D"])
    if score_threshold is None:
        score_threshold = _calibrate_threshold(b, image, max_detections, seed)
    (init,) = [t for t in b.initializers if t.name == threshold_name]
    init.CopyFrom(numpy_helper.from_array(np.array([score_threshold], np.float32), init.name))
    return make_model(
        b,
        __doc__ or "",
        {
            "family": "ssd",
            "image": image,
            "num_classes": num_classes,
            "max_detections": max_detections,
            "num_anchors": total,
            "pre_nms_top_k": k,
            "iou_threshold": iou_threshold,
            "score_threshold": score_threshold,
            "seed": seed,
            "input_preprocess": "unit",
        },
    )
