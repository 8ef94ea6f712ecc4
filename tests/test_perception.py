"""The visual-token occupancy loss: target geometry, token order against the processor, the loss, and
a training stage that uses it (the head learns where the boxes are; resume keeps the head)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from wam_diff_training.cli import main
from wam_diff_training.config import ConfigError, load_config
from wam_diff_training.data import DrivingDataset
from wam_diff_training.collate import collate
from wam_diff_training.trainer import OCCUPANCY_HEAD_FILE
from wam_diff_training.perception import occupancy_loss, occupancy_targets, sample_occupancy

FAST = ["--no-progress", "--set", "train.threads=1", "--set", "train.tensorboard=false"]
GRID = (1, 8, 16)  # a 256 x 128 frame: 8 x 16 patches of 16 px, 4 x 8 merged tokens of 32 px


def test_a_box_fills_exactly_its_cell_of_its_token():
    occ = occupancy_targets([[40, 8, 48, 16]], (256, 128), GRID, 16, 2, 4)
    assert occ.shape == (32, 16)
    # pixel cell (row 1, col 5) of 8 px cells: merged token (0, 1) = index 1, its sub-cell (1, 1) = 5
    assert occ[1, 5] == 1.0 and occ.sum() == 1.0


def test_partial_cover_scaling_with_a_resized_frame_and_clipping():
    half = occupancy_targets([[40, 8, 44, 16]], (256, 128), GRID, 16, 2, 4)
    assert half[1, 5] == pytest.approx(0.5) and half.sum() == pytest.approx(0.5)
    # the same box in a frame twice as large that the processor resized to the same grid
    big = occupancy_targets([[80, 16, 96, 32]], (512, 256), GRID, 16, 2, 4)
    assert torch.equal(big, occupancy_targets([[40, 8, 48, 16]], (256, 128), GRID, 16, 2, 4))
    # two overlapping boxes never count a cell more than once; a box across a token edge splits
    both = occupancy_targets([[40, 8, 48, 16], [40, 8, 48, 16]], (256, 128), GRID, 16, 2, 4)
    assert both.max() == 1.0
    edge = occupancy_targets([[60, 0, 68, 8]], (256, 128), GRID, 16, 2, 4)
    assert edge[1, 3] == pytest.approx(0.5) and edge[2, 0] == pytest.approx(0.5)
    assert occupancy_targets([[10, 10, 10, 20]], (256, 128), GRID, 16, 2, 4).sum() == 0.0  # empty box


def test_bad_geometry_is_named():
    with pytest.raises(ValueError, match="cells 3"):
        occupancy_targets([], (256, 128), GRID, 16, 2, 3)
    with pytest.raises(ValueError, match="single image"):
        occupancy_targets([], (256, 128), (2, 8, 16), 16, 2, 4)
    with pytest.raises(ValueError, match="frame_size"):
        occupancy_targets([], (0, 128), GRID, 16, 2, 4)
    with pytest.raises(ValueError, match="box"):
        occupancy_targets([[1, 2, 3]], (256, 128), GRID, 16, 2, 4)
    with pytest.raises(ValueError, match="frame_size"):
        sample_occupancy({"boxes_px": []}, torch.tensor([GRID]), 16, 2, 4)
    nan = sample_occupancy({"route_id": "x"}, torch.tensor([GRID]), 16, 2, 4)  # no boxes: no supervision
    assert nan.shape == (32, 16) and torch.isnan(nan).all()


def test_target_token_order_matches_the_processors_visual_tokens(nano):
    """A bright square at a known place: the merged token whose patches hold it is the one the targets mark."""
    img = np.zeros((128, 256, 3), dtype=np.uint8)
    img[72:80, 168:176] = 255  # pixel cell (9, 21): merged token (2, 5)
    enc = nano.processor.encode(["<|vision_start|><|image_pad|><|vision_end|>x"], [[img]])
    assert enc.image_grid_thw.tolist() == [list(GRID)]
    patches = enc.pixel_values.view(-1, 4, enc.pixel_values.shape[-1])  # (merged tokens, merge^2, patch dim)
    bright = patches.amax(dim=(1, 2))
    token = int(bright.argmax())
    assert (bright > bright.min() + 1e-3).sum() == 1
    occ = occupancy_targets([[168, 72, 176, 80]], (256, 128), GRID, 16, 2, 4)
    assert occ.sum(-1).nonzero().flatten().tolist() == [token] == [2 * 8 + 5]


def test_loss_ignores_tokens_without_targets_and_reports_recall():
    targets = torch.zeros(3, 4)
    targets[0, 1] = 1.0
    targets[2] = float("nan")
    perfect = torch.where(targets > 0.5, 20.0, -20.0)
    bce, stats = occupancy_loss(perfect, targets)
    assert bce < 1e-6 and stats["occ_recall"] == 1.0 and stats["occ_false_pos"] == 0.0 and stats["occ_precision"] == 1.0
    bce0, stats0 = occupancy_loss(torch.zeros(3, 4), targets)
    assert bce0 == pytest.approx(np.log(2), rel=1e-5) and stats0["occ_recall"] == 1.0  # 0 logits count as >= 0.5
    assert stats0["occ_precision"] == pytest.approx(1 / 8)  # 8 valid cells called occupied, 1 is
    # balanced: calling every cell empty costs half the loss of the one occupied cell, however few there are
    empty = torch.full((3, 4), -20.0)
    bce_empty, stats_e = occupancy_loss(empty, targets)
    assert bce_empty == pytest.approx(0.5 * 20.0, rel=1e-3) and stats_e["occ_recall"] == 0.0
    none, _ = occupancy_loss(torch.zeros(1, 4, requires_grad=True), torch.full((1, 4), float("nan")))
    assert none == 0.0 and none.requires_grad


def test_config_refuses_bad_perception_values(tmp_path):
    with pytest.raises(ConfigError, match="occupancy_weight"):
        load_config(None, ["perception.occupancy_weight=-1"])
    with pytest.raises(ConfigError, match="occupancy_cells"):
        load_config(None, ["perception.occupancy_cells=3"])
    assert load_config(None, ["perception.occupancy_weight=0.5"]).perception.occupancy_weight == 0.5


def write_boxes_dataset(root: Path, n: int = 8) -> Path:
    """Frames with one white box each at a random place, and its box in meta (as `wam-diff data` writes)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    samples = []
    for i in range(n):
        img = np.full((128, 256, 3), 90, dtype=np.uint8)
        x, y = int(rng.integers(0, 240)), int(rng.integers(0, 120))
        img[y:y + 8, x:x + 16] = 255
        Image.fromarray(img).save(root / f"f{i}.png")
        samples.append({"id": f"s{i}", "datasource": "toy", "task": "qa", "image": [f"f{i}.png"],
                        "conversations": [{"from": "human", "value": f"<image>Where {i}?"},
                                          {"from": "gpt", "value": f"box {i}"}],
                        "meta": {"frame_size": [256, 128], "boxes_px": [[x, y, x + 16, y + 8]]}})
    samples.append({"id": "no-meta", "datasource": "toy", "task": "qa", "image": ["f0.png"],
                    "conversations": [{"from": "human", "value": "<image>?"}, {"from": "gpt", "value": "none"}]})
    path = root / "train.json"
    path.write_text(json.dumps(samples))
    return path


def test_collate_lines_targets_up_with_the_batch_images(nano, tmp_path):
    data = write_boxes_dataset(tmp_path / "d", 3)
    ds = DrivingDataset(data, nano.processor, occupancy_cells=4)
    batch = collate([ds[i] for i in range(4)], nano.pad_token_id)
    assert batch.occupancy.shape == (4 * 32, 16)
    assert torch.isnan(batch.occupancy[96:]).all() and not torch.isnan(batch.occupancy[:96]).any()
    for i in range(3):
        assert batch.occupancy[32 * i:32 * (i + 1)].sum() == pytest.approx(16 * 8 / 64)
    assert collate([ds[0]], nano.pad_token_id).occupancy is not None
    plain = DrivingDataset(data, nano.processor)
    assert collate([plain[0]], nano.pad_token_id).occupancy is None


def test_a_stage_with_the_occupancy_loss_learns_where_the_boxes_are_and_resumes_with_its_head(nano_ckpt, tmp_path):
    data = write_boxes_dataset(tmp_path / "data")
    out = tmp_path / "run"
    common = ["--data", str(data), "--out", str(out), "--batch-size", "8", "--lr", "3e-3", "--set",
              "optim.vision_lr=3e-3", "--set", "optim.warmup_steps=2", "--set", "eval.enabled=false",
              "--set", "perception.occupancy_weight=1.0", "--set", "train.save_every=20", *FAST]
    assert main(["ar", "--init", str(nano_ckpt), "--max-steps", "40", "--set", "train.stop_after=20", *common]) == 0
    assert main(["ar", "--init", str(nano_ckpt), "--max-steps", "40", "--resume", *common]) == 0
    rows = [json.loads(line) for line in (out / "ar" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    first, last = rows[0]["occ_bce"], np.mean([r["occ_bce"] for r in rows[-5:]])
    assert last < 0.5 * first, (first, last)
    assert np.mean([r["occ_recall"] for r in rows[-5:]]) > 0.5
    head = torch.load(out / "ar" / OCCUPANCY_HEAD_FILE)
    assert head["proj.weight"].shape[0] == 16
    from safetensors.torch import load_file
    assert not any("occupancy" in k for k in load_file(out / "ar" / "model" / "model.safetensors"))

