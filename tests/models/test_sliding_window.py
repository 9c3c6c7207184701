"""Sliding-window attention (Mistral 7B, arXiv:2310.06825, Sec. 2; transformers' ``sliding_window``,
``max_window_layers`` and ``layer_types``): which blocks are windowed, the (query, key) pairs a flash
kernel computes, block times and FLOPs, config.json, the Megatron-LM flags and refusals. Checked by
hand from the window's geometry; no windowed kernel was timed."""

import dataclasses
import json
from pathlib import Path

import pytest

import perfsim
from perfsim.engine.compute import flash_time, transformer_times
from perfsim.errors import ConfigError
from perfsim.hardware import curve_for, get_gpu
from perfsim.models.ops import Op, block_ops
from perfsim.models.registry import get_spec
from perfsim.models.transformer import parse_inline

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
LLAMA = "llama:layers=4,hidden=2048,heads=16,seq=8192,vocab=1000"


def test_a_flash_kernel_computes_the_pairs_inside_the_window():
    s, w = 4096, 1024
    full = Op("a", m=s, n=s, k=128, batch=32, flash=True)
    windowed = dataclasses.replace(full, window=w)
    assert full.attended_pairs == s * s / 2
    assert windowed.attended_pairs == pytest.approx(w * s - w * w / 2)  # s^2/2 - (s - w)^2/2
    assert dataclasses.replace(full, window=s).attended_pairs == full.attended_pairs  # no shorter than s: none
    assert dataclasses.replace(full, causal=False).attended_pairs == s * s
    assert windowed.flops == pytest.approx(full.flops * (w * s - w * w / 2) / (s * s / 2))
    gpu = get_gpu("h100")
    curve = curve_for(gpu, None)[0]
    t_full, t_win = (flash_time(op, gpu, "bf16", curve) for op in (full, windowed))
    # fewer pairs, each at the rate of a kernel whose inner loop runs over the window's keys
    assert windowed.flops / full.flops < t_win / t_full < 1.0


def test_which_blocks_are_windowed_and_their_flops():
    spec = parse_inline(LLAMA + ",window=1024")
    assert spec.sliding_window == 1024 and all(spec.is_window_block(i) for i in range(4))
    full = dataclasses.replace(spec, sliding_window=0)
    mixed = dataclasses.replace(spec, full_attention_layers=(1, 3))
    assert [mixed.is_window_block(i) for i in range(4)] == [True, False, True, False]
    assert mixed.attention_window(0) == 1024 and mixed.attention_window(1) == 0
    assert not any(spec.with_seq_len(1024).is_window_block(i) for i in range(4))  # the window holds it all
    T, w = spec.seq_len, 1024
    per_block = [layer.flops_fwd for layer in spec.layers()[1:5]]
    attn = 2 * (spec.q_dim + spec.out_dim)
    assert per_block[0] == full.layers()[1].flops_fwd - T * (T - w) * attn
    assert [layer.flops_fwd for layer in mixed.layers()[1:5]] == [per_block[0], full.layers()[2].flops_fwd] * 2
    assert spec.params == full.params  # a window has no weights


def test_block_times_follow_the_window_only_with_flash():
    spec = parse_inline(LLAMA + ",window=1024")
    full = dataclasses.replace(spec, sliding_window=0)
    mixed = dataclasses.replace(spec, full_attention_layers=(1, 3))
    gpu = get_gpu("h100")
    curve = curve_for(gpu, None)[0]

    def times(s, attention):
        return transformer_times(s, gpu, "bf16", 1, 1, False, "none", curve, attention=attention)

    wf, ff, mf = times(spec, "flash"), times(full, "flash"), times(mixed, "flash")
    assert all(a < b for a, b in zip(wf[0][1:5], ff[0][1:5]))
    assert mf[0][1:5] == [wf[0][1], ff[0][2], wf[0][3], ff[0][4]]
    assert times(spec, "megatron") == times(full, "megatron")  # every score computed, then masked
    ops = block_ops(spec, 1, 1, False, 2, "flash", block=0)
    assert [op.window for op in ops if op.flash] == [1024]


def test_config_json_predict_flags_and_refusals(tmp_path):
    cfg = json.loads((CONFIGS / "mistral-7b-v0.3.json").read_text())
    p = tmp_path / "config.json"
    p.write_text(json.dumps({k: v for k, v in cfg.items() if k != "sliding_window"}))  # MistralConfig: 4096
    kw = dict(gpu="h100", gpus_per_node=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=8, precision="bf16",
              seq_len=32768, recompute="selective", allow_oom=True)
    windowed = perfsim.predict(model=str(p), **kw)
    full = perfsim.predict(model=str(CONFIGS / "mistral-7b-v0.3.json"), **kw)  # "sliding_window": null
    assert windowed.summary["iteration_s"] < full.summary["iteration_s"]
    assert "sliding-window attention (4096 tokens) in 32 of 32 blocks" in windowed.summary["model_note"]
    masked = [perfsim.predict(model=m, **kw, attention="megatron").summary["iteration_s"]
              for m in (str(p), str(CONFIGS / "mistral-7b-v0.3.json"))]
    assert masked[0] == masked[1]
    from perfsim.emit import architecture_args

    args, _ = architecture_args(dataclasses.replace(parse_inline(LLAMA + ",window=1024"), full_attention_layers=(3,)))
    assert args[args.index("--window-size") + 1] == "1023,0"
    assert args[args.index("--window-attn-skip-freq") + 1] == "[1,1,1,0]"
    assert "--window-size" not in architecture_args(get_spec("llama2-7b"))[0]
    with pytest.raises(ConfigError, match="kernels=eager: .*sliding window"):
        perfsim.predict(model=LLAMA + ",window=1024", gpu="h100", gpus_per_node=1, pp=1, kernels="eager")
    for bad, needle in (("window=-1", "sliding_window=-1: must be an integer >= 0"),):
        with pytest.raises(ConfigError, match=needle):
            parse_inline(f"{LLAMA},{bad}")
    with pytest.raises(ConfigError, match="full_attention_layers need a sliding_window"):
        dataclasses.replace(parse_inline(LLAMA), full_attention_layers=(1,))
    with pytest.raises(ConfigError, match=r"full_attention_layers: 4 is not a block \(0..3\)"):
        dataclasses.replace(parse_inline(LLAMA + ",window=8"), full_attention_layers=(4,))
    with pytest.raises(ConfigError, match="two-sided window"):
        dataclasses.replace(get_spec("bert-large"), sliding_window=128)
