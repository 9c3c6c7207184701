"""One model registry: every name --model takes, for predict, plan, memory and run; one ModelSpec."""

import dataclasses
from pathlib import Path

import pytest

from perfsim import hardware
from perfsim.errors import ConfigError
from perfsim.models.hf_config import from_hf_config
from perfsim.models.registry import ALIASES, PRESETS, RUNTIME_PRESETS, get_model_spec, get_spec
from perfsim.models.size_only import SizeSpec
from perfsim.models.specs import MLPSpec, ModelSpec
from perfsim.models.transformer import TransformerSpec
from perfsim.workload import get_model
from tests._helpers import run_cli

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_model_spec_the_simulator_builds(name):
    spec = get_spec(name)
    assert isinstance(spec, ModelSpec) and isinstance(spec, (TransformerSpec, MLPSpec, SizeSpec))
    assert spec.name == name
    m = get_model(name)
    assert m.spec is spec and m.name == name and m.tokens_per_sample == spec.tokens_per_sample
    assert m.layers == tuple(spec.layers()) and m.params == sum(layer.params for layer in spec.layers())
    assert (m.arch is spec) == isinstance(spec, TransformerSpec)


def test_the_runtime_trains_its_presets_from_the_same_specs():
    from perfsim.runtime.models import build_layer

    for spec in RUNTIME_PRESETS:
        assert get_model_spec(spec.name) is PRESETS[spec.name] is get_spec(spec.name)
    tiny = get_model_spec("gpt2-tiny")
    assert isinstance(tiny, TransformerSpec) and (tiny.hidden, tiny.heads, tiny.vocab) == (128, 4, 256)
    # a block's torch module holds exactly the parameters the simulator counts for it
    block = build_layer(tiny, 1, seed=0)
    assert sum(p.numel() for p in block.parameters()) == tiny.layers()[1].params
    # a transformer the runtime's GPT modules do not build is refused by name, not built wrong
    from perfsim.runtime.models import check_gpt

    with pytest.raises(ConfigError, match="llama2-7b"):
        check_gpt(get_spec("llama2-7b"))


def test_an_unknown_name_is_one_error_listing_every_preset():
    with pytest.raises(ConfigError) as e:
        get_spec("gpt5")
    text = str(e.value)
    assert "'gpt5'" in text and all(name in text for name in PRESETS)
    with pytest.raises(ConfigError, match="perfsim run trains gpt2-tiny"):
        get_model_spec("gpt5")
    with pytest.raises(ConfigError, match="not one perfsim run trains"):
        get_model_spec("llama2-70b")
    with pytest.raises(ConfigError, match="not a transformer"):
        get_spec("resnet50", seq_len=128)


def test_an_alias_resolves_to_its_preset_everywhere():
    import perfsim
    from perfsim.analysis.memory_fit import memory_report
    from perfsim.runtime.config import RunConfig

    assert ALIASES["gpt2-1.5b"] == "gpt2-xl"
    assert get_spec("GPT2-1.5B") is PRESETS["gpt2-xl"] and get_model_spec("gpt2-1.5b") is PRESETS["gpt2-xl"]
    job = dict(gpu="a100", pp=2, dp=2, precision="bf16")
    same = perfsim.predict(model="gpt2-1.5b", **job).summary
    xl = perfsim.predict(model="gpt2-xl", **job).summary
    assert same["iteration_s"] == xl["iteration_s"] and same["params"] == xl["params"]
    assert memory_report(model="gpt2-1.5b", **job).peak_bytes == memory_report(model="gpt2-xl", **job).peak_bytes
    assert RunConfig(model="gpt2-1.5b").spec() is PRESETS["gpt2-xl"]


@pytest.mark.parametrize("name, params, active", [
    ("mixtral-8x7b", 46_702_792_704, 12_879_925_248),  # the model card's 46.7 B, 12.9 B active
    ("deepseek-moe-16b", 16_375_728_128, 2_828_650_496),  # the paper's 16.4 B, 2.8 B activated
    ("qwen1.5-moe-a2.7b", 14_315_784_192, 2_689_173_504)])  # the card's 14.3 B, 2.7 B activated
def test_each_moe_preset_is_its_config_json(name, params, active):
    """The MoE preset and the Hugging Face config.json describe the same model (the file's
    context length aside: rotary, no position table)."""
    preset = get_spec(name)
    read = from_hf_config(CONFIGS / f"{name}.json")
    assert preset.moe and read.moe
    assert dataclasses.replace(read, from_config=False, max_positions=preset.max_positions) == preset
    assert (preset.params, preset.active_params) == (read.params, read.active_params) == (params, active)


@pytest.mark.parametrize("name, config", [
    ("llama3-8b", "llama3-8b"),
    ("llama3-70b", "llama3.1-70b"),  # Llama 3.1 70B: the same layers, 128K positions (RoPE scaling)
    ("mistral-7b", "mistral-7b-v0.3"),
    ("qwen2.5-7b", "qwen2.5-7b")])
def test_each_dense_preset_is_its_config_json(name, config):
    """A dense preset and the published config.json describe the same layers; only the name,
    the training sequence length (the preset's: Llama 3's 8192) and the position count may differ."""
    preset = get_spec(name)
    read = from_hf_config(CONFIGS / f"{config}.json")
    same = dataclasses.replace(read, name=name, from_config=False, seq_len=preset.seq_len,
                               max_positions=preset.max_positions)
    assert same == preset and preset.params == read.params


@pytest.mark.parametrize("name, published, rel", [
    ("llama3.1-405b", 405e9, 0.005),  # arXiv:2407.21783: "405B parameters"
    ("qwen2.5-72b", 72.7e9, 0.001)])  # Qwen/Qwen2.5-72B model card: 72.7 B
def test_presets_without_a_config_fixture_have_their_published_size(name, published, rel):
    assert get_spec(name).params == pytest.approx(published, rel=rel)


@pytest.mark.parametrize("name, total, active", [
    ("qwen3-8b", 8.2e9, None), ("qwen3-32b", 32.8e9, None),  # Qwen/Qwen3-* model cards
    ("qwen3-30b-a3b", 30.5e9, 3.3e9), ("qwen3-235b-a22b", 235e9, 22e9)])
def test_qwen3_presets_have_their_published_sizes(name, total, active):
    """The cards round totals to 0.1 B (1 B for 235B): the query/key norms' 2 x 128 weights per block
    are below that, the head width (128 at every size, not hidden / heads) is not. Activated counts
    within 2 % (3.35 B is the card's "3.3B", 22.2 B its "22B"), as test_model_configs checks them."""
    spec = get_spec(name)
    assert spec.qk_norm and spec.head_dim == 128 and not spec.qkv_bias
    assert spec.params == pytest.approx(total, abs=0.05e9 if total < 100e9 else 0.5e9)
    assert spec.active_params == pytest.approx(active or total, rel=0.02 if active else 0.01)


@pytest.mark.parametrize("name", ["qwen3-8b", "qwen3-30b-a3b"])
def test_a_qwen3_config_json_reads_as_its_preset(name, tmp_path):
    """A config.json with transformers' Qwen3Config / Qwen3MoeConfig field names, written from the
    preset (no published file is stored here), reads back as the preset: the reader knows
    model_type qwen3 and qwen3_moe, their query/key norms and their experts."""
    p = get_spec(name)
    cfg = {"model_type": "qwen3_moe" if p.moe else "qwen3", "hidden_size": p.hidden, "intermediate_size": p.ffn,
           "num_hidden_layers": p.n_layer, "num_attention_heads": p.heads, "num_key_value_heads": p.kv_heads,
           "head_dim": p.head_dim, "vocab_size": p.vocab, "max_position_embeddings": p.max_positions,
           "tie_word_embeddings": False, "attention_bias": False, "use_sliding_window": False,
           "sliding_window": None, "max_window_layers": p.n_layer, "rope_theta": 1e6, "rms_norm_eps": 1e-6}
    if p.moe:
        cfg.update(num_experts=p.experts, num_experts_per_tok=p.top_k, moe_intermediate_size=p.expert_ffn,
                   decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    path = tmp_path / "config.json"
    path.write_text(__import__("json").dumps(cfg))
    read = from_hf_config(path)
    assert dataclasses.replace(read, name=name, from_config=False) == p


def test_the_checkpoints_spellings_are_aliases():
    for alias, name in (("llama-3-8b", "llama3-8b"), ("Llama-3.1-405B", "llama3.1-405b"),
                        ("mistral-7b-v0.3", "mistral-7b")):
        assert get_spec(alias) is PRESETS[name]


@pytest.mark.parametrize("command", [("predict",), ("memory",), ("plan", "--nodes", "1")])
def test_every_command_refuses_an_unknown_model_the_same_way(command):
    r = run_cli(*command, "--model", "gpt5")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "'gpt5'" in r.stderr and "mixtral-8x7b" in r.stderr and "digits-mlp" in r.stderr


def test_each_gpu_preset_holds_its_curve():
    """The curves live on the GPU presets: fitted on it, or borrowed from a GPU preset of
    the same architecture, or from the nearest calibrated one -- which the sentence says."""
    fitted = {g.curve.fitted_on for g in hardware.GPUS.values()}
    assert fitted == {"a100-sxm4-80gb", "h200-sxm-141gb", "h100-sxm5-80gb"}
    for g in hardware.GPUS.values():
        curve, said = hardware.curve_for(g)
        assert curve is g.curve and g.curve.fitted_on in hardware.GPUS
        if g.curve.fitted_on == g.name:
            assert said == f"roofline x efficiency curve calibrated on {g.name}" and not hardware.curve_borrowed(g)
        elif hardware.curve_borrowed(g):
            assert "nearest calibrated GPU" in said and g.family in ("volta", "ada", "cdna3")
        else:
            assert "(same architecture)" in said
    assert hardware.get_gpu("h100-pcie").curve is hardware.H200_CURVE
    assert hardware.get_gpu("v100").curve is hardware.A100_CURVE
