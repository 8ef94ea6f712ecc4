"""The weights' dtype is one setting from the command line, the policy and the CARLA agent's YAML to the loaded
model: float32 / bfloat16 / float16, unset meaning the checkpoint's own on a GPU and float32 on a CPU. Settings a
CPU cannot honour (CUDA graphs, a CUDA device) are one line before any weight is read."""
import argparse

import pytest
import torch

from wam_diff_core import policy as policy_mod
from wam_diff_core.cli import main as wam_diff
from wam_diff_core.console import DEBUG_ENV
from wam_diff_core.decoding.options import add_decoding_arguments, decoding_arguments
from wam_diff_core.model import precision
from wam_diff_core.model.precision import DtypeError, auto_dtype
from wam_diff_core.policy import DrivingPolicy, PolicySettingsError
from wam_diff_core.types import EgoState


@pytest.fixture
def no_load(monkeypatch):
    """Any weight load fails the test: the errors under test come first."""
    monkeypatch.setattr(policy_mod, "load", lambda *a, **k: pytest.fail("weights were loaded"))


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_decoding_arguments(parser)
    return parser.parse_args(argv)


def test_the_dtype_flag_reaches_the_policy_keywords_and_is_left_out_when_unset():
    assert decoding_arguments(_parse(["--dtype", "bfloat16", "--steps", "2"])) == {"dtype": "bfloat16", "steps": 2}
    assert decoding_arguments(_parse(["--dtype", "auto"])) == {"dtype": "auto"}
    assert "dtype" not in decoding_arguments(_parse([]))
    with pytest.raises(SystemExit):
        _parse(["--dtype", "fp8"])


def test_the_policy_loads_bfloat16_weights_and_plans_with_them(nano_ckpt, camera_image):
    policy = DrivingPolicy.load(str(nano_ckpt), dtype="bfloat16", max_new_tokens=16)
    params = list(policy.loaded.model.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert sum(p.numel() * p.element_size() for p in params) == 2 * sum(p.numel() for p in params)
    plan = policy.plan([camera_image], EgoState(vx=5.0), "follow lane")
    assert plan.stats["decode"].tokens > 0 and plan.timings["plan_total"] > 0
    assert {p.dtype for p in DrivingPolicy.load(str(nano_ckpt)).loaded.model.parameters()} == {torch.float32}


def test_a_bad_dtype_is_refused_before_the_weights_load(no_load):
    with pytest.raises(DtypeError, match=r"dtype 'half': expected one of float32, bfloat16, float16, auto"):
        DrivingPolicy.load("nano", dtype="half")


@pytest.mark.parametrize("device, block, native, loaded, expected", [
    ("cpu", 32, True, torch.float32, torch.bfloat16),
    ("cpu", 1, True, torch.float32, torch.float32),  # one-token forwards: float32 is faster
    ("cpu", 32, False, torch.float32, torch.float32),  # emulated bf16 is ~3x slower than float32
    ("cuda", 32, True, torch.bfloat16, torch.bfloat16),  # a GPU keeps the checkpoint's own
    ("cuda", 1, False, torch.float16, torch.float16),
])
def test_auto_dtype_is_bfloat16_only_for_block_decoding_on_a_cpu_with_native_bf16(monkeypatch, device, block, native,
                                                                                  loaded, expected):
    monkeypatch.setattr(precision, "native_bf16", lambda: native)
    assert auto_dtype(device, block, loaded) == expected


def test_native_bf16_reads_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert precision.native_bf16()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not precision.native_bf16()


@pytest.mark.parametrize("native, block, expected", [(True, 32, torch.bfloat16), (True, 1, torch.float32),
                                                     (False, 32, torch.float32)])
def test_a_policy_loaded_with_auto_takes_the_dtype_of_its_block_size(nano_ckpt, monkeypatch, native, block, expected):
    monkeypatch.setattr(precision, "native_bf16", lambda: native)
    policy = DrivingPolicy.load(str(nano_ckpt), dtype="auto", block_size=block, max_new_tokens=16)
    assert {p.dtype for p in policy.loaded.model.parameters()} == {expected}
    assert policy.config.block_size == block


def test_auto_is_for_policies_loading_weights_directly_names_it(nano_ckpt):
    from wam_diff_core.model.checkpoint import load_model

    with pytest.raises(DtypeError, match="'auto' is chosen per policy"):
        load_model(nano_ckpt, dtype="auto")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only behaviour")
def test_cuda_graphs_or_a_cuda_device_on_a_cpu_only_machine_is_one_line_before_any_load(no_load, nano):
    with pytest.raises(PolicySettingsError) as err:
        DrivingPolicy.load("nano", cuda_graphs=True)
    assert str(err.value) == ("cuda_graphs=True needs a CUDA device, the model is on cpu: set the device to cuda, "
                              "or cuda_graphs off")
    with pytest.raises(PolicySettingsError, match=r"^device 'cuda': CUDA is not available on this machine"):
        DrivingPolicy.load("nano", device="cuda", cuda_graphs=True)
    with pytest.raises(PolicySettingsError, match="cuda_graphs=True needs a CUDA device"):
        DrivingPolicy(nano, policy_mod.DecoderConfig(cuda_graphs=True))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only behaviour")
def test_the_decode_command_with_cuda_graphs_on_a_cpu_is_one_error_line_and_status_2(no_load, capsys, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "0")
    assert wam_diff(["decode", "--model", "nano", "--cuda-graphs", "on"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["wam-diff decode: error: cuda_graphs=True needs a CUDA device, the model is on cpu: set the device "
                   "to cuda, or cuda_graphs off"]


def test_the_carla_agent_yaml_states_a_dtype_and_the_agent_loads_with_it(tmp_path, monkeypatch):
    from wam_diff_ros.carla import agent as agent_mod
    from wam_diff_ros.carla.agent_config import DEFAULT_CONFIG, AgentConfig, AgentConfigError

    assert AgentConfig.load(DEFAULT_CONFIG).dtype is None  # the shipped YAML: the checkpoint's own
    conf = tmp_path / "agent.yaml"
    conf.write_text(DEFAULT_CONFIG.read_text().replace("dtype: null", "dtype: bfloat16"))
    asked = {}
    monkeypatch.setattr(DrivingPolicy, "load", classmethod(lambda cls, model, **kw: asked.update(kw) or object()))
    getattr(agent_mod, agent_mod.get_entry_point())("localhost", 2000, False).setup(str(conf))
    assert asked["dtype"] == "bfloat16" and asked["device"] == "cuda"
    conf.write_text(DEFAULT_CONFIG.read_text().replace("dtype: null", "dtype: fp8"))
    with pytest.raises(AgentConfigError, match=r"agent\.yaml: dtype 'fp8': expected one of float32, bfloat16, "
                                               r"float16, auto or null"):
        AgentConfig.load(conf)
