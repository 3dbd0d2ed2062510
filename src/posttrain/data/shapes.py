"""A synthetic class-conditional image domain, a preference scorer and a validity detector.

Images are ``size x size`` RGB on black: one filled shape of a class (square, triangle, plus)
in one of six saturated colours, at a random size and position. A base model trained on it
draws every colour and position about equally; the *preference* a user states is a target
colour and a centred shape (:func:`preference_score`). :func:`is_valid` says whether an image
is still a recognisable shape of the requested class, which catches samples a preference
optimiser has degraded into blobs or noise while raising the score.

Arrays are numpy ``float32 [H, W, 3]`` in ``[0, 1]``; the training range ``[-1, 1]`` is
converted at the tensor boundary (:func:`to_tensor`, :func:`from_tensor`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

CLASSES = ("square", "triangle", "plus")
COLORS: dict[str, tuple[float, float, float]] = {
    "red": (1.0, 0.0, 0.0),
    "green": (0.0, 1.0, 0.0),
    "blue": (0.0, 0.0, 1.0),
    "yellow": (1.0, 1.0, 0.0),
    "cyan": (0.0, 1.0, 1.0),
    "magenta": (1.0, 0.0, 1.0),
}
#: A pixel belongs to the shape when its brightest channel exceeds this.
FOREGROUND = 0.4
#: Smallest intersection-over-union with the requested class's template that still counts.
MIN_IOU = 0.7
#: Largest mean distance of a shape's pixels from their mean colour (a shape has one colour).
MAX_COLOUR_SPREAD = 0.3


def side_range(size: int) -> tuple[int, int]:
    """Smallest and largest side, in pixels, of a shape in a ``size``-pixel image."""
    return max(3, size * 5 // 16), max(4, size * 9 // 16)


def shape_mask(cls: int, h: int, w: int) -> np.ndarray:
    """Boolean ``[h, w]`` mask of class ``cls`` filling an ``h x w`` box."""
    if CLASSES[cls] == "square":
        return np.ones((h, w), dtype=bool)
    rows, cols = np.mgrid[0:h, 0:w]
    if CLASSES[cls] == "triangle":  # apex at the top centre, base along the bottom row
        half = (rows + 1) / h * (w / 2)
        return np.abs(cols + 0.5 - w / 2) <= half
    t_h, t_w = max(1, round(h / 3)), max(1, round(w / 3))  # plus: arms one third thick
    r0, c0 = (h - t_h) // 2, (w - t_w) // 2
    return ((rows >= r0) & (rows < r0 + t_h)) | ((cols >= c0) & (cols < c0 + t_w))


def render(cls: int, color: str, side: int, top: int, left: int, size: int) -> np.ndarray:
    """One image: shape ``cls`` of ``color``, ``side`` pixels, its box's top-left at (top, left)."""
    if min(top, left) < 0 or max(top, left) + side > size:
        raise ValueError(f"a {side}px shape at ({top}, {left}) does not fit a {size}px image")
    img = np.zeros((size, size, 3), dtype=np.float32)
    img[top : top + side, left : left + side][shape_mask(cls, side, side)] = COLORS[color]
    return img


def random_images(
    n: int, size: int, seed: int, classes: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images of random class (unless given), colour, side and position; (images, classes)."""
    rng = np.random.default_rng(seed)
    if classes is None:
        classes = rng.integers(0, len(CLASSES), n)
    names = list(COLORS)
    lo, hi = side_range(size)
    out = np.empty((n, size, size, 3), dtype=np.float32)
    for i in range(n):
        side = int(rng.integers(lo, hi + 1))
        top, left = rng.integers(0, size - side + 1, 2)
        out[i] = render(int(classes[i]), names[rng.integers(len(names))], side, top, left, size)
    return out, np.asarray(classes, dtype=np.int64)


def foreground(img: np.ndarray) -> np.ndarray:
    return img.max(axis=-1) > FOREGROUND


def preference_score(img: np.ndarray, target: str = "red") -> float:
    """In ``[0, 1]``: half colour, half centring; an image with no shape scores 0.

    Colour: 1 - distance of the shape's mean colour to ``target`` / √3 (the largest possible).
    Centring: 1 - distance of the shape's centroid to the image centre / the half-diagonal.
    """
    mask = foreground(img)
    if not mask.any():
        return 0.0
    size = img.shape[0]
    colour = 1 - float(np.linalg.norm(img[mask].mean(0) - np.asarray(COLORS[target]))) / np.sqrt(3)
    rows, cols = np.nonzero(mask)
    centre = (size - 1) / 2
    off = float(np.hypot(rows.mean() - centre, cols.mean() - centre)) / (centre * np.sqrt(2))
    return 0.5 * colour + 0.5 * (1 - min(off, 1.0))


def classify(img: np.ndarray) -> tuple[int, float]:
    """(best class, its IoU) by matching each class's template to the shape's bounding box."""
    mask = foreground(img)
    if not mask.any():
        return -1, 0.0
    rows, cols = np.nonzero(mask)
    r0, r1, c0, c1 = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    best, best_iou = -1, 0.0
    for cls in range(len(CLASSES)):
        template = np.zeros_like(mask)
        template[r0:r1, c0:c1] = shape_mask(cls, r1 - r0, c1 - c0)
        iou = float((template & mask).sum() / (template | mask).sum())
        if iou > best_iou:
            best, best_iou = cls, iou
    return best, best_iou


def is_valid(img: np.ndarray, cls: int) -> bool:
    """A recognisable shape of class ``cls``: at least 9 foreground pixels of one colour (mean
    spread <= :data:`MAX_COLOUR_SPREAD`) in a box no more than 2 px beyond the domain's largest
    side, whose best template match is ``cls`` with IoU >= :data:`MIN_IOU`."""
    mask = foreground(img)
    if int(mask.sum()) < 9:
        return False
    pixels = img[mask]
    if float(np.linalg.norm(pixels - pixels.mean(0), axis=-1).mean()) > MAX_COLOUR_SPREAD:
        return False
    rows, cols = np.nonzero(mask)
    box = max(rows.max() - rows.min(), cols.max() - cols.min()) + 1
    if box > side_range(img.shape[0])[1] + 2:
        return False
    best, iou = classify(img)
    return best == cls and iou >= MIN_IOU


def to_tensor(images: np.ndarray) -> Tensor:
    """``[N, H, W, 3]`` in [0, 1] -> ``[N, 3, H, W]`` float32 in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() * 2 - 1


def from_tensor(images: Tensor) -> np.ndarray:
    """``[N, 3, H, W]`` in [-1, 1] -> ``[N, H, W, 3]`` float32 in [0, 1], clipped."""
    x = ((images.detach().float().cpu() + 1) / 2).clamp(0, 1)
    return x.permute(0, 2, 3, 1).numpy()


def evaluate_images(images: np.ndarray, classes: np.ndarray, target: str) -> dict[str, float]:
    """Mean preference score and the fraction of valid shapes of the requested classes."""
    scores = [preference_score(img, target) for img in images]
    valid = [is_valid(img, int(c)) for img, c in zip(images, classes, strict=True)]
    return {"scorer_mean": float(np.mean(scores)), "validity": float(np.mean(valid))}
