"""Physical ranges of the fitted parameters of an efficiency curve (:class:`~perfsim.hardware.Curve`).

A fitted efficiency must stay an efficiency: each parameter below has the range that its
meaning allows, with the source of that range, and every fit (``scripts/calibrate_a100.py``,
:func:`perfsim.engine.curve_fit.fit_curve`) is constrained to it. What a fit cannot explain
inside these ranges is a mechanism still missing or part of the stated uncertainty
(:mod:`perfsim.engine.uncertainty`), never a factor pushed outside its range.

Sources:

* GPU peak rates and memory bandwidth: the vendors' datasheets (NVIDIA A100 Tensor Core GPU
  datasheet, 2021: 312 TFLOP/s dense fp16/bf16, 2039 GB/s HBM2e on the 80 GB SXM4; NVIDIA
  H100 datasheet, 2023: 989 TFLOP/s dense bf16, 3.35 TB/s).
* What a large dense GEMM reaches: NVIDIA's "Matrix Multiplication Background User's Guide"
  (Deep Learning Performance documentation) shows cuBLAS tensor-core GEMMs saturating below
  the datasheet peak (clock throttling under tensor-core load, tile quantisation); perfsim's
  own kernel times put the best large bf16 GEMM of an H100 at 0.91 and of an H200 at 0.69 of
  peak (``traces/gpu/h100-efficiency-2026-11-26.json``, ``traces/gpu-h200.json``). Whole
  Megatron-LM training reaches 0.52 of the A100 peak end to end (Narayanan et al., "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", arXiv:2104.04473,
  163 TFLOP/s per GPU), so its GEMMs run faster than that: 0.55-0.92 brackets both.
* What a memory-bound kernel reaches: a device-to-device copy on an H100 moves 2.7-3.0 TB/s
  of the 3.35 TB/s datasheet figure (0.81-0.90, ``docs/gpu.md``); element-wise kernels of a
  training step (norms, activations, optimizer) reach less: 0.45-0.92.
* Host time per operator: a CUDA launch costs 2-5 us of CPU (CUDA C++ Best Practices Guide,
  "Kernel launch overhead"); eager PyTorch adds its dispatcher, so a framework operator costs
  ~10-60 us (perfsim's H200 step benchmark: 25 us for eager PyTorch, ``docs/gpu.md``;
  Megatron-LM's Python layers cost more): 2-80 us.
* Host time of a pipeline send/receive and of a tensor-parallel collective call: an NCCL call
  through ``torch.distributed`` is at least one operator (above); Megatron-LM's p2p exchange
  also synchronises the device (``torch.cuda.synchronize``): 0-100 us each.
* The optimizer step's share of the datasheet bandwidth (``optimizer_eff``): a fused optimizer
  (apex's and PyTorch's multi-tensor Adam) reads and writes every parameter, gradient and state
  buffer once in long contiguous kernels, which stream like a device copy (above: 0.81-0.90 on an
  H100), less where many small tensors cut the streams short: the element-wise range, 0.45-0.92.
* The LM head's share of the block GEMMs' rate: an H200 runs the padded vocabulary GEMMs of
  GPT-2's head at 606-722 TFLOP/s where its block GEMMs run at 612-779 (``traces/gpu-h200.json``):
  0.75-1.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    """The range a fitted parameter may take, and why."""

    #: smallest value the parameter's meaning allows
    low: float
    #: largest value
    high: float
    #: what the range rests on (a short form of the module docstring's source)
    source: str

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


#: ranges of the curve fields a fit may set (seconds for the host times)
CURVE_BOUNDS: dict[str, Bound] = {
    "eff_max": Bound(0.55, 0.92, "datasheet peak; cuBLAS GEMMs saturate below it; Megatron-LM 0.52 end to end"),
    "knee": Bound(0.0, 1024.0, "GEMM dimension at which efficiency halves: tile sizes 64-256, waves of SMs"),
    "mem_eff": Bound(0.45, 0.92, "device copy 0.81-0.90 of datasheet bandwidth on an H100; element-wise kernels less"),
    "kernel_s": Bound(2e-6, 80e-6, "CUDA launch 2-5 us plus the framework's dispatcher"),
    "p2p_s": Bound(0.0, 100e-6, "one NCCL call plus a device synchronisation"),
    "collective_s": Bound(0.0, 100e-6, "one NCCL call through torch.distributed"),
    "lm_head_eff": Bound(0.75, 1.0, "an H200 runs the LM head's GEMMs at 0.78-1.0 of its block GEMMs' rate"),
    "optimizer_eff": Bound(0.45, 0.92, "a fused optimizer streams like a copy: up to the device copy's 0.81-0.90 "
                                       "of datasheet on an H100; many small tensors less"),
}


#: fields whose 0 means "not fitted, another field stands in" (:class:`perfsim.hardware.Curve`)
UNSET_WHEN_ZERO = frozenset({"optimizer_eff"})


def violations(curve) -> list[str]:
    """One line per fitted field of ``curve`` outside its :data:`CURVE_BOUNDS` range (an
    ``optimizer_eff`` of 0 is unset: ``mem_eff`` prices the step)."""
    out = []
    for name, bound in CURVE_BOUNDS.items():
        value = getattr(curve, name)
        if name in UNSET_WHEN_ZERO and value == 0:
            continue
        if not bound.contains(value):
            out.append(f"{name}={value:.4g} outside [{bound.low:.4g}, {bound.high:.4g}] ({bound.source})")
    return out
