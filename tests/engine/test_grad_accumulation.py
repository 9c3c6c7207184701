"""Gradient accumulation per micro-batch (``grad_accumulation``, perfsim.models.ops.GradAccumulation):
without gradient accumulation fusion every parameter's gradient is added once more per
micro-batch (Megatron's ``main_grad.add_`` hook, or autograd's ``param.grad +=`` after the first
micro-batch), priced as backward-only memory-bound bytes."""

from __future__ import annotations

import pytest

from perfsim.api import predict
from perfsim.config import Strategy
from perfsim.engine.compute import op_time, transformer_times
from perfsim.errors import ConfigError
from perfsim.hardware import GPUS
from perfsim.models.ops import GRAD_ACCUMULATION, GradAccumulation, Op, block_grad_ops, embed_ops, head_ops
from perfsim.models.registry import get_spec
from perfsim.models.tensor_parallel import shard_block_params

from _helpers import assert_user_error, run_cli_here

A100 = "a100-sxm4-80gb"
MODEL = "gpt:layers=12,hidden=2048,heads=16,seq=1024,vocab=50304"


def test_bytes_per_parameter_and_micro_batch_are_the_docstrings():
    """fused: 0 for a GEMM weight, the embedding's fp32 main_grad add (bpv + 8) otherwise;
    main-grad: read the half gradient, read and write the buffer (fp16 buffer 6, fp32 10) every
    micro-batch; autograd: 3 x the weights' bytes on all but the first of m micro-batches."""
    assert GRAD_ACCUMULATION == ("fused", "main-grad", "autograd")
    fused = GradAccumulation("fused", 8)
    assert fused.per_param(2, fusable=True) == 0 and fused.per_param(2, fusable=False) == 10
    assert GradAccumulation("main-grad", 1, grad_bytes=2).per_param(2, True) == 6
    assert GradAccumulation("main-grad", 5, grad_bytes=4).per_param(2, False) == 10
    assert GradAccumulation("autograd", 1).per_param(2, True) == 0  # the first micro-batch's gradient is kept
    assert GradAccumulation("autograd", 4).per_param(2, True) == pytest.approx(6 * 3 / 4)
    assert GradAccumulation("autograd", 4, weight_bytes=4).per_param(2, True) == pytest.approx(12 * 3 / 4)
    spec = get_spec(MODEL)
    for tp in (1, 2):
        acc = GradAccumulation("main-grad", 3, grad_bytes=2)
        [op] = block_grad_ops(spec, tp, 2, acc)
        assert op.bwd_bytes == 6 * shard_block_params(spec, tp) and not op.bytes and not op.m  # backward only
        assert block_grad_ops(spec, tp, 2, GradAccumulation("fused", 3)) == []
        assert block_grad_ops(spec, tp, 2, GradAccumulation("autograd", 1)) == []
        assert block_grad_ops(spec, tp, 2, None) == []
    # the default keeps the embedding's and the tied head's fp32 adds as they were
    assert embed_ops(spec, 1, 1, False, 2) == embed_ops(spec, 1, 1, False, 2, GradAccumulation())
    assert [o.bwd_bytes for o in embed_ops(spec, 1, 1, False, 2) if o.name == "embed_grad_accumulate"] == \
        [10 * 50304 * 2048]
    assert [o.name for o in head_ops(spec, 1, 1, False, 2, GradAccumulation("autograd", 1))
            if o.name == "lm_head_grad_accumulate"] == []


def test_the_blocks_backward_grows_by_the_priced_bytes_with_micro_batches_only():
    """One micro-batch under autograd: the blocks' backward is fused's (nothing added, the
    gradient is autograd's own); four: each block's backward grows by the op's roofline time."""
    spec = get_spec(MODEL)
    gpu = GPUS[A100]
    args = (spec, gpu, "fp16", 1, 1, False, "full", gpu.curve)
    _, fused = transformer_times(*args)
    _, one = transformer_times(*args, grad_acc=GradAccumulation("autograd", 1))
    _, four = transformer_times(*args, grad_acc=GradAccumulation("autograd", 4))
    assert one[1:-1] == fused[1:-1]
    assert one[0] < fused[0]  # the embedding's add is autograd's too: none on the first micro-batch
    per_block = op_time(Op("acc", bytes=4.5 * shard_block_params(spec, 1)), gpu, "fp16", gpu.curve, 2)
    assert [b - f for b, f in zip(four[1:-1], fused[1:-1])] == pytest.approx([per_block] * spec.n_layer)


def test_the_option_changes_a_multi_micro_batch_prediction_and_not_a_single_one():
    """End to end (predict): with 8 micro-batches both main-grad and autograd are slower than
    fused; with one, autograd's blocks cost what fused's do (only the embedding's add differs)."""
    kw = dict(model=MODEL, gpu=A100, pp=1, tp=1, micro_batch=1, precision="fp16", recompute="full")
    it = {(m, gb): predict(**kw, global_batch=gb, grad_accumulation=m).summary
          for m in GRAD_ACCUMULATION for gb in (1, 8)}
    assert it[("autograd", 8)]["grad_accumulation"] == "autograd"
    assert it[("autograd", 8)]["iteration_s"] > it[("fused", 8)]["iteration_s"]
    assert it[("main-grad", 8)]["iteration_s"] > it[("fused", 8)]["iteration_s"]
    assert it[("main-grad", 1)]["iteration_s"] > it[("fused", 1)]["iteration_s"]  # every micro-batch
    one = it[("autograd", 1)]["compute_s"] - it[("fused", 1)]["compute_s"]
    eight = it[("autograd", 8)]["compute_s"] - it[("fused", 8)]["compute_s"]
    assert one <= 0 < eight
    spec = get_spec(MODEL)
    gpu = GPUS[A100]
    _, fused = transformer_times(spec, gpu, "fp16", 1, 1, False, "full", gpu.curve)
    _, auto = transformer_times(spec, gpu, "fp16", 1, 1, False, "full", gpu.curve,
                                grad_acc=GradAccumulation("autograd", 8, grad_bytes=2))
    assert eight == pytest.approx(8 * (sum(auto) - sum(fused)), rel=1e-6)


def test_a_bad_value_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="grad_accumulation='bogus': choose from fused, main-grad, autograd"):
        Strategy(grad_accumulation="bogus")
    with pytest.raises(ConfigError, match="grad_accumulation"):
        predict(model=MODEL, gpu=A100, pp=1, grad_accumulation="fussed")
    r = run_cli_here("predict", "--model", "gpt2-tiny", "--gpu", A100, "--pp", "1", "--grad-accumulation", "bogus")
    assert_user_error(r.returncode, r.stderr, "grad-accumulation='bogus'")
