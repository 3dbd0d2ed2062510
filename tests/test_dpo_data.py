"""The shapes domain, its scorer and validity detector, image batches and the pairs manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from posttrain.data import shapes
from posttrain.data.images import ImageBatch, PairBatch, step_seeds
from posttrain.data.pairs import PairDataError, load_pairs, write_pairs, write_png


def test_clean_shapes_are_valid_only_for_their_own_class():
    images, classes = shapes.random_images(120, 16, seed=3)
    for img, c in zip(images, classes, strict=True):
        assert shapes.is_valid(img, int(c))
        assert not any(shapes.is_valid(img, o) for o in range(3) if o != c)


def test_detector_rejects_degraded_images():
    rng = np.random.default_rng(0)
    square = shapes.render(0, "red", 7, 4, 4, 16)
    assert shapes.is_valid(square, 0)
    assert not shapes.is_valid(np.zeros_like(square), 0)  # nothing drawn
    assert not shapes.is_valid(rng.random((16, 16, 3)).astype(np.float32), 0)  # noise
    two_colours = square.copy()
    two_colours[4:11, 4:8] = shapes.COLORS["blue"]
    assert not shapes.is_valid(two_colours, 0)
    blob = shapes.render(0, "red", 7, 4, 4, 16)
    blob[0:3, 0:3] = shapes.COLORS["red"]  # a stray patch far from the shape
    assert not shapes.is_valid(blob, 0)
    huge = shapes.render(0, "red", 14, 1, 1, 16)  # larger than the domain ever draws
    assert not shapes.is_valid(huge, 0)


def test_preference_score_hand_values():
    centred_red = shapes.render(0, "red", 8, 4, 4, 16)  # centroid (7.5, 7.5) = the centre
    assert shapes.preference_score(centred_red, "red") == pytest.approx(1.0)
    # Blue vs red: colour term 1 - sqrt(2)/sqrt(3); centring term 1.
    blue = shapes.render(0, "blue", 8, 4, 4, 16)
    assert shapes.preference_score(blue, "red") == pytest.approx(
        0.5 * (1 - np.sqrt(2) / np.sqrt(3)) + 0.5
    )
    # A red 4x4 square in the corner: centroid (1.5, 1.5), 6*sqrt(2) from the centre.
    corner = shapes.render(0, "red", 4, 0, 0, 16)
    assert shapes.preference_score(corner, "red") == pytest.approx(0.5 + 0.5 * (1 - 6 / 7.5))
    assert shapes.preference_score(np.zeros((16, 16, 3), np.float32)) == 0.0


def test_batches_slice_index_and_move():
    pairs = PairBatch(
        torch.zeros(4, 3, 2, 2), torch.ones(4, 3, 2, 2), torch.arange(4), step_seeds(0, 1, 4)
    )
    assert len(pairs) == 4 and len(pairs[1:3]) == 2
    picked = pairs[[3, 0]]
    assert picked.labels.tolist() == [3, 0] and picked.seeds.tolist() == [
        int(pairs.seeds[3]),
        int(pairs.seeds[0]),
    ]
    assert isinstance(pairs.winners(), ImageBatch) and pairs.to("cpu").labels.tolist() == [
        0,
        1,
        2,
        3,
    ]
    with pytest.raises(ValueError, match="disagree on the row count"):
        ImageBatch(torch.zeros(2, 3, 2, 2), torch.arange(3), torch.arange(2))
    assert not set(step_seeds(0, 1, 8).tolist()) & set(step_seeds(0, 2, 8).tolist())


@pytest.fixture
def manifest(tmp_path):
    images, classes = shapes.random_images(4, 16, seed=0)
    rows = [
        (int(classes[i]), shapes.to_tensor(images[i : i + 1])[0],
         shapes.to_tensor(images[i + 1 : i + 2])[0])
        for i in range(0, 4, 2)
    ]  # fmt: skip
    return write_pairs(tmp_path / "pairs", rows)


def test_written_pairs_load_back_exactly(manifest):
    pairs = load_pairs(manifest, 16, 3)
    assert len(pairs) == 2 and pairs.chosen.shape == (2, 3, 16, 16)
    images, _ = shapes.random_images(4, 16, seed=0)
    assert torch.allclose(pairs.chosen[1], shapes.to_tensor(images[2:3])[0], atol=1 / 255)


def _rewrite(manifest, line: int, row) -> None:
    lines = manifest.read_text().splitlines()
    lines[line - 1] = row if isinstance(row, str) else json.dumps(row)
    manifest.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "pairs.jsonl:2: not valid JSON"),
        ("[1, 2]", "pairs.jsonl:2: expected a JSON object"),
        ({"condition": 0, "chosen": "a.png"}, "pairs.jsonl:2: expected exactly the keys"),
        ({"condition": 7, "chosen": "a.png", "rejected": "b.png"}, "class id in 0..2"),
        ({"condition": "0", "chosen": "a.png", "rejected": "b.png"}, "class id in 0..2"),
        ({"condition": 0, "chosen": "a.png", "rejected": "a.png"}, "are the same file"),
        ({"condition": 0, "chosen": "images/00000_chosen.png", "rejected": "gone.png"},
         "pairs.jsonl:2: image .*gone.png does not exist"),
    ],
)  # fmt: skip
def test_bad_rows_name_file_and_line(manifest, row, message):
    _rewrite(manifest, 2, row)
    with pytest.raises(PairDataError, match=message) as info:
        load_pairs(manifest, 16, 3)
    assert "\n" not in str(info.value)


def test_unreadable_and_mis_sized_images(manifest):
    bad = manifest.parent / "images" / "00001_rejected.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(PairDataError, match=r"pairs.jsonl:2: image .*00001_rejected.png is unre"):
        load_pairs(manifest, 16, 3)
    write_png(bad, np.zeros((8, 8, 3), np.float32))
    with pytest.raises(PairDataError, match=r"pairs.jsonl:2: .* is 8x8, the model takes 16x16"):
        load_pairs(manifest, 16, 3)


def test_missing_and_empty_manifest(tmp_path):
    with pytest.raises(PairDataError, match="no such file"):
        load_pairs(tmp_path / "nope.jsonl", 16, 3)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(PairDataError, match="no pairs"):
        load_pairs(tmp_path / "empty.jsonl", 16, 3)
