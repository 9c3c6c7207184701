"""The host's launch queue (``Curve.host_issue = "queue"``, perfsim.engine.compute.queued): a layer
costs the longer of its GPU time and its kernels' issue time, never more than the per-operator floor
(``per-op``) and never less than either side; the kernel counts are the ones the per-op model floors."""

from dataclasses import replace

import pytest

from perfsim import hardware
from perfsim.engine.compute import kernel_counts, queued, transformer_times
from perfsim.errors import ConfigError
from perfsim.models.ops import Op, block_ops
from perfsim.models.registry import get_spec

A100 = hardware.get_gpu("a100-sxm4-80gb")
SPEC = get_spec("gpt:layers=2,hidden=1024,heads=16,seq=1024,vocab=50304")


def _times(mb, mode, recompute="full", kernel_s=None):
    curve = replace(A100.curve, host_issue=mode,
                    kernel_s=A100.curve.kernel_s if kernel_s is None else kernel_s)
    return transformer_times(SPEC, A100, "fp16", mb, 2, False, recompute, curve)


def test_queued_is_the_longer_side():
    assert queued(1e-3, 10, 50e-6) == 1e-3  # GPU-bound: the host hides behind the GPU
    assert queued(1e-4, 10, 50e-6) == pytest.approx(5e-4)  # host-bound: 10 launches


def test_kernel_counts_follow_the_per_op_floors():
    ops = [Op("gemm", 64, 64, 64), Op("norm", bytes=100), Op("acc", bytes=100, bwd_bytes=40),
           Op("nothing", bytes=0), Op("fwd_only", bytes=10, bwd_bytes=0)]
    # forward: 4 live ops; backward: GEMM 2, norm 2, stated bytes 1, stated zero 0
    assert kernel_counts(ops) == (4, 5)
    assert kernel_counts(ops, "full") == (4, 9)
    # a block priced entirely at the floor costs the same under both models
    tiny = block_ops(SPEC, 1, 2, False, 2)
    nf, nb = kernel_counts(tiny, "full")
    f_q, b_q = _times(1, "queue", kernel_s=1.0)  # a host so slow that every op is host-bound
    f_p, b_p = _times(1, "per-op", kernel_s=1.0)
    assert f_q[1] == pytest.approx(nf) and b_q[1] == pytest.approx(nb)
    assert f_q[1] == pytest.approx(f_p[1]) and b_q[1] == pytest.approx(b_p[1])


@pytest.mark.parametrize("mb", [1, 4, 16])
def test_queue_never_costs_more_than_per_op_nor_less_than_either_side(mb):
    fq, bq = _times(mb, "queue")
    fp, bp = _times(mb, "per-op")
    fg, bg = _times(mb, "per-op", kernel_s=0.0)  # the GPU's time alone
    nf, nb = kernel_counts(block_ops(SPEC, mb, 2, False, 2), "full")
    h = A100.curve.kernel_s
    for q, p, g, n in ((fq[1], fp[1], fg[1], nf), (bq[1], bp[1], bg[1], nb)):
        assert max(g, n * h) == pytest.approx(q)
        assert q <= p + 1e-12
    # where the GEMMs outgrow the floor but small kernels remain, the queue is strictly cheaper
    if mb == 4:
        assert bq[1] < bp[1]


def test_bad_mode_is_refused():
    with pytest.raises(ConfigError, match="host_issue"):
        replace(A100.curve, host_issue="async")
