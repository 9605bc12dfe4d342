"""Object detection ops of the NeuronCore (POOL engine): NonMaxSuppression, whose output
size depends on the values it reads (the compiler plans its upper bound, batch x classes
x max_output_boxes_per_class boxes), and RoiAlign.
"""

from __future__ import annotations

import numpy as np

from driver_sim.cost import Engine
from driver_sim.ops.registry import (
    FLOATS,
    INDICES,
    Attr,
    choice_attr,
    dtype_check,
    flag_attr,
    float_attr,
    int_attr,
    int_values,
    kernel,
    positive_attr,
    scalar,
)


def _corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """Boxes (..., 4) as (y_min, x_min, y_max, x_max): from two corners in either order,
    or from (x_center, y_center, width, height)."""
    boxes = boxes.astype(np.float64)
    if center_point_box:
        x, y, w, h = np.moveaxis(boxes, -1, 0)
        return np.stack((y - h / 2, x - w / 2, y + h / 2, x + w / 2), axis=-1)
    y1, x1, y2, x2 = np.moveaxis(boxes, -1, 0)
    return np.stack(
        (np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)), axis=-1
    )


def _overlaps(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Intersection over union of `box` (4,) with each of `others` (n, 4); 0 where either
    box or the union has no area."""
    low = np.maximum(box[:2], others[:, :2])
    high = np.minimum(box[2:], others[:, 2:])
    sides = np.clip(high - low, 0, None)
    inter = sides[:, 0] * sides[:, 1]
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    valid = (area > 0) & (areas > 0) & (union > 0) & (inter > 0)
    return np.where(valid, inter / np.where(valid, union, 1), 0.0)


def _select(
    boxes: np.ndarray, scores: np.ndarray, limit: int, iou: float, floor: float | None
) -> list[int]:
    """Greedy selection in one class: the best-scoring box left (the lower index among
    equal scores), dropping the boxes that overlap it by more than `iou`, up to `limit`."""
    order = np.argsort(-scores, kind="stable")
    if floor is not None:
        order = order[scores[order] > floor]
    chosen: list[int] = []
    while order.size and len(chosen) < limit:
        best = int(order[0])
        chosen.append(best)
        rest = order[1:]
        order = rest[_overlaps(boxes[best], boxes[rest]) <= iou]
    return chosen


@kernel(
    "NonMaxSuppression",
    Engine.POOL,
    inputs=(2, 5),
    attrs={"center_point_box": Attr(flag_attr, 0)},
    since=(10, 11),
    check=dtype_check(FLOATS, FLOATS, INDICES, FLOATS, FLOATS),
)
def _non_max_suppression(
    boxes: np.ndarray,
    scores: np.ndarray,
    max_output_boxes_per_class: np.ndarray | None = None,
    iou_threshold: np.ndarray | None = None,
    score_threshold: np.ndarray | None = None,
    *,
    center_point_box: int,
) -> np.ndarray:
    """selected_indices (k, 3) int64 of (batch, class, box): per batch and class, the
    boxes greedy non-max suppression keeps, best first: those scoring above
    score_threshold (when given), none overlapping a better one by IoU > iou_threshold
    (default 0), at most max_output_boxes_per_class (default 0) of them."""
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise ValueError(
            f"boxes {boxes.shape} and scores {scores.shape} are not (B, n, 4), (B, C, n)"
        )
    if scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"scores {scores.shape} do not fit boxes {boxes.shape}")
    given = [] if max_output_boxes_per_class is None else int_values(max_output_boxes_per_class)
    limit = given[0] if given else 0
    iou = (
        0.0
        if iou_threshold is None or iou_threshold.size == 0
        else float(scalar(iou_threshold, "iou_threshold"))
    )
    floor = (
        None
        if score_threshold is None or score_threshold.size == 0
        else float(scalar(score_threshold, "score_threshold"))
    )
    corners = _corners(boxes, center_point_box)
    selected = [
        (batch, kind, index)
        for batch in range(scores.shape[0])
        for kind in range(scores.shape[1])
        for index in _select(corners[batch], scores[batch, kind], limit, iou, floor)
    ]
    return np.array(selected, dtype=np.int64).reshape(-1, 3)


def _sample_axis(
    start: float, bin_size: float, bins: int, grid: int, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per sample point of an axis (bins x grid of them, each at the center of its part
    of its bin): its low and high pixel, their bilinear weights, and whether the point
    lies near enough the image to count (-1 <= p <= size)."""
    parts = np.arange(bins)[:, None] * bin_size + (np.arange(grid) + 0.5) * bin_size / grid
    point = (start + parts).reshape(-1)
    valid = (point >= -1.0) & (point <= size)
    point = np.maximum(point, 0.0)
    low = np.floor(point).astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    point = np.where(edge, low, point)
    far = point - low
    return low, high, 1.0 - far, far, valid


@kernel(
    "RoiAlign",
    Engine.POOL,
    inputs=(3, 3),
    attrs={
        "coordinate_transformation_mode": Attr(
            choice_attr("half_pixel", "output_half_pixel"), "half_pixel"
        ),
        "mode": Attr(choice_attr("avg", "max"), "avg"),
        "output_height": Attr(positive_attr, 1),
        "output_width": Attr(positive_attr, 1),
        "sampling_ratio": Attr(int_attr, 0),
        "spatial_scale": Attr(float_attr, 1.0),
    },
    since=(16, 22),  # version 10 had no coordinate_transformation_mode (output_half_pixel)
    check=dtype_check(FLOATS, FLOATS, INDICES),
)
def _roi_align(
    x: np.ndarray,
    rois: np.ndarray,
    batch_indices: np.ndarray,
    *,
    coordinate_transformation_mode: str,
    mode: str,
    output_height: int,
    output_width: int,
    sampling_ratio: int,
    spatial_scale: float,
) -> np.ndarray:
    """Y (rois, C, output_height, output_width): each region (x1, y1, x2, y2, in input
    coordinates times spatial_scale; half_pixel: shifted by -0.5) split into bins, each
    bin the average (or max) of bilinear samples on a grid of sampling_ratio (0: the
    bin's ceiling size) points per axis; a sample's max mode value is its largest
    weighted corner."""
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4:
        raise ValueError(f"X {x.shape} and rois {rois.shape} are not (N, C, H, W), (R, 4)")
    height, width = x.shape[2:]
    half_pixel = coordinate_transformation_mode == "half_pixel"
    shift = 0.5 if half_pixel else 0.0
    dtype = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    y = np.zeros((rois.shape[0], x.shape[1], output_height, output_width), dtype=dtype)
    for r, (roi, batch) in enumerate(
        zip(rois.astype(np.float64), batch_indices.reshape(-1), strict=True)
    ):
        x1, y1, x2, y2 = roi * spatial_scale - shift
        roi_w, roi_h = x2 - x1, y2 - y1
        if not half_pixel:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / output_height, roi_w / output_width
        grid_h = sampling_ratio if sampling_ratio > 0 else int(np.ceil(roi_h / output_height))
        grid_w = sampling_ratio if sampling_ratio > 0 else int(np.ceil(roi_w / output_width))
        ys = _sample_axis(y1, bin_h, output_height, grid_h, height)
        xs = _sample_axis(x1, bin_w, output_width, grid_w, width)
        image = x[int(batch)].astype(dtype)
        valid = ys[4][:, None] & xs[4][None, :]
        corners = [
            image[:, ys[a][:, None], xs[b][None, :]]
            * (ys[2 + a][:, None] * xs[2 + b][None, :] * valid).astype(dtype)
            for a in (0, 1)
            for b in (0, 1)
        ]  # each (C, output_height * grid_h, output_width * grid_w)
        shape = (x.shape[1], output_height, grid_h, output_width, grid_w)
        if mode == "avg":
            samples = (corners[0] + corners[1] + corners[2] + corners[3]).reshape(shape)
            y[r] = samples.sum(axis=(2, 4)) / max(grid_h * grid_w, 1)
        else:
            samples = np.maximum.reduce(corners).reshape(shape)
            y[r] = samples.max(axis=(2, 4))
    return y.astype(x.dtype)
