"""Achieved rates of the operator classes a compute model needs (roofline efficiency).

A roofline model (Williams, Waterman & Patterson, "Roofline: an insightful visual
performance model", CACM 2009) prices an operator at ``max(flops / peak_flops,
bytes / peak_bandwidth)``; real kernels reach only a fraction of either peak, and the
fraction depends on the shape (small GEMMs cannot fill the device, wave quantization,
tile tails). This module measures that fraction on the machine it runs on, for

* ``gemm``: ``C = A @ B`` of shapes ``m x k @ k x n`` (``name`` = ``MxNxK``), square
  sweeps, the shapes of transformer layers (tokens x hidden x 3/4 hidden) and an LM
  head's three GEMMs over a vocabulary that is (50304) and is not (50257) a multiple of
  8 (misaligned rows cost tensor cores their vectorised loads);
* ``attention``: causal scaled-dot-product attention, forward (``...:fwd``) and
  forward + backward (``...:fwdbwd``), FLOPs counted as FlashAttention does
  (Dao, arXiv:2205.14135: ``4 b h s^2 d`` forward, halved by the causal mask;
  backward 2.5 x forward);
* ``elementwise``: GELU of ``n`` values (read + write: memory-bound);
* ``norm``: LayerNorm over rows of ``hidden`` values (read + write);
* ``adamw``: one fused AdamW step over ``n`` fp32 parameters (param, grad and two
  moments read, param and moments written: 28 bytes per parameter).

Each record carries ``flops`` and ``size_bytes`` (the bytes the operator must move
at least), so ``flops / time_s`` and ``size_bytes / time_s`` are the achieved rates
a compute model compares with a GPU's peak figures. On CUDA the time is
``triton.testing.do_bench``'s median (L2 flushed before each call); on the CPU, the
median of :func:`perfsim.calibrate.timing.time_op`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from perfsim.calibrate.timing import time_op

#: op names of the records this module writes (perfsim.profile.EFFICIENCY_OPS)
OPS = ("gemm", "attention", "elementwise", "norm", "adamw")

_DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
       "tf32": torch.float32}


@dataclass(frozen=True)
class EfficiencyConfig:
    """What to measure."""

    #: compute dtypes (``tf32`` = float32 inputs with TF32 tensor-core matmuls)
    dtypes: tuple[str, ...] = ("bfloat16", "float16", "float32", "tf32")
    #: fewer shapes (a minute on a GPU, seconds on a CPU)
    quick: bool = False
    #: ``cuda`` or ``cpu``
    device: str = "cuda"


def _gemm_shapes(cfg: EfficiencyConfig) -> list[tuple[int, int, int]]:
    if cfg.device != "cuda":
        return [(s, s, s) for s in (64, 128, 256, 512)]
    squares = (256, 512, 1024, 2048, 4096, 8192) if not cfg.quick else (512, 2048, 8192)
    shapes = [(s, s, s) for s in squares]
    hiddens = (768, 1600, 4096, 8192) if not cfg.quick else (1600, 8192)
    tokens = (512, 2048, 8192) if not cfg.quick else (2048,)
    for h in hiddens:
        for t in tokens:
            shapes += [(t, 3 * h, h), (t, h, h), (t, 4 * h, h), (t, h, 4 * h)]
    # an LM head over an unpadded vocabulary (GPT-2's 50257 tokens) beside the padded one
    # (Megatron-LM pads to a multiple of 128): forward, input gradient, weight gradient
    for v in (50257, 50304):
        for h, t in ((768, 2048), (1600, 8192)) if not cfg.quick else ((1600, 8192),):
            shapes += [(t, v, h), (t, h, v), (v, h, t)]
    return shapes


def _bench(fn: Callable[[], object], device: str) -> tuple[float, float, int]:
    """(median s, IQR s, repeats)."""
    if device == "cuda":
        from triton.testing import do_bench

        q = do_bench(fn, warmup=10, rep=50, quantiles=[0.25, 0.5, 0.75])
        return q[1] / 1e3, (q[2] - q[0]) / 1e3, 0
    t = time_op(fn, warmup=1, repeats=5, device="cpu")
    return t.median_s, t.spread_s, t.repeats


def _record(op: str, name: str, dtype: str, flops: float, nbytes: float, timing, device: str) -> dict:
    t, spread, reps = timing
    return {"op": op, "name": name, "dtype": dtype, "size_bytes": int(nbytes), "flops": float(flops),
            "time_s": t, "spread_s": spread, "repeats": reps,
            "source": f"calibrate efficiency; device={device}; "
                      f"achieved_tflops={flops / t / 1e12:.4g}; achieved_gbps={nbytes / t / 1e9:.4g}"}


def measure_gemm(cfg: EfficiencyConfig) -> Iterator[dict]:
    for dtype in cfg.dtypes:
        dt = _DT[dtype]
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        try:
            for m, n, k in _gemm_shapes(cfg):
                a = torch.randn(m, k, device=cfg.device, dtype=dt)
                b = torch.randn(k, n, device=cfg.device, dtype=dt)
                nbytes = (m * k + k * n + m * n) * a.element_size()
                yield _record("gemm", f"{m}x{n}x{k}", dtype, 2.0 * m * n * k, nbytes,
                              _bench(lambda: a @ b, cfg.device), cfg.device)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old


def measure_attention(cfg: EfficiencyConfig) -> Iterator[dict]:
    import torch.nn.functional as F

    shapes = [(2, 4, 128, 64)] if cfg.device != "cuda" else \
        [(b, 16, s, d) for d in (64, 128) for s, b in ((512, 16), (1024, 8), (2048, 4), (4096, 2))
         if not cfg.quick or s in (1024, 4096)]
    for dtype in cfg.dtypes:
        if dtype == "tf32":
            continue
        dt = _DT[dtype]
        for b, h, s, d in shapes:
            q, k, v = (torch.randn(b, h, s, d, device=cfg.device, dtype=dt, requires_grad=True)
                       for _ in range(3))
            fwd_flops = 4.0 * b * h * s * s * d / 2  # causal: half the score matrix
            nbytes = 4 * b * h * s * d * q.element_size()  # q, k, v read, out written
            name = f"b{b}h{h}s{s}d{d}"
            yield _record("attention", f"{name}:fwd", dtype, fwd_flops, nbytes, _bench(
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), cfg.device), cfg.device)
            g = torch.randn(b, h, s, d, device=cfg.device, dtype=dt)

            def fwdbwd():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                out.backward(g)
            yield _record("attention", f"{name}:fwdbwd", dtype, 3.5 * fwd_flops, 2.5 * nbytes,
                          _bench(fwdbwd, cfg.device), cfg.device)


def measure_memory_bound(cfg: EfficiencyConfig) -> Iterator[dict]:
    import torch.nn.functional as F

    sizes = (2**12, 2**16, 2**20) if cfg.device != "cuda" else \
        tuple(2**p for p in ((18, 22, 26, 28) if cfg.quick else (16, 18, 20, 22, 24, 26, 28)))
    for dtype in cfg.dtypes:
        if dtype == "tf32":
            continue
        dt = _DT[dtype]
        for n in sizes:
            x = torch.randn(n, device=cfg.device, dtype=dt)
            yield _record("elementwise", f"gelu:{n}", dtype, 8.0 * n, 2 * n * x.element_size(),
                          _bench(lambda: F.gelu(x), cfg.device), cfg.device)
            hidden = 4096 if n >= 4096 * 16 else 1024
            rows = max(1, n // hidden)
            ln = torch.nn.LayerNorm(hidden, device=cfg.device, dtype=dt)
            y = torch.randn(rows, hidden, device=cfg.device, dtype=dt)
            with torch.no_grad():
                yield _record("norm", f"layernorm:{rows}x{hidden}", dtype, 8.0 * rows * hidden,
                              2 * rows * hidden * y.element_size(), _bench(lambda: ln(y), cfg.device),
                              cfg.device)
    for n in sizes:
        p = torch.nn.Parameter(torch.randn(n, device=cfg.device))
        p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW([p], lr=1e-4, fused=cfg.device == "cuda")
        opt.step()  # creates the moment buffers
        yield _record("adamw", f"adamw:{n}", "float32", 12.0 * n, 28 * n, _bench(opt.step, cfg.device),
                      cfg.device)


def measure_efficiency(cfg: EfficiencyConfig) -> list[dict]:
    """Every record of this module for ``cfg`` (profile records, ``perfsim.profile``)."""
    with torch.no_grad():
        recs = list(measure_gemm(cfg))
    recs += list(measure_attention(cfg))
    recs += list(measure_memory_bound(cfg))
    return recs
