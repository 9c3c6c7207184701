"""Transformer Engine's quantisation kernels under ``precision="fp8"`` (``fp8_casts="te"``, the
default; :func:`perfsim.models.ops.fp8_cast_ops`): the projection's input cast and transposed in
the forward, the GEMMs' output gradients cast and transposed in the backward, the fp8 inputs the
norms and the activation write transposed for the weight gradients; the norms and the activation
write fp8 instead of bf16. ``fp8_casts="none"`` is the fp8 model without them; bf16 is untouched."""

import subprocess
import sys

import pytest

import perfsim
from perfsim.errors import ConfigError
from perfsim.models.ops import block_ops
from perfsim.models.registry import get_spec

GPT = "gpt:layers=2,hidden=4096,heads=32,seq=2048,vocab=50304"


def _bytes(ops):
    """(forward bytes, backward bytes as transformer_times prices them: 2x the forward unless stated)."""
    fwd = sum(op.bytes for op in ops if not op.m)
    bwd = sum((2 * op.bytes if op.bwd_bytes is None else op.bwd_bytes) for op in ops if not op.m and not op.flash)
    return fwd, bwd


def test_te_casts_add_the_bytes_te_moves_and_keep_the_gemms():
    spec = get_spec(GPT, None)
    mb, bpv = 4, 2
    plain = block_ops(spec, mb, 1, False, bpv, attention="flash")
    casts = block_ops(spec, mb, 1, False, bpv, attention="flash", fp8_casts=True)
    assert [op for op in casts if op.m] == [op for op in plain if op.m]  # the same GEMMs
    tok, h, f = mb * 2048, 4096, 4 * 4096
    (pf, pb), (cf, cb) = _bytes(plain), _bytes(casts)
    # forward: + the projection's input (read 2, write fp8 and its transpose); - one byte per value
    # the two norms and the activation no longer write in bf16
    assert cf - pf == 4 * tok * h - tok * h - tok * h - tok * f
    # backward: QKV's (3h), the projection's and the second MLP GEMM's output gradients cast and
    # transposed (4 bytes a value); the two norms' and the activation's fp8 outputs transposed (2)
    assert cb - pb == 4 * tok * 3 * h + 4 * tok * h + 4 * tok * h + 2 * tok * h + 2 * tok * h + 2 * tok * f


def test_te_casts_slow_an_fp8_step_and_none_is_the_gemm_only_model():
    job = dict(model="gpt2-xl", gpu="h100", pp=1, dp=8, gpus_per_node=8, micro_batch=4, global_batch=64,
               attention="flash")
    te = perfsim.predict(precision="fp8", **job).summary
    none = perfsim.predict(precision="fp8", fp8_casts="none", **job).summary
    bf16, bf16_none = (perfsim.predict(precision="bf16", fp8_casts=c, **job).summary for c in ("te", "none"))
    assert te["compute_s"] > none["compute_s"] and te["iteration_s"] > none["iteration_s"]
    assert bf16["iteration_s"] == bf16_none["iteration_s"]  # only fp8 has these kernels
    assert none["iteration_s"] < te["iteration_s"] < bf16["iteration_s"]


def test_a_bad_fp8_casts_is_one_line():
    with pytest.raises(ConfigError, match="fp8_casts"):
        perfsim.predict(model="gpt2-xl", gpu="h100", pp=1, dp=8, gpus_per_node=8, precision="fp8", fp8_casts="x")
    proc = subprocess.run([sys.executable, "-m", "perfsim", "predict", "--model", "gpt2-xl", "--gpu", "h100",
                           "--pp", "1", "--dp", "8", "--precision", "fp8", "--fp8-casts", "tee"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "fp8" in proc.stderr, proc.stderr
