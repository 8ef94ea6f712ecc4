"""`python -m wam_diff_kernels.teacher_forced` on the CPU: the report, its rows, --append (tests/test_kernels_flashinfer_glue.py
checks that the comparison tells a wrong attention kernel from a right one)."""
import json

import pytest

from wam_diff_kernels import teacher_forced

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one CPU thread for the module


def test_cli_scores_float32_variants_as_exact_and_appends_rows(tmp_path):
    out = tmp_path / "tf.json"
    common = ["--model", "nano", "--device", "cpu", "--dtype", "float32", "--block-size", "8", "--steps", "2",
              "--new-tokens", "16", "--out", str(out)]
    assert teacher_forced.main(common + ["--variants", "sdpa"]) == 0
    assert teacher_forced.main(common + ["--variants", "fast", "--append"]) == 0
    result = json.loads(out.read_text())
    assert result["model"] == "nano" and result["prompts"] == 2
    sdpa, fast = result["rows"]
    assert (sdpa["variant"], fast["variant"]) == ("sdpa", "fast")
    # float32 on both sides: the reference's own path is exact, the fast layers within float32 rounding
    assert sdpa["top1_agreement"] == 1.0 and sdpa["max_relative_logit_error"] == 0.0
    assert sdpa["free_running_token_agreement"] == 1.0
    assert fast["top1_agreement"] == 1.0 and fast["max_relative_logit_error"] < 1e-4
    assert sdpa["steps"] == 2 * 2 and sdpa["positions"] == 2 * 2 * (8 + 4)  # 2 blocks of 2 steps, 2 prompts
    with pytest.raises(SystemExit, match="holds model 'nano', not 'nano-l'"):  # before any decoding
        teacher_forced.main(["--model", "nano-l"] + common[2:] + ["--variants", "sdpa", "--append"])


def test_unknown_variants_are_refused_naming_them():
    with pytest.raises(SystemExit):
        teacher_forced.parser().parse_args(["--variants", "sdpa,triton"])
    with pytest.raises(Exception, match="unknown variants \\['triton'\\]"):
        teacher_forced._variants("sdpa,triton")
