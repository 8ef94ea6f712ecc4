"""scripts/vision_probe.py: the ridge probe and the pixel features (pure numpy parts)."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")

_spec = importlib.util.spec_from_file_location("vision_probe", Path(__file__).parents[1] / "scripts" / "vision_probe.py")
vision_probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vision_probe)


def test_ridge_probe_separates_a_linear_signal_and_not_noise():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 50))
    y = x[:, 3] + 0.1 * rng.normal(size=400) > 0.0
    acc = vision_probe.ridge_probe(x[:300], y[:300], x[300:], y[300:], lam=1.0)
    assert acc >= 0.85
    noise = rng.normal(size=(400, 50))
    assert abs(vision_probe.ridge_probe(noise[:300], y[:300], noise[300:], y[300:], lam=1.0) - 0.5) < 0.15


def test_pixel_features_average_grey_4x4_cells():
    frame = np.zeros((8, 12, 3), dtype=np.uint8)
    frame[:4, :4] = 255
    f = vision_probe.pixel_features([frame])
    assert f.shape == (1, 2 * 3) and f[0, 0] == pytest.approx(1.0) and f[0, 1:].sum() == 0.0
