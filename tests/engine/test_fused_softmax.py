"""Megatron's fused softmax only runs for some shapes; elsewhere its PyTorch path costs 5 kernels."""

import pytest

from perfsim.api import build_configs
from perfsim.hardware import A100_CURVE
from perfsim.models.ops import batch_per_block, block_ops, fused_softmax_available
from perfsim.models.registry import get_spec


def test_kernel_availability_rules():
    assert batch_per_block(1024) == 4 and batch_per_block(128) == 8 and batch_per_block(64) == 8
    assert fused_softmax_available(1, 4, 1024, 1024, half=True)  # TP 4 of 16 heads
    assert not fused_softmax_available(1, 2, 1024, 1024, half=True)  # TP 8 of 16 heads, one sequence
    assert fused_softmax_available(2, 2, 1024, 1024, half=True)
    assert not fused_softmax_available(4, 4, 1024, 1024, half=False)  # fp32 input
    assert not fused_softmax_available(4, 4, 8192, 8192, half=True)  # sk > 4096
    assert not fused_softmax_available(1, 4, 128, 128, half=True)  # 4 rows, the block takes 8


def _kernels(mb, tp, bpv=2):
    spec = get_spec("gpt:layers=2,hidden=1024,heads=16,seq=1024,vocab=51200", None)
    return [op.name for op in block_ops(spec, mb, tp, False, bpv) if op.attention_core and not op.m]


def test_block_ops_take_the_torch_path_where_megatron_does():
    assert _kernels(1, 4) == ["softmax", "attn_dropout"]
    assert _kernels(1, 8) == ["softmax_to_fp32", "softmax_scale", "softmax_mask", "softmax",
                              "softmax_to_half", "attn_dropout"]
    assert _kernels(2, 8) == ["softmax", "attn_dropout"]
    assert _kernels(2, 8, bpv=4) == ["softmax_scale", "softmax_mask", "softmax", "attn_dropout"]


def test_tp8_one_sequence_pays_four_more_kernels_per_pass():
    """At micro-batch 1 every op is at the host floor (kernel_s): the unfused path adds
    4 kernels to the forward, 8 to the backward and 4 to the recomputed forward."""
    args = dict(model="gpt:layers=2,hidden=1024,heads=16,seq=1024,vocab=51200", gpu="a100-sxm4-80gb",
                precision="fp16", micro_batch=1, global_batch=1, recompute="full", pp=1, dp=1, attention="megatron")
    k = A100_CURVE.kernel_s
    w8, *_ = build_configs(**args, tp=8)
    spec = get_spec(args["model"], None)
    n_fused = len(block_ops(spec, 2, 8, False, 2))
    n_unfused = len(block_ops(spec, 1, 8, False, 2))
    assert n_unfused - n_fused == 4
    assert w8.fwd_s[1] == pytest.approx(n_unfused * k)  # every op at the floor
    assert w8.bwd_s[1] == pytest.approx(3 * n_unfused * k)  # 2x backward + recomputed forward
