"""``block_ops(exact=True)``: every kernel Megatron-LM's GPT layer launches, with the bytes each
moves as its code reads (the QKV bias add of PyTorch 1.8's ``at::linear`` on a 3-D input, the
context-layer copy, bias gradients, the residual-gradient sums, one-pass dropout backwards, the
causal softmax's triangle, LayerNorm's five-pass backward); off by default, the default list
unchanged."""

import pytest

from perfsim.engine.compute import op_time, transformer_times
from perfsim.hardware import A100_CURVE, get_gpu
from perfsim.models.ops import Op, block_ops
from perfsim.models.registry import get_spec

GPT = "gpt:layers=2,hidden=2304,heads=24,seq=2048,vocab=51200"


def _by_name(ops):
    return {op.name: op for op in ops}


def test_exact_adds_the_missing_kernels_and_keeps_the_gemms():
    spec = get_spec(GPT, None)
    plain, exact = (block_ops(spec, 16, 1, False, 2, exact=e) for e in (False, True))
    assert block_ops(spec, 16, 1, False, 2) == plain  # default: unchanged
    added = [op.name for op in exact if op.name not in _by_name(plain)]
    assert added == ["norm1_input_grad_accumulate", "qkv_bias", "context_copy", "proj_bias_grad",
                     "norm2_input_grad_accumulate", "mlp_down_bias_grad"]
    # the GEMMs are the same GEMMs
    assert [op for op in exact if op.m] == [op for op in plain if op.m]
    tok, h, n = 16 * 2048, 2304, 16 * 24 * 2048 * 2048
    e = _by_name(exact)
    assert e["qkv_bias"].bytes == 2 * 2 * tok * 3 * h and e["qkv_bias"].bwd_bytes == 2 * tok * 3 * h
    assert e["context_copy"].bytes == 2 * 2 * tok * h and e["context_copy"].bwd_bytes == 0.0
    # the causal fused softmax reads the lower triangle and writes the row; its backward reads
    # two triangles and writes the row; the dropouts' backward is one masked pass
    assert e["softmax"].bytes == 1.5 * 2 * n and e["softmax"].bwd_bytes == 2 * 2 * n
    assert e["attn_dropout"].bwd_bytes == e["attn_dropout"].bytes == 5 * n
    act = 2 * tok * h
    assert e["norm1"].bwd_bytes == 5 * act and e["norm1_input_grad_accumulate"].bwd_bytes == 3 * act
    assert e["dropout_residual1"].bwd_bytes == 2 * act + tok * h
    assert e["proj_bias_grad"].bytes == 0 and e["proj_bias_grad"].bwd_bytes == act


def test_exact_tensor_parallel_split_follows_megatron():
    """The QKV output and the context are split t ways; the row-parallel layers' biases are
    whole on every rank, so their gradients are not."""
    spec = get_spec(GPT, None)
    one, four = (_by_name(block_ops(spec, 16, t, False, 2, exact=True)) for t in (1, 4))
    assert four["qkv_bias"].bytes * 4 == one["qkv_bias"].bytes
    assert four["context_copy"].bytes * 4 == one["context_copy"].bytes
    assert four["proj_bias_grad"].bwd_bytes == one["proj_bias_grad"].bwd_bytes
    assert four["mlp_down_bias_grad"].bwd_bytes == one["mlp_down_bias_grad"].bwd_bytes


def test_an_encoder_softmax_reads_whole_rows():
    spec = get_spec("bert-large", None)
    n = 4 * (spec.heads // 2) * spec.seq_len ** 2
    sm = _by_name(block_ops(spec, 4, 2, False, 2, exact=True))["softmax"]
    assert sm.bytes == 2 * 2 * n and sm.bwd_bytes == 3 * 2 * n


def test_exact_times_add_exactly_the_listed_kernels(monkeypatch):
    """Through the engine's pricing: the forward grows by the two new forward kernels less the
    softmax's untouched upper triangle; the backward prices each stated backward at its bytes,
    once, plus the recomputed forward (full recomputation)."""
    import perfsim.engine.compute as compute

    spec, gpu = get_spec(GPT, None), get_gpu("a100-sxm4-80gb")
    plain, exact = (block_ops(spec, 16, 1, False, 2, exact=x) for x in (False, True))

    def t(op):
        return op_time(op, gpu, "fp16", A100_CURVE, 2) if op.m or op.bytes else 0.0

    fwd = transformer_times(spec, gpu, "fp16", 16, 1, False, "full", A100_CURVE)[0][1]
    monkeypatch.setattr(compute, "block_ops", lambda *a, **k: block_ops(*a, **k, exact=True))
    fwds, bwds = transformer_times(spec, gpu, "fp16", 16, 1, False, "full", A100_CURVE)
    p, e = _by_name(plain), _by_name(exact)
    assert fwds[1] - fwd == pytest.approx(t(e["qkv_bias"]) + t(e["context_copy"]) + t(e["softmax"])
                                          - t(p["softmax"]), rel=1e-9)
    stated = sum(2 * t(op) if op.bwd_bytes is None else t(Op(op.name, bytes=op.bwd_bytes)) if op.bwd_bytes else 0.0
                 for op in exact)
    assert bwds[1] == pytest.approx(stated + fwds[1], rel=1e-9)
    assert fwds[1] < fwd  # the softmax's triangle saves more than the two new kernels cost here
