"""`wam-diff bench`: decoding configurations timed in interleaved rounds, ratios with their spread."""
import json

import pytest

from wam_diff_core.bench.decode import configurations
from wam_diff_core.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # spinning threads on a shared 2-core machine


def test_configurations_put_ar_first_and_only_steps_that_fit_a_block():
    assert configurations([1], [1, 4, 32], [4, 8]) == [(1, 1, 1), (1, 4, 4), (1, 32, 4), (1, 32, 8)]


def test_bench_json_has_rounds_spreads_machine_and_load(nano_ckpt, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "--model", str(nano_ckpt), "--block-sizes", "1,8", "--steps", "2", "--new-tokens", "16",
               "--repeats", "3", "--order", "shuffle", "--seed", "3", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert (result["rounds"], result["order"], result["seed"]) == (3, "shuffle", 3)
    assert set(result["machine"]) >= {"cpu", "cores", "usable_cores", "torch_threads", "cpu_flags", "torch"}
    assert len(result["load_before"]) == 3 and len(result["load_1min_per_round"]) == 3
    ar, block = result["rows"]
    assert ar["speedup_vs_ar"] == 1.0 and ar["speedup_spread"]["min"] == ar["speedup_spread"]["max"] == 1.0
    s = block["speedup_spread"]
    assert s["n"] == 3 and s["min"] <= block["speedup_vs_ar"] <= s["max"] and s["iqr"] >= 0
    assert block["forwards_per_token"] == pytest.approx(4 / 16)  # 2 blocks x K = 2, commits fused
    assert "min-max" in capsys.readouterr().out


def test_zero_rounds_is_a_usage_error(capsys):
    assert main(["bench", "--model", "nano", "--repeats", "0"]) == 2
    assert "--repeats 0" in capsys.readouterr().err
