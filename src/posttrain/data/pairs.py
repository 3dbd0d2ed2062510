"""Preference pairs on disk: a JSON Lines manifest of image paths, and PNG input/output.

Each non-blank manifest line is ``{"condition": 2, "chosen": "a.png", "rejected": "b.png"}``:
``condition`` is the class id the images were drawn for (a class-conditional model's class
label), ``chosen`` is preferred to ``rejected``, and paths are relative to the manifest's
directory (absolute paths are used as is). Every image is RGB (other modes are converted) of
the same square size. Anything else stops loading with :class:`PairDataError` naming the
manifest line, and the image file where one is at fault.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from posttrain.data.images import PairBatch
from posttrain.data.shapes import from_tensor, to_tensor
from posttrain.data.tasks.jsonl import TaskDataError, jsonl_objects

KEYS = ("condition", "chosen", "rejected")


class PairDataError(TaskDataError):
    """A pairs manifest or one of its images is missing or malformed (names file:line)."""


def read_png(path: Path) -> np.ndarray:
    """``[H, W, 3]`` float32 in [0, 1]; raises OSError/ValueError for an unreadable file."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0


def write_png(path: Path, image: np.ndarray) -> None:
    """Write ``[H, W, 3]`` in [0, 1] as an 8-bit PNG, atomically (temp + rename)."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pixels = np.clip(np.rint(image * 255), 0, 255).astype(np.uint8)
    Image.fromarray(pixels, mode="RGB").save(tmp, format="PNG")
    os.replace(tmp, path)


def load_pairs(manifest: str | Path, image_size: int, num_classes: int) -> PairBatch:
    """Every pair of ``manifest`` as one in-memory batch (seeds 0; the loop sets them per step)."""
    path = Path(manifest)
    if not path.is_file():
        raise PairDataError(f"{path}: no such file (pairs manifest, dpo.pairs_path)")
    chosen, rejected, labels = [], [], []
    for where, row in jsonl_objects(path, PairDataError):
        cond, a, b = _parse_row(where, row, num_classes)
        chosen.append(_image(where, path.parent / a, image_size))
        rejected.append(_image(where, path.parent / b, image_size))
        labels.append(cond)
    if not labels:
        raise PairDataError(f"{path}: no pairs (the manifest is empty or blank)")
    n = len(labels)
    return PairBatch(
        chosen=to_tensor(np.stack(chosen)),
        rejected=to_tensor(np.stack(rejected)),
        labels=torch.tensor(labels, dtype=torch.int64),
        seeds=torch.zeros(n, dtype=torch.int64),
    )


def _parse_row(where: str, row: dict, num_classes: int) -> tuple[int, str, str]:
    if set(row) != set(KEYS):
        raise PairDataError(f"{where}: expected exactly the keys {list(KEYS)}, got {sorted(row)}")
    cond = row["condition"]
    if isinstance(cond, bool) or not isinstance(cond, int) or not 0 <= cond < num_classes:
        raise PairDataError(
            f"{where}: 'condition' must be a class id in 0..{num_classes - 1} (the model's "
            f"class embeddings), got {cond!r}"
        )
    for key in ("chosen", "rejected"):
        if not isinstance(row[key], str) or not row[key]:
            raise PairDataError(f"{where}: {key!r} must be a non-empty image path")
    if row["chosen"] == row["rejected"]:
        raise PairDataError(f"{where}: 'chosen' and 'rejected' are the same file")
    return cond, row["chosen"], row["rejected"]


def _image(where: str, file: Path, size: int) -> np.ndarray:
    if not file.is_file():
        raise PairDataError(f"{where}: image {file} does not exist")
    try:
        img = read_png(file)
    except (OSError, ValueError) as e:
        raise PairDataError(f"{where}: image {file} is unreadable ({e})") from None
    if img.shape[:2] != (size, size):
        raise PairDataError(
            f"{where}: image {file} is {img.shape[1]}x{img.shape[0]}, the model takes {size}x{size}"
        )
    return img


def write_pairs(directory: Path, rows: Iterable[tuple[int, torch.Tensor, torch.Tensor]]) -> Path:
    """Write ``(condition, chosen, rejected)`` image tensors ([3, H, W] in [-1, 1]) as PNGs under
    ``directory/images`` and the manifest ``directory/pairs.jsonl``; returns the manifest path."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (cond, win, lose) in enumerate(rows):
        names = (f"images/{i:05d}_chosen.png", f"images/{i:05d}_rejected.png")
        for name, img in zip(names, (win, lose), strict=True):
            write_png(directory / name, from_tensor(img[None])[0])
        lines.append(json.dumps({"condition": cond, "chosen": names[0], "rejected": names[1]}))
    manifest = directory / "pairs.jsonl"
    tmp = directory / ".pairs.jsonl.tmp"
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, manifest)
    return manifest


def write_grid(path: Path, images: np.ndarray, columns: int, scale: int = 4) -> None:
    """Images ``[N, H, W, 3]`` as one PNG, ``columns`` per row, each pixel ``scale`` x ``scale``."""
    n, h, w, _ = images.shape
    rows = -(-n // columns)
    grid = np.zeros((rows * (h + 1) + 1, columns * (w + 1) + 1, 3), dtype=np.float32) + 0.5
    for i, img in enumerate(images):
        r, c = divmod(i, columns)
        grid[1 + r * (h + 1) : 1 + r * (h + 1) + h, 1 + c * (w + 1) : 1 + c * (w + 1) + w] = img
    write_png(path, np.kron(grid, np.ones((scale, scale, 1), dtype=np.float32)))
