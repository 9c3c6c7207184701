"""Compute model per operator: roofline with an achieved-efficiency curve.

The operators of a layer are listed by the models (:mod:`perfsim.models.ops`:
:func:`~perfsim.models.ops.block_ops`, ``embed_ops``, ``head_ops``; a MoE block's by
:mod:`perfsim.models.moe`); this module prices them with the GPU's curve
(:class:`perfsim.hardware.Curve`, held by each :class:`perfsim.hardware.GPU` preset).

Time of one op (roofline, Williams et al. 2009, CACM 52(4), with achieved rates):

* GEMM ``(m, n, k)``: ``max(2mnk / (peak * eff), bytes / (bw * mem_eff), kernel_s)`` with
  ``eff = eff_max * g(m) g(n) g(k)``, ``g(x) = x / (x + knee)`` -- small dimensions
  leave tensor cores idle (tile quantisation and occupancy) -- times ``misaligned_eff``
  when a feature dimension (``n`` or ``k``: a leading dimension of the layer's weight,
  output or output gradient in all three of its GEMMs) is not a multiple of 16 bytes
  (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background":
  tensor cores want 16-byte-aligned leading dimensions; e.g. an unpadded vocabulary);
  With the curve's ``gemm_quantization="waves"`` the compute term is the GEMM's output tiles
  run in waves over the GPU's SMs (:func:`perfsim.engine.gemm_waves.quantized_seconds`: tile and
  wave quantization, the k loop's prologue and epilogue, the least-time tile of cuBLAS's set;
  same guide) divided by ``g`` and the two shares, and a backward prices its two GEMMs'
  own shapes (:func:`gemm_backward_time`);
* memory-bound op: ``max(bytes / (bw * mem_eff), kernel_s)``;
* a GEMM-like kernel of too few thread blocks to fill the GPU (``Op.ctas``, a recurrence's: a Gated
  DeltaNet's state pass) runs at ``min(1, ctas / SMs)`` of the rate (:func:`occupancy`).

``kernel_s`` is the host's time to issue one operator (framework, autograd,
launch): an operator costs at least that, a large GEMM only its own time. (Letting
the host run ahead across a whole layer, ``max(sum GPU, ops x kernel_s)``: the curve's
``host_issue="queue"``, :func:`queued`; refitted, it fits the A100 validation configurations
worse, 6.32 against 5.21 % MAPE, docs/validation.md.) ``p2p_s`` is the host's time
for one pipeline send or receive (Megatron synchronises the device after each exchange);
the engine adds it to every boundary message on a GPU (:func:`perfsim.engine.plan.build_plan`);
``collective_s`` is the floor of one tensor-parallel collective on a GPU, as ``kernel_s`` is an
operator's (:func:`perfsim.engine.group_times.tp_stage_times`).

``lm_head_eff``: the LM head's GEMMs (``Op.lm_head``) run at that share of the rate the
curve gives a GEMM of their shape (why the A100 fit's is below 1:
:data:`perfsim.hardware.A100_CURVE`).

``attention="flash"``: the attention core is FlashAttention-2's one kernel (Dao 2023,
arXiv:2307.08691), its FLOPs at a fraction of peak that grows with sequence length and head
dimension (:func:`flash_time`), fitted on an H200's fused-attention kernel times.

Backward: each GEMM becomes two (input gradient and weight gradient) of the same
dimensions permuted, so twice the forward time under this curve (``g`` is
symmetric in m, n, k; under ``waves`` each priced as it tiles); memory-bound ops move twice their bytes, unless an op
states its backward (``Op.bwd_bytes``: the loss's passes, the gradient accumulations). Recomputation adds
the forward (``full``) or the attention core (``selective``, Korthikanti et al. Sec. 5)
to the backward.

The curve's parameters (:class:`perfsim.hardware.Curve`) were fitted on real A100 iteration
times (``scripts/calibrate_a100.py``, half of ``../shared/data/a100-single-node``) and, for
Hopper, on measured kernel times (:func:`perfsim.engine.curve_fit.fit_curve`); a GPU
without a fitted curve uses the nearest calibrated one's fractions on its own peaks
(:func:`perfsim.hardware.curve_for`).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from perfsim.engine.gemm_waves import quantized_seconds
from perfsim.errors import ConfigError
from perfsim.hardware import BYTES_PER_VALUE, FLASH_REF, GPU, Curve, value_precision
from perfsim.job import OPTIMIZERS
from perfsim.models.eager import check_eager, eager_block_ops, eager_head_ops
from perfsim.models.moe import moe_ops
from perfsim.models.ops import (FP8_CASTS, FP8_GEMMS, GradAccumulation, Op, block_grad_ops, block_ops, embed_ops, head_ops,
                                mtp_ops)

#: profile dtype names (``perfsim calibrate --efficiency``) -> precision
PROFILE_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "tf32": "tf32",
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
                    for r in profile.select(op) if PROFILE_DTYPES.get(str(r.get("dtype"))) == precision
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


def op_time(op: Op, gpu: GPU, precision: str, curve: Curve, bpv: int, rates: MeasuredRates | None = None
            ) -> float:
    """Seconds of one forward op (module docstring); ``rates``: a profile's measured
    operator rates, which replace the curve (the host floor ``kernel_s`` stays)."""
    if op.flash:
        return flash_time(op, gpu, precision, curve, rates)
    if rates is not None:
        if op.m:
            return max(op.flops / rates.gemm_rate(op.flops, misaligned(op, bpv), curve.misaligned_eff)
                       / occupancy(op, gpu), curve.kernel_s)
        return max(op.bytes / rates.memory_rate(op.bytes), curve.kernel_s)
    bw = gpu.memory_bandwidth_Bps * curve.mem_eff
    if op.m:
        return _gemm_time(op, (op.m, op.n, op.k), gpu, precision, curve, bpv)
    return max(op.bytes / bw, curve.kernel_s)


def _gemm_time(op: Op, dims: tuple[int, int, int], gpu: GPU, precision: str, curve: Curve, bpv: int) -> float:
    """Seconds of GEMM ``op`` run as ``dims`` (its own ``(m, n, k)``, or a backward GEMM's
    permutation: :func:`gemm_backward_time`); the smooth factor ``g``, the alignment and the
    LM head's share are the op's, whichever GEMM of its three runs."""
    g = (curve.misaligned_eff if misaligned(op, bpv) else 1.0) * (curve.lm_head_eff if op.lm_head else 1.0)
    for x in (op.m * op.batch, op.n, op.k):
        g *= x / (x + curve.knee)
    gemm = precision if op.name in FP8_GEMMS else value_precision(precision)
    rate = gpu.peak(gemm) * curve.eff_max
    if curve.gemm_quantization == "waves":
        compute = quantized_seconds(*dims, op.batch, gpu, rate, bpv) / g
    else:
        compute = op.flops / (rate * g)
    compute /= occupancy(op, gpu)
    moved = (op.m * op.k + op.k * op.n + op.m * op.n) * op.batch * bpv
    return max(compute, moved / (gpu.memory_bandwidth_Bps * curve.mem_eff), curve.kernel_s)


def occupancy(op: Op, gpu: GPU) -> float:
    """The share of the GPU's SMs a kernel of ``op.ctas`` thread blocks keeps busy (at most one
    block an SM: a recurrence's blocks each walk their chunks in order); 1 where the op does not
    say, or the GPU preset gives no SM count."""
    if not op.ctas or not gpu.sms:
        return 1.0
    return min(1.0, op.ctas / gpu.sms)


def gemm_backward_time(op: Op, gpu: GPU, precision: str, curve: Curve, bpv: int) -> float:
    """Seconds of a GEMM op's backward, its two GEMMs: for ``C[m, n] = A[m, k] B[k, n]`` the
    input gradient ``dA = dC B^T`` (``m x k``, inner ``n``) and the weight gradient ``dB = A^T dC``
    (``k x n``, inner ``m``). Under ``gemm_quantization="off"`` both cost the forward's time
    (``g`` is symmetric); under ``waves`` each has its own tiles and waves."""
    return sum(_gemm_time(op, dims, gpu, precision, curve, bpv) for dims in ((op.m, op.k, op.n), (op.k, op.n, op.m)))


def flash_time(op: Op, gpu: GPU, precision: str, curve: Curve, rates: MeasuredRates | None = None,
               backward: bool = False) -> float:
    """Seconds of FlashAttention-2's forward (or ``backward``: 2.5 x the forward's FLOPs,
    the scores recomputed; Dao 2023, arXiv:2307.08691, Sec. 3) over ``op``: its FLOPs at
    the rate of a profile's nearest measured ``attention`` record (sequence length, head
    dimension) when ``rates`` has them, else at ``peak x eff x f(s) f(d) / f(FLASH_REF)``
    with ``f(x) = x / (x + knee)`` (longer sequences and wider heads keep the tensor cores
    busier between the kernel's softmax steps); at least ``kernel_s``. With MLA's narrower value
    heads (``op.v_dim``) the head dimension the rate is read at is the mean of the two widths; with a
    sliding window (``op.window``) or chunks (``op.chunk``) the sequence length it is read at is the
    window or chunk, the keys each query's inner loop runs over at most."""
    flops = op.flops * (2.5 if backward else 1.0)
    d = (op.k + op.head_v) / 2
    s = min(op.m, op.window or op.chunk) if op.window or op.chunk else op.m
    if rates is not None and rates.attention:
        return max(flops / rates.attention_rate(s, d, backward), curve.kernel_s)
    eff, ks, kd = ((curve.flash_bwd_eff, curve.flash_bwd_knee_s, curve.flash_bwd_knee_d) if backward
                   else (curve.flash_eff, curve.flash_knee_s, curve.flash_knee_d))
    if not eff:
        raise ConfigError(f"attention=flash: the efficiency curve ({curve.source}) has no flash-attention fit")
    s0, d0 = FLASH_REF
    shape = (s / (s + ks)) * (d / (d + kd)) / ((s0 / (s0 + ks)) * (d0 / (d0 + kd)))
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


def transformer_times(spec, gpu: GPU, precision: str, mb: int, tp: int, sp: bool, recompute: str,
                      curve: Curve, rates: MeasuredRates | None = None, attention: str = "megatron",
                      routing=None, kernels: str = "fused", grad_acc: GradAccumulation | None = None,
                      fp8_casts: str = "te") -> tuple[list[float], list[float]]:
    """Forward and backward seconds of every layer (``embed``, blocks, multi-token prediction modules, ``head``)
    for one micro-batch on one tensor-parallel rank (collectives not included);
    ``attention``: ``megatron`` or ``flash`` kernels; a MoE model's dense and expert
    blocks each their own ops (:func:`block_ops`); ``kernels="eager"`` / ``"eager-pure"``: each
    block and the head (final norm, LM head, loss; the embedding stays :func:`embed_ops`) as the
    kernels eager PyTorch launches under autocast / with half-precision weights
    (:func:`perfsim.models.eager.eager_block_ops`, ``eager_head_ops``; each at least ``kernel_s``:
    the host issues every one). ``grad_acc``: how the micro-batches accumulate their weight
    gradients (:class:`perfsim.models.ops.GradAccumulation`; None: gradient accumulation fusion),
    backward-only bytes of every layer (:func:`perfsim.models.ops.block_grad_ops`,
    ``embed_ops``, ``head_ops``). ``fp8_casts`` (:data:`FP8_CASTS`), under ``precision="fp8"``:
    ``te`` prices Transformer Engine's quantisation kernels around the fp8 GEMMs
    (:func:`perfsim.models.ops.fp8_cast_ops`), ``none`` leaves them out."""
    if fp8_casts not in FP8_CASTS:
        raise ConfigError(f"fp8_casts={fp8_casts!r}: choose from {', '.join(FP8_CASTS)}")
    bpv = BYTES_PER_VALUE[precision]
    eager = kernels.startswith("eager")
    if eager:
        check_eager(spec, precision, kernels)

    # tiles and waves are not symmetric in (m, n, k): the backward's GEMMs priced as they run
    permuted = curve.gemm_quantization == "waves" and rates is None

    queue = curve.host_issue == "queue"
    # under the launch queue each op's GPU time alone; the host's share is the layer's (queued)
    priced = replace(curve, kernel_s=0.0) if queue else curve

    def fwd_bwd(ops, recomputable: bool):
        f, b = ops_fwd_bwd(ops, recompute if recomputable else "none", gpu, precision, priced, rates, permuted)
        if not queue:
            return f, b
        nf, nb = kernel_counts(ops, recompute if recomputable else "none")
        return queued(f, nf, curve.kernel_s), queued(b, nb, curve.kernel_s)

    e = fwd_bwd(embed_ops(spec, mb, tp, sp, bpv, grad_acc), False)
    kind = spec.block_kind  # what a block's time depends on: its experts, attention span and q/k norm
    first = {}  # a block of each kind: its parameters on this rank
    for i in range(spec.n_layer):
        first.setdefault(kind(i), i)
    ep = routing.ep if routing is not None else 1
    kinds = {k: fwd_bwd((eager_block_ops(spec, mb, tp, sp, bpv, attention, kernels == "eager") if eager else
                         block_ops(spec, mb, tp, sp, bpv, attention, k[0], routing,
                                   fp8_casts=precision == "fp8" and fp8_casts == "te", block=i))
                        + block_grad_ops(spec, tp, bpv, grad_acc, i, ep), True)
             for k, i in first.items()}
    blk = [kinds[kind(i)] for i in range(spec.n_layer)]
    if spec.mtp_layers:  # a multi-token prediction module: a block of its kind, its projection and head pass
        i = spec.n_layer
        own = fwd_bwd(block_ops(spec, mb, tp, sp, bpv, attention, spec.is_moe_block(i), routing,
                                fp8_casts=precision == "fp8" and fp8_casts == "te", block=i)
                      + block_grad_ops(spec, tp, bpv, grad_acc, i, ep), True)
        extra = fwd_bwd(mtp_ops(spec, mb, tp, sp, bpv, grad_acc), False)
        blk += [(own[0] + extra[0], own[1] + extra[1])] * spec.mtp_layers
    hd = fwd_bwd(eager_head_ops(spec, mb, tp, sp, bpv, kernels == "eager") if eager else
                 head_ops(spec, mb, tp, sp, bpv, grad_acc), False)
    fwd = [e[0]] + [x[0] for x in blk] + [hd[0]]
    bwd = [e[1]] + [x[1] for x in blk] + [hd[1]]
    return fwd, bwd


def ops_fwd_bwd(ops, recompute: str, gpu: GPU, precision: str, curve: Curve, rates: MeasuredRates | None = None,
                permuted: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds of ``ops`` on their GPU time alone: each op's :func:`op_time`;
    its backward two GEMMs per GEMM (``permuted``: as they run, :func:`gemm_backward_time`),
    FlashAttention's own, the bytes the op states, else twice the forward; the recomputed forward
    under ``recompute`` (``full``: all of it, ``selective``: the attention core) and of every op that
    recomputes itself (``Op.bwd_recompute``: a Gated DeltaNet's or Mamba-2's chunk kernels)."""
    bpv = BYTES_PER_VALUE[precision]
    t = [op_time(op, gpu, precision, curve, bpv, rates) if op.m or op.bytes else 0.0 for op in ops]
    fwd = sum(t)
    # two GEMMs per GEMM, twice the bytes, twice the operators -- unless the op says
    bwd = sum(flash_time(op, gpu, precision, curve, rates, backward=True) if op.flash else
              gemm_backward_time(op, gpu, precision, curve, bpv) if permuted and op.m and op.bwd_bytes is None
              else 2 * x if op.bwd_bytes is None else
              op_time(Op(op.name, bytes=op.bwd_bytes), gpu, precision, curve, bpv, rates)
              if op.bwd_bytes else 0.0 for op, x in zip(ops, t))
    if recompute == "full":
        bwd += fwd
    else:
        bwd += sum(x for op, x in zip(ops, t) if op.bwd_recompute or (recompute == "selective" and op.attention_core))
    return fwd, bwd


def moe_mlp_share(spec, gpu: GPU, precision: str, mb: int, tp: int, sp: bool, recompute: str, curve: Curve,
                  attention: str = "megatron", routing=None, fp8_casts: str = "te", block: int | None = None
                  ) -> tuple[float, float]:
    """(forward, backward) share of a MoE block's GPU time that its MLP half takes -- the router,
    the permutations, the experts and the shared expert (:func:`perfsim.models.moe.moe_ops`), the
    rest being the attention half -- priced on ``curve`` as :func:`transformer_times` prices the
    block (:mod:`perfsim.engine.ep_overlap` splits a block's time by it); ``block``: the block whose
    mixer it is (None: a full-attention block)."""
    bpv = BYTES_PER_VALUE[precision]
    permuted = curve.gemm_quantization == "waves"
    ops = block_ops(spec, mb, tp, sp, bpv, attention, True, routing,
                    fp8_casts=precision == "fp8" and fp8_casts == "te", block=block)
    mlp = moe_ops(spec, mb * spec.seq_len, tp, bpv, routing)
    bf, bb = ops_fwd_bwd(ops, recompute, gpu, precision, curve, None, permuted)
    mf, mbwd = ops_fwd_bwd(mlp, recompute, gpu, precision, curve, None, permuted)
    return (mf / bf if bf else 0.0), (mbwd / bb if bb else 0.0)


def kernel_counts(ops, recompute: str = "none") -> tuple[int, int]:
    """(forward, backward) kernels the host issues for ``ops``: one per forward op with work; its
    backward two (a GEMM's input and weight gradients; a memory-bound op's two passes, as
    :func:`transformer_times` prices them), one where the op states its backward bytes or is
    FlashAttention's, none for stated zero bytes; the recomputed forward's again under
    ``recompute``, and an op's that recomputes itself (``Op.bwd_recompute``)."""
    live = [op for op in ops if op.m or op.bytes]
    fwd = len(live)
    bwd = sum(1 if op.flash or op.bwd_bytes else 0 if op.bwd_bytes is not None else 2 for op in live)
    if recompute == "full":
        bwd += fwd
    else:
        bwd += sum(1 for op in live if op.bwd_recompute or (recompute == "selective" and op.attention_core))
    return fwd, bwd


def queued(gpu_s: float, kernels: int, kernel_s: float) -> float:
    """Seconds of a layer whose ``kernels`` the host issues ``kernel_s`` apart while the GPU runs
    them (``gpu_s`` in all): CUDA kernel launches are asynchronous, so the host runs ahead of the
    GPU and a layer costs the longer of the two, ``max(gpu_s, kernels x kernel_s)`` -- the launch
    queue's steady state over a stage's identical layers (a layer's own first-kernel fill, at most
    one ``kernel_s`` or one kernel, is not charged). NVIDIA CUDA C++ Programming Guide,
    "Asynchronous Concurrent Execution": kernel launches return to the host before the device
    completes the task."""
    return max(gpu_s, kernels * kernel_s)


def layer_bytes(spec, name: str, mb: int, bpv: int) -> float:
    """Bytes the forward of layer ``name`` (``embed``, ``block*``, ``head``) moves on one
    rank without tensor parallelism: memory-bound ops plus GEMM operands."""
    ops = (embed_ops if name == "embed" else head_ops if name == "head" else block_ops)(spec, mb, 1, False, bpv)
    if name.startswith("mtp"):  # a multi-token prediction module: its block, projection and head pass
        ops += mtp_ops(spec, mb, 1, False, bpv)
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


def optimizer_time(params: int, gpu: GPU, precision: str, curve: Curve, optimizer: str = "adamw",
                   step: str = "fused") -> float:
    """Step of ``optimizer`` (:data:`perfsim.job.OPTIMIZERS`) over ``params`` parameters,
    memory-bound: its bytes per parameter (:meth:`perfsim.job.Optimizer.step_bytes`, counted as
    ``step`` says: fused, Adam 28 in fp32 and 36 mixed, SGD with momentum 20 and 28; megatron,
    Megatron-LM's passes) at the rate the curve's optimizer streams (``Curve.optimizer_eff``,
    else its ``mem_eff``)."""
    moved = OPTIMIZERS[optimizer].step_bytes(precision, step)
    return moved * params / (gpu.memory_bandwidth_Bps * (curve.optimizer_eff or curve.mem_eff)) + 4 * curve.kernel_s


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
