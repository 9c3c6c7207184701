"""Compute model per operator: roofline with an achieved-efficiency curve.

A transformer layer's forward pass is a list of :class:`Op` (Megatron-LM's GPT
block, Shoeybi et al. 2019, arXiv:1909.08053; operator list and sizes as in
Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4.1): the QKV, attention-output and
MLP GEMMs (split ``t`` ways by tensor parallelism), the two batched attention
GEMMs (scores ``Q K^T`` and the weighted sum), and the memory-bound operators
(norms, softmax, dropouts, GELU/SwiGLU, residual adds; with sequence parallelism
norms and dropouts see ``s / t`` tokens). The softmax is Megatron's fused kernel
where Megatron can use it, else its five-kernel PyTorch path (:func:`softmax_ops`). The embedding (a gather), the LM head
(a ``hidden x vocab/t`` GEMM per token, last stage) and the loss (Megatron's
vocab-parallel cross entropy in fp32, pass by pass: :func:`cross_entropy_ops`) are ops
too, so every layer costs something; so is the per-micro-batch accumulation of the
dense ``vocab/t x hidden`` embedding gradient (and of the tied LM head's) into the
fp32 main gradient (:func:`embedding_grad_ops`), which the transformer GEMMs avoid.

Time of one op (roofline, Williams et al. 2009, CACM 52(4), with achieved rates):

* GEMM ``(m, n, k)``: ``max(2mnk / (peak * eff), bytes / (bw * mem_eff), kernel_s)`` with
  ``eff = eff_max * g(m) g(n) g(k)``, ``g(x) = x / (x + knee)`` -- small dimensions
  leave tensor cores idle (tile quantisation and occupancy) -- times ``misaligned_eff``
  when a feature dimension (``n`` or ``k``: a leading dimension of the layer's weight,
  output or output gradient in all three of its GEMMs) is not a multiple of 16 bytes
  (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background":
  tensor cores want 16-byte-aligned leading dimensions; e.g. an unpadded vocabulary);
* memory-bound op: ``max(bytes / (bw * mem_eff), kernel_s)``.

``kernel_s`` is the host's time to issue one operator (framework, autograd,
launch): an operator costs at least that, a large GEMM only its own time. (Letting
the host run ahead across a whole layer, ``max(sum GPU, ops x kernel_s)``, fitted
the A100 data worse: 7.7 % against 7.1 % held-out MAPE.) ``p2p_s`` is the host's time
for one pipeline send or receive (Megatron synchronises the device after each exchange);
the engine adds it to every boundary message on a GPU (:func:`perfsim.engine.plan.build_plan`);
``collective_s`` is the floor of one tensor-parallel collective on a GPU, as ``kernel_s`` is an
operator's (:func:`perfsim.engine.plan.tp_stage_times`).

``lm_head_eff``: the LM head's GEMMs (``Op.lm_head``) run at that share of the rate the
curve gives a GEMM of their shape. Measured kernel times put it at 1 (an H200 runs the padded
vocabulary GEMMs as fast as the blocks'); the A100 iteration times do not: the last pipeline
stage's cost per micro-batch beyond its layers grows with hidden size x vocabulary as if the head
ran at about a third of the blocks' rate (TP 1: 8.2 ms per 1024 tokens at hidden 2048, 4.1 at
1024), so the A100 fit has a share of its own (docs/validation.md, "the LM head"); which kernel
is slow there no trace has shown.

``attention="flash"``: the attention core is FlashAttention-2's one kernel (Dao 2023,
arXiv:2307.08691), its FLOPs at a fraction of peak that grows with sequence length and head
dimension (:func:`flash_time`), fitted on an H200's fused-attention kernel times.

Backward: each GEMM becomes two (input gradient and weight gradient) of the same
dimensions permuted, so twice the forward time under this curve (``g`` is
symmetric in m, n, k); memory-bound ops move twice their bytes, unless an op
states its backward (``Op.bwd_bytes``: the loss's passes, the gradient accumulations). Recomputation adds
the forward (``full``) or the attention core (``selective``, Korthikanti et al. Sec. 5)
to the backward.

The curve's parameters (:class:`Curve`) were fitted on real A100 iteration times
(``scripts/calibrate_a100.py``, half of ``../shared/data/a100-single-node``) and, for
Hopper, on measured kernel times (:func:`perfsim.engine.curve_fit.fit_curve`); a GPU
without a fitted curve uses the nearest calibrated one's fractions on its own peaks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from perfsim.errors import ConfigError
from perfsim.models.ops import Op  # noqa: F401  (the operator vocabulary; re-exported)
from perfsim.hardware import BYTES_PER_VALUE, GPU, value_precision
from perfsim.models.moe import moe_ops

#: the block GEMMs Transformer Engine runs in fp8 under ``precision="fp8"`` (its
#: ``LayerNormLinear`` QKV, ``Linear`` projection, ``LayerNormMLP``'s two; a MoE block's
#: experts through its ``GroupedLinear``, the shared expert's): the attention core, the
#: router and the LM head stay bf16
FP8_GEMMS = ("qkv", "proj", "mlp_up", "mlp_down", "expert_up", "expert_down", "shared_up", "shared_down")


@dataclass(frozen=True)
class Curve:
    """Achieved-efficiency curve of one GPU family."""

    #: best fraction of peak FLOP/s a large GEMM reaches
    eff_max: float
    #: GEMM dimension at which efficiency halves (per dimension)
    knee: float
    #: fraction of memory bandwidth that memory-bound kernels reach
    mem_eff: float
    #: host time to issue one operator (framework + launch), seconds
    kernel_s: float
    #: where the figures come from
    source: str
    #: host time of one pipeline send or receive beyond its bytes: Megatron-LM's
    #: ``p2p_communication._communicate`` waits for each exchange and synchronises the
    #: device (``torch.cuda.synchronize``), so a message costs a host round trip
    #: that the GPU cannot hide behind queued kernels
    p2p_s: float = 0.0
    #: host time to issue one tensor-parallel collective: each of Megatron-LM's per-layer
    #: all-reduces (``mpu.mappings._reduce``) is a ``torch.distributed`` call through the
    #: NCCL process group, an operator of its own for the host like any kernel, so a small
    #: one costs at least this (``max(its time on the links, collective_s)``)
    collective_s: float = 0.0
    #: share of the aligned rate a GEMM with a feature dimension that is not a multiple
    #: of 16 bytes reaches (:func:`misaligned`)
    misaligned_eff: float = 1.0
    #: share of the block GEMMs' rate the LM head's vocabulary GEMMs reach (``Op.lm_head``):
    #: 1 where kernel times were measured (an H200 runs the padded head GEMMs as fast as
    #: the blocks'); the A100 fit's is what its iteration times say (module docstring)
    lm_head_eff: float = 1.0
    #: FlashAttention-2's forward (causal: half the score matrix) as a fraction of peak at
    #: FLASH_REF (sequence 4096, head dim 128), and the sequence length / head dim at which
    #: its efficiency halves (:func:`flash_time`); 0: not fitted
    flash_eff: float = 0.0
    flash_knee_s: float = 0.0
    flash_knee_d: float = 0.0
    #: the same for its backward (2.5 x the forward's FLOPs, the scores recomputed)
    flash_bwd_eff: float = 0.0
    flash_bwd_knee_s: float = 0.0
    flash_bwd_knee_d: float = 0.0

    def __post_init__(self):
        if not (0 < self.eff_max <= 1 and 0 < self.mem_eff <= 1 and self.knee >= 0 and self.kernel_s >= 0
                and self.p2p_s >= 0 and self.collective_s >= 0 and 0 < self.misaligned_eff <= 1
                and 0 < self.lm_head_eff <= 1
                and 0 <= self.flash_eff <= 1 and 0 <= self.flash_bwd_eff <= 1
                and min(self.flash_knee_s, self.flash_knee_d, self.flash_bwd_knee_s, self.flash_bwd_knee_d) >= 0):
            raise ConfigError(f"curve {self}: eff_max, mem_eff, misaligned_eff, lm_head_eff in (0, 1], "
                              f"flash efficiencies in [0, 1], knee, kernel_s, p2p_s, collective_s, flash knees >= 0")


#: the A100 fit's host side (per operator, per pipeline message, per TP collective): the
#: framework's costs, not the GPU's, so the curves fitted on kernel times share them
_A100_HOST = dict(kernel_s=58.71e-6, p2p_s=100e-6, collective_s=58.44e-6)
#: FlashAttention-2 (PyTorch's fused SDPA, bf16) fitted on the H200's attention records
_H200_FLASH = dict(flash_eff=0.5426, flash_knee_s=544.0, flash_knee_d=104.0, flash_bwd_eff=0.4195,
                   flash_bwd_knee_s=1408.0, flash_bwd_knee_d=52.0)
#: fitted curves by GPU family; ``scripts/calibrate_a100.py`` reproduces the A100 fit
#: (bounded Nelder-Mead on every 4th row of the calibration configurations, each parameter
#: inside its range, :mod:`perfsim.engine.curve_bounds`; errors in docs/validation.md). The
#: data barely constrain the knee: at these sizes the host floor hides small GEMMs; p2p_s
#: and lm_head_eff end on their bounds -- a mechanism of Megatron-DeepSpeed's last stage
#: is still missing (docs/validation.md).
CURVES: dict[str, Curve] = {
    "ampere": Curve(eff_max=0.856, knee=0.007058, mem_eff=0.7734, lm_head_eff=0.7671,
                    source="fitted on A100 (../shared/data/a100-single-node, calibration configurations, "
                           "inside perfsim.engine.curve_bounds)", **_A100_HOST,
                    # not measured on an A100 (its data pad the vocabulary, its runs use
                    # Megatron's attention): the H200's
                    misaligned_eff=0.1924, **_H200_FLASH),
    # device side fitted to one H200's kernel times (perfsim calibrate --efficiency, bf16;
    # traces/gpu-h200.json, scripts/fit_gpu_curve.py); host side the A100 fit's
    "hopper": Curve(eff_max=0.6891, knee=16.0, mem_eff=0.5497,
                    source="fitted on H200 kernel times (traces/gpu-h200.json); host costs of the A100 fit",
                    **_A100_HOST, misaligned_eff=0.1924, **_H200_FLASH),
}
#: curves of single GPU models measured on their own (``perfsim calibrate --efficiency
#: --quick`` on one H100, ``traces/gpu/h100-efficiency-2026-11-26.json``; host side the A100
#: fit's); they win over their family's curve
GPU_CURVES: dict[str, Curve] = {
    "h100-sxm5-80gb": Curve(eff_max=0.9114, knee=352.0, mem_eff=0.7362,
                            source="fitted on H100 kernel times (traces/gpu/h100-efficiency-2026-11-26.json); "
                                   "host costs of the A100 fit",
                            **_A100_HOST, misaligned_eff=0.1887,
                            flash_eff=0.5487, flash_knee_s=576.0, flash_knee_d=96.0, flash_bwd_eff=0.3899,
                            flash_bwd_knee_s=1664.0, flash_bwd_knee_d=40.0),
}
#: the calibrated GPU each family borrows a curve from (nearest by architecture)
NEAREST = {"ampere": "ampere", "hopper": "hopper", "volta": "ampere", "ada": "ampere", "cdna3": "ampere"}
CALIBRATED_ON = {"ampere": "a100-sxm4-80gb", "hopper": "h200-sxm-141gb"}


#: profile dtype names (``perfsim calibrate --efficiency``) -> precision
_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "tf32": "tf32",
          "bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


class MeasuredRates:
    """Achieved rates a profile measured (``perfsim calibrate --efficiency`` records:
    ``gemm``, ``attention``, ``elementwise``, ``norm``, ``adamw``): a GEMM gets the
    achieved FLOP/s of the measured GEMM nearest in work (log FLOPs, then shape), a
    memory-bound op the achieved bytes/s of the nearest measured size. Measured
    rates replace the curve's (measured costs win over modelled ones)."""

    def __init__(self, profile, precision: str):
        def pts(op):
            return [(float(r["flops"]), float(r["size_bytes"]), float(r["time_s"]), str(r.get("name", "")))
                    for r in profile.select(op) if _DTYPE.get(str(r.get("dtype"))) == precision
                    and r.get("time_s", 0) > 0 and r.get("size_bytes", 0) > 0]
        bpv = BYTES_PER_VALUE[precision]
        gemm = pts("gemm")
        #: GEMMs whose feature dimensions are aligned, and those whose are not (:func:`misaligned`)
        self.misaligned = [p for p in gemm if _named_misaligned(p[3], bpv)]
        self.gemm = [p for p in gemm if not _named_misaligned(p[3], bpv)]
        self.memory = pts("elementwise") + pts("norm")
        self.ok = bool(self.gemm and self.memory)
        #: {(sequence, head dim): (forward FLOP/s, backward FLOP/s)} of the fused attention records
        self.attention = _attention_rates(pts("attention"))

    @staticmethod
    def _nearest(points, key: float, index: int):
        return min(points, key=lambda p: abs(math.log(p[index]) - math.log(max(key, 1.0))))

    def gemm_rate(self, flops: float, misaligned: bool = False, misaligned_eff: float = 1.0) -> float:
        """Achieved FLOP/s of the measured GEMM nearest in work, among those of the same
        alignment; a misaligned one without misaligned records: the aligned rate x
        ``misaligned_eff``."""
        if misaligned and self.misaligned:
            f, _, t, _ = self._nearest(self.misaligned, flops, 0)
            return f / t
        f, _, t, _ = self._nearest(self.gemm, flops, 0)
        return f / t * (misaligned_eff if misaligned else 1.0)

    def attention_rate(self, seq: int, head_dim: int, backward: bool) -> float:
        """Forward or backward FLOP/s of the measured fused attention nearest in
        (log sequence length, log head dimension)."""
        key = min(self.attention, key=lambda sd: abs(math.log(sd[0] / seq)) + abs(math.log(sd[1] / head_dim)))
        return self.attention[key][1 if backward else 0]

    def memory_rate(self, nbytes: float) -> float:
        _, b, t, _ = self._nearest(self.memory, nbytes, 1)
        return b / t


def _attention_rates(points) -> dict[tuple[int, int], tuple[float, float]]:
    """Pair ``b..h..s..d..:fwd`` and ``:fwdbwd`` records (:mod:`perfsim.calibrate.efficiency`):
    forward rate = its FLOPs / time; backward rate = 2.5 x the forward's FLOPs over
    (forward + backward time - forward time)."""
    seen: dict[tuple[int, int], dict[str, tuple[float, float]]] = {}
    for flops, _, t, name in points:
        m = re.fullmatch(r"b\d+h\d+s(\d+)d(\d+):(fwd|fwdbwd)", name)
        if m:
            seen.setdefault((int(m[1]), int(m[2])), {})[m[3]] = (flops, t)
    out = {}
    for key, kinds in seen.items():
        if "fwd" in kinds and "fwdbwd" in kinds and kinds["fwdbwd"][1] > kinds["fwd"][1]:
            f, t = kinds["fwd"]
            out[key] = (f / t, 2.5 * f / (kinds["fwdbwd"][1] - t))
    return out


def measured_rates(profile, precision: str) -> "MeasuredRates | None":
    """The profile's measured operator rates at ``precision``, or None."""
    if profile is None or not hasattr(profile, "select"):
        return None
    rates = MeasuredRates(profile, precision)
    return rates if rates.ok else None


def curve_for(gpu: GPU, host_overhead_s: float | None = None) -> tuple[Curve, str]:
    """The curve for ``gpu`` and a sentence saying where it comes from: its own
    (:data:`GPU_CURVES`), else its family's, else the nearest calibrated family's.
    ``host_overhead_s``: the user's host time per operator, replacing the curve's
    ``kernel_s`` (the framework's, not the GPU's: Megatron-LM on the A100 runs' hosts
    for every curve here)."""
    curve, source = _curve_for(gpu)
    if host_overhead_s is None:
        return curve, source
    return (replace(curve, kernel_s=host_overhead_s),
            f"{source}; host time per operator {host_overhead_s * 1e6:g} us (given)")


def _curve_for(gpu: GPU) -> tuple[Curve, str]:
    if gpu.name in GPU_CURVES:
        return GPU_CURVES[gpu.name], f"roofline x efficiency curve calibrated on {gpu.name}"
    fam = NEAREST.get(gpu.family, "ampere")
    curve = CURVES[fam]
    if gpu.name == CALIBRATED_ON[fam]:
        return curve, f"roofline x efficiency curve calibrated on {CALIBRATED_ON[fam]}"
    if fam == gpu.family:
        return curve, (f"roofline x efficiency curve calibrated on {CALIBRATED_ON[fam]} (same architecture) "
                       f"applied to {gpu.name}'s datasheet peaks")
    return curve, (f"roofline x efficiency curve of {CALIBRATED_ON[fam]} (nearest calibrated GPU) "
                   f"applied to {gpu.name}'s datasheet peaks (assumption: not calibrated on {gpu.name})")


def op_time(op: Op, gpu: GPU, precision: str, curve: Curve, bpv: int, rates: MeasuredRates | None = None
            ) -> float:
    """Seconds of one forward op (module docstring); ``rates``: a profile's measured
    operator rates, which replace the curve (the host floor ``kernel_s`` stays)."""
    if op.flash:
        return flash_time(op, gpu, precision, curve, rates)
    if rates is not None:
        if op.m:
            return max(op.flops / rates.gemm_rate(op.flops, misaligned(op, bpv), curve.misaligned_eff),
                       curve.kernel_s)
        return max(op.bytes / rates.memory_rate(op.bytes), curve.kernel_s)
    bw = gpu.memory_bandwidth_Bps * curve.mem_eff
    if op.m:
        g = (curve.misaligned_eff if misaligned(op, bpv) else 1.0) * (curve.lm_head_eff if op.lm_head else 1.0)
        for x in (op.m * op.batch, op.n, op.k):
            g *= x / (x + curve.knee)
        gemm = precision if op.name in FP8_GEMMS else value_precision(precision)
        compute = op.flops / (gpu.peak(gemm) * curve.eff_max * g)
        moved = (op.m * op.k + op.k * op.n + op.m * op.n) * op.batch * bpv
        return max(compute, moved / bw, curve.kernel_s)
    return max(op.bytes / bw, curve.kernel_s)


#: the (sequence length, head dimension) at which a curve's flash efficiencies are stated
FLASH_REF = (4096, 128)


def flash_time(op: Op, gpu: GPU, precision: str, curve: Curve, rates: MeasuredRates | None = None,
               backward: bool = False) -> float:
    """Seconds of FlashAttention-2's forward (or ``backward``: 2.5 x the forward's FLOPs,
    the scores recomputed; Dao 2023, arXiv:2307.08691, Sec. 3) over ``op``: its FLOPs at
    the rate of a profile's nearest measured ``attention`` record (sequence length, head
    dimension) when ``rates`` has them, else at ``peak x eff x f(s) f(d) / f(FLASH_REF)``
    with ``f(x) = x / (x + knee)`` (longer sequences and wider heads keep the tensor cores
    busier between the kernel's softmax steps); at least ``kernel_s``."""
    flops = op.flops * (2.5 if backward else 1.0)
    if rates is not None and rates.attention:
        return max(flops / rates.attention_rate(op.m, op.k, backward), curve.kernel_s)
    eff, ks, kd = ((curve.flash_bwd_eff, curve.flash_bwd_knee_s, curve.flash_bwd_knee_d) if backward
                   else (curve.flash_eff, curve.flash_knee_s, curve.flash_knee_d))
    if not eff:
        raise ConfigError(f"attention=flash: the efficiency curve ({curve.source}) has no flash-attention fit")
    s0, d0 = FLASH_REF
    shape = (op.m / (op.m + ks)) * (op.k / (op.k + kd)) / ((s0 / (s0 + ks)) * (d0 / (d0 + kd)))
    return max(flops / (gpu.peak(value_precision(precision)) * eff * shape), curve.kernel_s)


def gemm_dims(name: str) -> tuple[int, int, int] | None:
    """``(m, n, k)`` of an efficiency record named ``MxNxK``, or None."""
    try:
        m, n, k = (int(v) for v in name.split("x"))
    except ValueError:
        return None
    return m, n, k


def _named_misaligned(name: str, bpv: int) -> bool:
    """:func:`misaligned` of an efficiency record named ``MxNxK``."""
    dims = gemm_dims(name)
    return dims is not None and misaligned(Op("gemm", *dims), bpv)


def misaligned(op: Op, bpv: int) -> bool:
    """Whether a GEMM's feature dimension (``n`` or ``k``) is not a multiple of 16 bytes;
    the token dimension ``m`` never is a leading dimension of the layer's GEMMs."""
    a = max(1, 16 // bpv)
    return bool(op.m) and (op.n % a != 0 or op.k % a != 0)


def batch_per_block(sk: int) -> int:
    """Rows of scores one thread block of Megatron's fused softmax handles: 128 threads,
    warps of ``min(32, 2^ceil(log2 sk))`` lanes, 2 rows per warp up to 128 keys, else 1
    (Megatron-LM csrc/megatron/scaled_upper_triang_masked_softmax.h, ``get_batch_per_block``)."""
    pow2 = 1 << max(0, (sk - 1).bit_length())
    return (128 // min(32, pow2)) * (2 if pow2 <= 128 else 1)


def fused_softmax_available(b: int, heads: int, sq: int, sk: int, half: bool, causal: bool = True) -> bool:
    """Whether Megatron's fused scale-mask-softmax kernel runs (Megatron-LM
    megatron/model/fused_softmax.py, ``FusedScaleMaskSoftmax.is_kernel_available``):
    fp16/bf16 input, ``16 < sk <= 4096``, ``sq`` and ``sk`` divisible by 4, and
    ``b x heads`` (heads on this rank) divisible by 4 and, causal, by the kernel's
    rows per block -- e.g. not for one sequence with 2 heads per rank (TP 8 of 16 heads)."""
    n = b * heads
    if not (half and 16 < sk <= 4096 and sq % 4 == 0 and sk % 4 == 0 and n % 4 == 0):
        return False
    return (n if causal else sq) % batch_per_block(sk) == 0


def softmax_ops(b: int, heads: int, s: int, bpv: int, n: int, causal: bool = True) -> list[Op]:
    """The attention softmax on ``n`` scores: Megatron's fused kernel (read and write
    the scores) where it is available, else its PyTorch path
    (``forward_torch_softmax``: cast to fp32, scale, masked fill, softmax, cast back),
    five kernels instead of one for half-precision input; then dropout (+1 byte mask)."""
    if fused_softmax_available(b, heads, s, s, bpv == 2, causal):
        ops = [Op("softmax", bytes=2 * bpv * n, attention_core=True)]
    else:
        ops = [Op("softmax_scale", bytes=8 * n, attention_core=True),
               Op("softmax_mask", bytes=9 * n, attention_core=True),
               Op("softmax", bytes=8 * n, attention_core=True)]
        if bpv == 2:  # softmax_in_fp32 (Megatron's default)
            ops = ([Op("softmax_to_fp32", bytes=6 * n, attention_core=True)] + ops
                   + [Op("softmax_to_half", bytes=6 * n, attention_core=True)])
    return ops + [Op("attn_dropout", bytes=(2 * bpv + 1) * n, attention_core=True)]


def block_ops(spec, mb: int, tp: int, sp: bool, bpv: int, attention: str = "megatron",
              moe: bool | None = None, routing=None) -> list[Op]:
    """Forward ops of one transformer block on one tensor-parallel rank; ``attention="flash"``:
    the attention core (scores, softmax, dropout, weighted sum) is FlashAttention-2's one
    kernel (:func:`flash_time`). ``moe``: a block with routed experts (default: whether the
    model has any), whose MLP is :func:`perfsim.models.moe.moe_ops` (``routing``: a
    :class:`perfsim.models.moe.Routing`); a block of one norm (``norms_per_block`` 1) has no second norm."""
    s, b, h, f = spec.seq_len, mb, spec.hidden, spec.ffn
    tok = b * s
    tok_sp = tok // tp if sp else tok  # norms/dropouts under sequence parallelism
    heads = max(1, spec.heads // tp)
    q = spec.q_dim
    qkv = (q + 2 * spec.kv_dim) // tp if spec.kv_heads >= tp else q // tp + 2 * spec.head_dim
    dh = spec.head_dim
    attn_scores = b * heads * s * s
    act = bpv * tok_sp * h
    ops = [
        Op("norm1", bytes=2 * act),
        Op("qkv", m=tok, n=qkv, k=h),
        *([Op("flash_attention", m=s, n=s, k=dh, batch=b * heads, attention_core=True, flash=True,
              causal=not spec.encoder)] if attention == "flash" else
          [Op("scores", m=s, n=s, k=dh, batch=b * heads, attention_core=True),
           *softmax_ops(b, heads, s, bpv, attn_scores, causal=not spec.encoder),
           Op("attn_v", m=s, n=dh, k=s, batch=b * heads, attention_core=True)]),
        Op("proj", m=tok, n=h, k=q // tp),
        Op("dropout_residual1", bytes=3 * act + tok_sp * h),
        *([Op("norm2", bytes=2 * act)] if spec.norms_per_block == 2 else []),
    ]
    if spec.moe if moe is None else moe:
        ops += moe_ops(spec, tok, tp, bpv, routing)
    else:
        ops += [Op("mlp_up", m=tok, n=(2 if spec.gated else 1) * f // tp, k=h),
                Op("activation", bytes=bpv * tok * f // tp * (3 if spec.gated else 2)),
                Op("mlp_down", m=tok, n=h, k=f // tp)]
    return ops + [Op("dropout_residual2", bytes=3 * act + tok_sp * h)]


def embedding_grad_ops(spec, tp: int, bpv: int) -> list[Op]:
    """Backward-only: the word embedding's gradient is a dense ``vocab/t x h`` tensor
    (PyTorch's embedding backward zero-fills it, then scatters the tokens' rows) that
    Megatron's data-parallel wrapper adds into the fp32 ``main_grad`` after every
    micro-batch (Megatron-LM megatron/model/distributed.py, ``param.main_grad.add_``;
    the transformer GEMMs accumulate in place, gradient accumulation fusion):
    write ``bpv``, then read it and read and write 4 bytes per element."""
    n = -(-spec.vocab // tp) * spec.hidden
    return [Op("embed_grad_zero", bwd_bytes=bpv * n), Op("embed_grad_accumulate", bwd_bytes=(bpv + 8) * n)]


def embed_ops(spec, mb: int, tp: int, sp: bool, bpv: int) -> list[Op]:
    tok = mb * spec.seq_len
    # vocab-parallel gather (each rank its rows) + position add, writes (b, s, h)
    return [Op("embed_gather", bytes=2 * bpv * tok * spec.hidden),
            Op("embed_add_dropout", bytes=(3 * bpv + 1) * tok * spec.hidden),
            *embedding_grad_ops(spec, tp, bpv)]


def cross_entropy_ops(tok: int, v: int, bpv: int) -> list[Op]:
    """Megatron's vocab-parallel cross entropy on ``tok x v`` logits of this rank
    (Megatron-LM megatron/mpu/cross_entropy.py, ``_VocabParallelCrossEntropy``, called on
    ``logits.float()``): forward = cast to fp32, max, subtract, exp, sum, divide (the
    softmax kept for the backward), each a pass over the fp32 logits; backward = scale
    the kept softmax by the incoming gradient in place, then cast it back to ``bpv``
    (no casts when the logits are fp32 already)."""
    n = tok * v
    cast = [Op("loss_to_fp32", bytes=(bpv + 4) * n, bwd_bytes=(4 + bpv) * n)] if bpv < 4 else []
    return cast + [
            Op("loss_max", bytes=4 * n, bwd_bytes=0.0),
            Op("loss_sub_max", bytes=8 * n, bwd_bytes=0.0),
            Op("loss_exp", bytes=8 * n, bwd_bytes=0.0),
            Op("loss_sum", bytes=4 * n, bwd_bytes=0.0),
            Op("loss_softmax", bytes=8 * n, bwd_bytes=8 * n)]


def head_ops(spec, mb: int, tp: int, sp: bool, bpv: int) -> list[Op]:
    tok, h = mb * spec.seq_len, spec.hidden
    if spec.encoder:  # pooler on the first token
        return [Op("final_norm", bytes=2 * bpv * tok * h), Op("pooler", m=mb, n=h, k=h)]
    v = -(-spec.vocab // tp)
    ops = [Op("final_norm", bytes=2 * bpv * tok * h // (tp if sp else 1)),
           Op("lm_head", m=tok, n=v, k=h, lm_head=True),
           *cross_entropy_ops(tok, v, bpv)]
    if spec.tied:  # the LM head's weight gradient is the (last stage's copy of the) embedding's
        ops.append(Op("lm_head_grad_accumulate", bwd_bytes=(bpv + 8) * v * h))
    return ops


def transformer_times(spec, gpu: GPU, precision: str, mb: int, tp: int, sp: bool, recompute: str,
                      curve: Curve, rates: MeasuredRates | None = None, attention: str = "megatron",
                      routing=None) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of every layer (``embed``, blocks, ``head``)
    for one micro-batch on one tensor-parallel rank (collectives not included);
    ``attention``: ``megatron`` or ``flash`` kernels; a MoE model's dense and expert
    blocks each their own ops (:func:`block_ops`)."""
    bpv = BYTES_PER_VALUE[precision]

    def fwd_bwd(ops, recomputable: bool):
        t = [op_time(op, gpu, precision, curve, bpv, rates) if op.m or op.bytes else 0.0 for op in ops]
        fwd = sum(t)
        # two GEMMs per GEMM, twice the bytes, twice the operators -- unless the op says
        bwd = sum(flash_time(op, gpu, precision, curve, rates, backward=True) if op.flash else
                  2 * x if op.bwd_bytes is None else
                  op_time(Op(op.name, bytes=op.bwd_bytes), gpu, precision, curve, bpv, rates)
                  if op.bwd_bytes else 0.0 for op, x in zip(ops, t))
        if recomputable and recompute == "full":
            bwd += fwd
        elif recomputable and recompute == "selective":
            bwd += sum(x for op, x in zip(ops, t) if op.attention_core)
        return fwd, bwd

    e = fwd_bwd(embed_ops(spec, mb, tp, sp, bpv), False)
    kinds = {m: fwd_bwd(block_ops(spec, mb, tp, sp, bpv, attention, m, routing), True)
             for m in {spec.is_moe_block(i) for i in range(spec.n_layer)}}
    blk = [kinds[spec.is_moe_block(i)] for i in range(spec.n_layer)]
    hd = fwd_bwd(head_ops(spec, mb, tp, sp, bpv), False)
    fwd = [e[0]] + [x[0] for x in blk] + [hd[0]]
    bwd = [e[1]] + [x[1] for x in blk] + [hd[1]]
    return fwd, bwd


def layer_bytes(spec, name: str, mb: int, bpv: int) -> float:
    """Bytes the forward of layer ``name`` (``embed``, ``block*``, ``head``) moves on one
    rank without tensor parallelism: memory-bound ops plus GEMM operands."""
    ops = (embed_ops if name == "embed" else head_ops if name == "head" else block_ops)(spec, mb, 1, False, bpv)
    return sum(op.bytes + (op.m * op.k + op.k * op.n + op.m * op.n) * op.batch * bpv for op in ops)


def generic_times(layers, gpu: GPU, precision: str, mb: int, curve: Curve) -> tuple[list[float], list[float]]:
    """Layers known only by FLOPs and sizes (MLPs, CNNs): FLOPs at the curve's best
    efficiency, bounded below by moving weights and activations; backward 2x."""
    bpv = BYTES_PER_VALUE[precision]
    fwd = []
    for layer in layers:
        numel = 1
        for d in layer.out_shape:
            numel *= d
        moved = bpv * (layer.params + 2 * numel * mb)
        t = max(layer.flops_fwd * mb / (gpu.peak(value_precision(precision)) * curve.eff_max),
                moved / (gpu.memory_bandwidth_Bps * curve.mem_eff), curve.kernel_s)
        fwd.append(t)
    return fwd, [2 * t for t in fwd]


#: bytes an Adam step moves per parameter: fp32 (read p, g, m, v; write p, m, v) = 28;
#: mixed precision adds the half-precision gradient read and weight copy written
#: and the unscale / gradient-norm passes (Micikevicius et al. 2018, arXiv:1710.03740)
ADAM_BYTES = {"fp32": 28, "tf32": 28, "bf16": 36, "fp16": 36, "fp8": 36}


def optimizer_time(params: int, gpu: GPU, precision: str, curve: Curve) -> float:
    """Adam step of ``params`` parameters, memory-bound."""
    return ADAM_BYTES[precision] * params / (gpu.memory_bandwidth_Bps * curve.mem_eff) + 4 * curve.kernel_s


def tp_measured_split(spec, mb: int, tp: int, sp: bool, embed_fwd_s: float, block_fwd_s: float
                      ) -> tuple[float, float, float]:
    """(factor, memory B/s, GEMM FLOP/s): the factor that turns a block's measured
    single-rank time into one tensor-parallel rank's, for a profile without a GPU
    preset (a CPU profile). Each forward op of :func:`block_ops` costs
    ``flops / gemm_rate + bytes / memory_rate``; the factor is the ratio of that sum
    at ``tp`` to the sum at 1, so what Megatron shards (the GEMMs and the attention
    core, 1/t: Shoeybi et al. 2019, arXiv:1909.08053, Sec. 3) shrinks and what it
    replicates (norms, dropouts, residual adds; split too under sequence
    parallelism, Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4.2.2) does not.

    Both rates come from the profile's own single-rank records, none from a TP
    measurement: the memory rate from the embedding layer (only memory-bound ops,
    :func:`embed_ops`), the GEMM rate from what remains of the block's time after
    its memory-bound ops. The backward uses the same factor (every op's backward
    is twice its forward in this model)."""
    bpv = BYTES_PER_VALUE["fp32"]
    mem_rate = sum(op.bytes for op in embed_ops(spec, mb, 1, False, bpv)) / embed_fwd_s
    full = block_ops(spec, mb, 1, False, bpv)
    mem_s = sum(op.bytes for op in full) / mem_rate
    if block_fwd_s <= mem_s:
        raise ConfigError(f"profile: block forward {block_fwd_s:.3g} s is not more than its memory-bound "
                          f"ops at the embedding's measured rate ({mem_s:.3g} s); give --gpu")
    gemm_rate = sum(op.flops for op in full) / (block_fwd_s - mem_s)

    def cost(ops):
        return sum(op.flops / gemm_rate + op.bytes / mem_rate for op in ops)

    return cost(block_ops(spec, mb, tp, sp, bpv)) / block_fwd_s, mem_rate, gemm_rate
