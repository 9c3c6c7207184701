"""GPU presets: peak dense FLOP/s per precision, memory bandwidth and capacity, and the
achieved-efficiency curve each one is priced with.

Every figure is the vendor's datasheet number (dense, i.e. without structured
sparsity; SI units: FLOP/s, bytes/s, bytes). ``tf32`` is the tensor-core rate for
fp32 inputs; a GPU without a precision has no entry (V100 has no bf16 or tf32).

Each preset holds its :class:`Curve` (``GPU.curve``): one fitted on its own measurements
(``Curve.fitted_on`` is its name), or the curve of the nearest calibrated GPU applied to its
own peaks, an assumption the result states (``compute_model`` in the summary,
:func:`curve_for`). The engine prices operators with it (:mod:`perfsim.engine.compute`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfsim.errors import ConfigError

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
#: precisions trained as mixed precision: half-precision (or fp8) weights and gradients beside
#: fp32 master weights (Micikevicius et al., "Mixed Precision Training", arXiv:1710.03740)
MIXED_PRECISIONS = ("bf16", "fp16", "fp8")
#: bytes of one value per training precision; ``fp8`` is NVIDIA Transformer Engine's
#: recipe (Micikevicius et al., "FP8 Formats for Deep Learning", arXiv:2209.05433): fp8
#: GEMMs, bf16 everywhere else -- weights, activations, messages are bf16 values
BYTES_PER_VALUE = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}


#: how a GEMM's tiles fill the GPU (``Curve.gemm_quantization``): ``off`` -- the curve's smooth
#: size factor only; ``waves`` -- also tile and wave quantization over the GPU's SMs
#: (:mod:`perfsim.engine.gemm_waves`)
GEMM_QUANTIZATION = ("off", "waves")
#: how the host's time to issue operators meets the GPU's time to run them (``Curve.host_issue``):
#: ``per-op`` -- every operator costs at least the host's ``kernel_s``; ``queue`` -- the host
#: enqueues a layer's kernels ahead of the GPU (CUDA launches are asynchronous), so a layer costs
#: its GPU time or its host time, whichever is longer (:func:`perfsim.engine.compute.queued`)
HOST_ISSUE = ("per-op", "queue")


def value_precision(precision: str) -> str:
    """The precision of the values outside the GEMMs: ``bf16`` under ``fp8`` (Transformer
    Engine keeps norms, softmax, attention, the LM head and all tensors between
    operators in bf16), else ``precision`` itself."""
    return "bf16" if precision == "fp8" else precision


@dataclass(frozen=True)
class Curve:
    """Achieved-efficiency curve of a GPU: what share of its datasheet peaks its operators
    reach, and the host's time per operator (how the engine prices an operator with it:
    :func:`perfsim.engine.compute.op_time`; each fitted field's physical range:
    :mod:`perfsim.engine.curve_bounds`)."""

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
    #: of 16 bytes reaches (:func:`perfsim.engine.compute.misaligned`)
    misaligned_eff: float = 1.0
    #: share of the datasheet memory bandwidth the optimizer step streams at
    #: (:func:`perfsim.engine.compute.optimizer_time`): a fused optimizer walks every parameter,
    #: gradient and state buffer once in long contiguous multi-tensor kernels, closer to a
    #: device copy than the short element-wise kernels ``mem_eff`` stands for; 0: ``mem_eff``
    optimizer_eff: float = 0.0
    #: share of the block GEMMs' rate the LM head's vocabulary GEMMs reach (``Op.lm_head``):
    #: 1 where kernel times were measured (an H200 runs the padded head GEMMs as fast as
    #: the blocks'); the A100 fit's is what its iteration times say (:data:`A100_CURVE`)
    lm_head_eff: float = 1.0
    #: FlashAttention-2's forward (causal: half the score matrix) as a fraction of peak at
    #: FLASH_REF (sequence 4096, head dim 128), and the sequence length / head dim at which
    #: its efficiency halves (:func:`perfsim.engine.compute.flash_time`); 0: not fitted
    flash_eff: float = 0.0
    flash_knee_s: float = 0.0
    flash_knee_d: float = 0.0
    #: the same for its backward (2.5 x the forward's FLOPs, the scores recomputed)
    flash_bwd_eff: float = 0.0
    flash_bwd_knee_s: float = 0.0
    flash_bwd_knee_d: float = 0.0
    #: the GPU preset whose measurements fitted the device side ("": none of the presets)
    fitted_on: str = ""
    #: the GPU preset whose fused-attention kernel times fitted the flash fields, where that is
    #: not ``fitted_on`` ("": the same)
    flash_fitted_on: str = ""
    #: :data:`GEMM_QUANTIZATION`: ``waves`` prices every GEMM as output tiles run in waves over
    #: the GPU's SMs (``GPU.sms``, ``GPU.l2_Bps``; :func:`perfsim.engine.gemm_waves.quantized_seconds`)
    #: on top of the smooth factor ``g``; ``off`` (every fitted curve): ``g`` only
    gemm_quantization: str = "off"
    #: :data:`HOST_ISSUE`: ``queue`` lets the host run ahead of the GPU within a layer
    #: (:func:`perfsim.engine.compute.queued`); ``per-op``: each operator at least ``kernel_s``
    host_issue: str = "per-op"

    def __post_init__(self):
        if not (0 < self.eff_max <= 1 and 0 < self.mem_eff <= 1 and self.knee >= 0 and self.kernel_s >= 0
                and self.p2p_s >= 0 and self.collective_s >= 0 and 0 < self.misaligned_eff <= 1
                and 0 < self.lm_head_eff <= 1 and 0 <= self.optimizer_eff <= 1
                and 0 <= self.flash_eff <= 1 and 0 <= self.flash_bwd_eff <= 1
                and min(self.flash_knee_s, self.flash_knee_d, self.flash_bwd_knee_s, self.flash_bwd_knee_d) >= 0):
            raise ConfigError(f"curve {self}: eff_max, mem_eff, misaligned_eff, lm_head_eff in (0, 1], optimizer_eff in [0, 1], "
                              f"flash efficiencies in [0, 1], knee, kernel_s, p2p_s, collective_s, flash knees >= 0")
        if self.host_issue not in HOST_ISSUE:
            raise ConfigError(f"curve host_issue={self.host_issue!r}: choose from {', '.join(HOST_ISSUE)}")
        if self.gemm_quantization not in GEMM_QUANTIZATION:
            raise ConfigError(f"curve gemm_quantization={self.gemm_quantization!r}: choose from "
                              f"{', '.join(GEMM_QUANTIZATION)}")



#: the (sequence length, head dimension) at which a curve's flash efficiencies are stated
FLASH_REF = (4096, 128)

#: the A100 fit's host side (per operator, per pipeline message, per TP collective): the
#: framework's costs, not the GPU's, so the curves fitted on kernel times share them
_A100_HOST = dict(kernel_s=58.37e-6, p2p_s=99.96e-6, collective_s=58.66e-6)
#: FlashAttention-2 (PyTorch's fused SDPA, bf16) fitted on the H200's attention records
_H200_FLASH = dict(flash_eff=0.5426, flash_knee_s=544.0, flash_knee_d=104.0, flash_bwd_eff=0.4195,
                   flash_bwd_knee_s=1408.0, flash_bwd_knee_d=52.0)
#: fitted on A100 iteration times; ``scripts/calibrate_a100.py`` reproduces the fit (bounded
#: Nelder-Mead on the calibration configurations, each parameter inside its range,
#: :mod:`perfsim.engine.curve_bounds`; last refitted with the runs' pipeline messages in
#: DeepSpeed's order: docs/validation.md, session 30; errors there too). The data barely
#: constrain the knee: at these sizes the host floor hides small GEMMs; p2p_s and lm_head_eff
#: end on their bounds -- a mechanism of Megatron-DeepSpeed's last stage is still missing
#: (docs/validation.md). ``lm_head_eff``: measured kernel times put it at 1 (an H200 runs the
#: padded vocabulary GEMMs as fast as the blocks'); the A100 iteration times do not: the last
#: pipeline stage's cost per micro-batch beyond its layers grows with hidden size x vocabulary
#: as if the head ran at about a third of the blocks' rate (TP 1: 8.2 ms per 1024 tokens at
#: hidden 2048, 4.1 at 1024), so the A100 fit has a share of its own (docs/validation.md, "the
#: LM head"); which kernel is slow there no trace has shown.
A100_CURVE = Curve(eff_max=0.8842, knee=0.01011, mem_eff=0.7506, lm_head_eff=0.751,
                   source="fitted on A100 (../shared/data/a100-single-node, calibration configurations, "
                          "inside perfsim.engine.curve_bounds)", **_A100_HOST,
                   # not measured on an A100 (its data pad the vocabulary, its runs use
                   # Megatron's attention): the H200's
                   misaligned_eff=0.1924, **_H200_FLASH, fitted_on="a100-sxm4-80gb",
                   flash_fitted_on="h200-sxm-141gb")
#: device side fitted to one H200's kernel times (perfsim calibrate --efficiency, bf16;
#: traces/gpu-h200.json, scripts/fit_gpu_curve.py); host side the A100 fit's
H200_CURVE = Curve(eff_max=0.6891, knee=16.0, mem_eff=0.5497,
                   source="fitted on H200 kernel times (traces/gpu-h200.json); host costs of the A100 fit",
                   **_A100_HOST, misaligned_eff=0.1924, **_H200_FLASH, fitted_on="h200-sxm-141gb")
#: fitted on one H100's kernel times (``perfsim calibrate --efficiency --quick``,
#: ``traces/gpu/h100-efficiency-2026-11-26.json``); host side the A100 fit's
H100_CURVE = Curve(eff_max=0.9114, knee=352.0, mem_eff=0.7362,
                   source="fitted on H100 kernel times (traces/gpu/h100-efficiency-2026-11-26.json); "
                          "host costs of the A100 fit",
                   **_A100_HOST, misaligned_eff=0.1887,
                   flash_eff=0.5487, flash_knee_s=576.0, flash_knee_d=96.0, flash_bwd_eff=0.3899,
                   flash_bwd_knee_s=1664.0, flash_bwd_knee_d=40.0, fitted_on="h100-sxm5-80gb")


_V100 = "NVIDIA Tesla V100 GPU datasheet (2020), https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021), https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-nvidia-us-2188504-web.pdf"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023), https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446"
_L4 = "NVIDIA L4 Tensor Core GPU datasheet (2023), https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"
_ADA = "NVIDIA Ada GPU Architecture whitepaper v2.1, Appendix A, Table 9 (GeForce RTX 4090; FP32 accumulate), https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
#: SM count and L2 bandwidth of the GA100 as the A100 ships it (all four A100 presets: the same chip,
#: 1410 MHz boost): "108 SMs", "L2 cache read bandwidth ... 5120 Bytes/clk" (NVIDIA A100 Tensor Core
#: GPU Architecture whitepaper v1.0, 2020, Table 1 and "A100 L2 Cache"): 5120 B x 1.41 GHz
_GA100_SMS = dict(sms=108, l2_Bps=5120 * 1.41e9)
#: SM counts of the GH100 as the H100 ships it: "132 SMs" (SXM5), "114 SMs" (PCIe) (NVIDIA H100 Tensor
#: Core GPU Architecture whitepaper v1.01, 2022, Table 3); the H200 is the SXM5 part's GH100 with more
#: memory. No L2 bandwidth is given, so ``gemm_quantization="waves"`` stays refused on them
_GH100_SXM_SMS, _GH100_PCIE_SMS = dict(sms=132), dict(sms=114)
_MI300X = "AMD Instinct MI300X accelerator datasheet (2023), https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf"

T, G = 1e12, 1e9


@dataclass(frozen=True)
class GPU:
    """One GPU model."""

    #: preset name (``a100-sxm4-80gb``)
    name: str
    #: peak dense FLOP/s by precision (fp32 = CUDA cores, tf32/bf16/fp16/fp8 = tensor cores;
    #: fp8 only where the datasheet gives it and Transformer Engine's recipe runs: Hopper)
    peak_flops: dict
    #: HBM/GDDR bandwidth, bytes/s
    memory_bandwidth_Bps: float
    #: device memory, bytes
    memory_bytes: float
    #: where the figures come from
    source: str
    #: architecture (``ampere``, ``hopper``, ...): whether a borrowed curve comes from the same one
    family: str = ""
    #: the achieved-efficiency curve it is priced with: its own fit, else the nearest
    #: calibrated GPU's (default: the A100's)
    curve: Curve = A100_CURVE
    #: whether two of its cards in one node reach each other's memory over PCIe (CUDA peer-to-peer,
    #: NCCL's P2P transport); GeForce cards have none -- "GeForce cards don't support GPU Direct P2P"
    #: (S. Jeaugey, NVIDIA/nccl#1309) -- so NCCL goes through host memory (SHM, perfsim.fabrics.HostPath)
    p2p: bool = True
    #: streaming multiprocessors a GEMM's output tiles are spread over (0: not given; then
    #: ``gemm_quantization="waves"`` is refused for it, and a kernel of few thread blocks,
    #: ``Op.ctas``, is priced as if it filled the GPU)
    sms: int = 0
    #: L2 cache read bandwidth, bytes/s: what feeds the SMs' tiles their operands
    #: (:mod:`perfsim.engine.gemm_waves`; 0: not given)
    l2_Bps: float = 0.0

    def __post_init__(self):
        if self.sms < 0 or self.l2_Bps < 0:
            raise ConfigError(f"{self.name}: sms and l2_Bps must be >= 0")
        if not self.peak_flops or any(p not in PRECISIONS or v <= 0 for p, v in self.peak_flops.items()):
            raise ConfigError(f"{self.name}.peak_flops: positive rates for {', '.join(PRECISIONS)} only")
        if self.memory_bandwidth_Bps <= 0 or self.memory_bytes <= 0:
            raise ConfigError(f"{self.name}: memory bandwidth and capacity must be > 0")

    def peak(self, precision: str) -> float:
        """Peak dense FLOP/s of the GEMMs of a ``precision`` training step."""
        if precision not in self.peak_flops:
            raise ConfigError(f"precision={precision!r}: {self.name} has no {precision} "
                              f"(has {', '.join(self.peak_flops)})")
        return self.peak_flops[precision]


def _gpu(name, fp32, tf32, bf16, fp16, bw, mem, src, family, fp8=None, curve=A100_CURVE, p2p=True, sms=0,
         l2_Bps=0.0):
    rates = {k: v for k, v in (("fp32", fp32), ("tf32", tf32), ("bf16", bf16), ("fp16", fp16), ("fp8", fp8))
             if v}
    return GPU(name, rates, bw, mem, src, family, curve, p2p, sms, l2_Bps)


GPUS: dict[str, GPU] = {g.name: g for g in (
    _gpu("v100-sxm2-16gb", 15.7 * T, None, None, 125 * T, 900 * G, 16 * 2**30, _V100, "volta"),
    _gpu("v100-sxm2-32gb", 15.7 * T, None, None, 125 * T, 900 * G, 32 * 2**30, _V100, "volta"),
    _gpu("v100-pcie-16gb", 14 * T, None, None, 112 * T, 900 * G, 16 * 2**30, _V100, "volta"),
    _gpu("v100-pcie-32gb", 14 * T, None, None, 112 * T, 900 * G, 32 * 2**30, _V100, "volta"),
    _gpu("a100-sxm4-40gb", 19.5 * T, 156 * T, 312 * T, 312 * T, 1555 * G, 40 * 2**30, _A100, "ampere", **_GA100_SMS),
    _gpu("a100-sxm4-80gb", 19.5 * T, 156 * T, 312 * T, 312 * T, 2039 * G, 80 * 2**30, _A100, "ampere", **_GA100_SMS),
    _gpu("a100-pcie-40gb", 19.5 * T, 156 * T, 312 * T, 312 * T, 1555 * G, 40 * 2**30, _A100, "ampere", **_GA100_SMS),
    _gpu("a100-pcie-80gb", 19.5 * T, 156 * T, 312 * T, 312 * T, 1935 * G, 80 * 2**30, _A100, "ampere", **_GA100_SMS),
    # fp8: the datasheets' "FP8 Tensor Core" figures are with sparsity (3,958 / 3,026 TFLOPS): halved
    _gpu("h100-sxm5-80gb", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 3350 * G, 80 * 2**30, _H100, "hopper",
         fp8=1978.9 * T, curve=H100_CURVE, **_GH100_SXM_SMS),
    _gpu("h100-pcie-80gb", 51 * T, 378 * T, 756 * T, 756 * T, 2000 * G, 80 * 2**30, _H100, "hopper", fp8=1513 * T,
         curve=H200_CURVE, **_GH100_PCIE_SMS),
    _gpu("h200-sxm-141gb", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 4800 * G, 141 * G, _H200, "hopper",
         fp8=1978.9 * T, curve=H200_CURVE, **_GH100_SXM_SMS),
    _gpu("l4", 30.3 * T, 60 * T, 121 * T, 121 * T, 300 * G, 24 * 2**30, _L4, "ada"),
    _gpu("rtx-4090", 82.6 * T, 82.6 * T, 165.2 * T, 165.2 * T, 1008 * G, 24 * 2**30, _ADA, "ada", p2p=False),
    _gpu("mi300x", 163.4 * T, 653.7 * T, 1307.4 * T, 1307.4 * T, 5300 * G, 192 * G, _MI300X, "cdna3"),
)}

#: architectures FlashAttention-2 runs on (Dao, "FlashAttention-2: Faster Attention with Better
#: Parallelism and Work Partitioning", arXiv:2307.08691; Dao-AILab/flash-attention README: "Ampere,
#: Ada, or Hopper GPUs", "Datatype fp16 and bf16", and its ROCm backend for MI200/MI300) -- the kernel
#: PyTorch's scaled_dot_product_attention and Megatron-Core's Transformer Engine attention pick there
#: in 16-bit precision, for head dimensions up to 256 ("All head dimensions up to 256"); Volta, fp32
#: and wider heads fall back to other kernels
FLASH_FAMILIES = ("ampere", "ada", "hopper", "cdna3")
FLASH_PRECISIONS = ("fp16", "bf16", "fp8")
FLASH_MAX_HEAD_DIM = 256


def default_attention(gpu: "GPU | None", precision: str, head_dim: int) -> str:
    """The attention kernels a job runs unless told: ``flash`` where FlashAttention-2 runs
    (:data:`FLASH_FAMILIES`, :data:`FLASH_PRECISIONS`, :data:`FLASH_MAX_HEAD_DIM`), else
    ``megatron`` (scores, softmax, dropout and weighted sum as separate kernels, the ``s x s``
    scores stored)."""
    if (gpu is not None and gpu.family in FLASH_FAMILIES and precision in FLASH_PRECISIONS
            and head_dim <= FLASH_MAX_HEAD_DIM):
        return "flash"
    return "megatron"


#: the GPUs without a curve of their own (Volta, Ada, CDNA3, the other A100s) borrow the A100's
#: (nearest by architecture); the H100 PCIe the H200's

#: the intra-node fabric a node of each GPU ships with (perfsim.fabrics): NVSwitch/NVLink on
#: SXM parts, the PCIe generation of the card otherwise -- through host memory (``pcieN-shm``)
#: for a card without peer-to-peer (``GPU.p2p``); absent where no preset fits (MI300X)
NODE_FABRIC = {"v100-sxm2-16gb": "nvlink2", "v100-sxm2-32gb": "nvlink2", "v100-pcie-16gb": "pcie3",
               "v100-pcie-32gb": "pcie3", "a100-sxm4-40gb": "nvlink3", "a100-sxm4-80gb": "nvlink3",
               "a100-pcie-40gb": "pcie4", "a100-pcie-80gb": "pcie4", "h100-sxm5-80gb": "nvlink4",
               "h100-pcie-80gb": "pcie5", "h200-sxm-141gb": "nvlink4", "l4": "pcie4", "rtx-4090": "pcie4-shm"}

#: the PCIe link between each GPU and its host (SXM parts too: an SXM module reaches the
#: CPU through a PCIe switch): V100 Gen3, A100/L4/RTX 4090 Gen4, H100/H200/MI300X Gen5 x16
#: (the vendors' datasheets); what CPU offload's host copies cross (:func:`host_link_Bps`)
HOST_LINK = {"v100-sxm2-16gb": "pcie3", "v100-sxm2-32gb": "pcie3", "v100-pcie-16gb": "pcie3",
             "v100-pcie-32gb": "pcie3", "a100-sxm4-40gb": "pcie4", "a100-sxm4-80gb": "pcie4",
             "a100-pcie-40gb": "pcie4", "a100-pcie-80gb": "pcie4", "h100-sxm5-80gb": "pcie5",
             "h100-pcie-80gb": "pcie5", "h200-sxm-141gb": "pcie5", "l4": "pcie4", "rtx-4090": "pcie4",
             "mi300x": "pcie5"}
#: PCIe x16 line rate per direction, bytes/s (PCI-SIG: 8, 16, 32 GT/s per lane, 128b/130b encoding)
PCIE_LINE_BPS = {"pcie3": 15.75e9, "pcie4": 31.5e9, "pcie5": 63.0e9}
#: share of the line rate a pinned host-device copy achieves (the TLP headers and flow control of
#: PCIe; NVIDIA's ``bandwidthTest`` reports ~12-13 GB/s pinned on Gen3 x16, i.e. 0.76-0.83): a
#: stated assumption in that range
PCIE_COPY_EFFICIENCY = 0.8


def host_link_Bps(gpu: GPU) -> float:
    """Bytes/s of one host-device copy of ``gpu`` (:data:`HOST_LINK` x :data:`PCIE_COPY_EFFICIENCY`)."""
    return PCIE_LINE_BPS[HOST_LINK[gpu.name]] * PCIE_COPY_EFFICIENCY


#: short names users type
ALIASES = {"v100": "v100-sxm2-32gb", "v100-16gb": "v100-sxm2-16gb", "v100-32gb": "v100-sxm2-32gb",
           "a100": "a100-sxm4-80gb", "a100-40gb": "a100-sxm4-40gb", "a100-80gb": "a100-sxm4-80gb",
           "h100": "h100-sxm5-80gb", "h100-sxm": "h100-sxm5-80gb", "h100-pcie": "h100-pcie-80gb",
           "h200": "h200-sxm-141gb", "4090": "rtx-4090", "mi300": "mi300x"}


def get_gpu(name: str | GPU) -> GPU:
    """A preset by name or alias (case-insensitive)."""
    if isinstance(name, GPU):
        return name
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    try:
        return GPUS[key]
    except KeyError:
        raise ConfigError(f"gpu {name!r}: unknown (known: {', '.join(GPUS)})") from None


def check_precision(gpu: GPU, precision: str) -> str:
    """``precision`` if ``gpu`` has it. ``fp32`` runs on the CUDA cores (PyTorch's
    matmul default since 1.12); ``tf32`` is fp32 storage with TF32 tensor-core GEMMs;
    ``fp8`` only on the GPUs given an fp8 rate (H100, H200), refused on the others."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision={precision!r}: choose from {', '.join(PRECISIONS)}")
    gpu.peak(precision)
    return precision


def curve_for(gpu: GPU, host_overhead_s: float | None = None) -> tuple[Curve, str]:
    """The curve ``gpu`` is priced with and a sentence saying where it comes from: fitted
    on it, on another GPU of its architecture, or on the nearest calibrated GPU.
    ``host_overhead_s``: the user's host time per operator, replacing the curve's
    ``kernel_s`` (the framework's, not the GPU's: Megatron-LM on the A100 runs' hosts
    for every curve here)."""
    curve, on = gpu.curve, gpu.curve.fitted_on
    if on == gpu.name:
        source = f"roofline x efficiency curve calibrated on {on}"
    elif not curve_borrowed(gpu):
        source = (f"roofline x efficiency curve calibrated on {on} (same architecture) "
                  f"applied to {gpu.name}'s datasheet peaks")
    else:
        source = (f"roofline x efficiency curve of {on} (nearest calibrated GPU) "
                  f"applied to {gpu.name}'s datasheet peaks (assumption: not calibrated on {gpu.name})")
    if curve.gemm_quantization != "off":
        source += f"; GEMM tile and wave quantization over {gpu.sms} SMs (gemm_quantization={curve.gemm_quantization})"
    if host_overhead_s is None:
        return curve, source
    return (replace(curve, kernel_s=host_overhead_s),
            f"{source}; host time per operator {host_overhead_s * 1e6:g} us (given)")


def _fitted_family(preset: str) -> str:
    """The architecture of the preset a curve (or part of one) was fitted on; ``ampere`` for
    none of the presets."""
    on = GPUS.get(preset)
    return on.family if on is not None else "ampere"


def curve_family(gpu: GPU) -> str:
    """The architecture of the GPU ``gpu``'s curve was fitted on (``ampere`` for a curve
    fitted on none of the presets)."""
    return _fitted_family(gpu.curve.fitted_on)


def curve_borrowed(gpu: GPU) -> bool:
    """Whether ``gpu``'s curve was fitted on a GPU of another architecture."""
    return curve_family(gpu) != gpu.family


def flash_borrowed(gpu: GPU) -> bool:
    """Whether ``gpu``'s FlashAttention rates were fitted on a GPU of another architecture (the
    A100 curve's are the H200's: its data ran Megatron's unfused attention)."""
    return _fitted_family(gpu.curve.flash_fitted_on or gpu.curve.fitted_on) != gpu.family


def same_silicon(a: GPU | None, b: GPU | None) -> bool:
    """Whether two presets compute alike: the same peak rates and memory bandwidth (the
    V100 SXM2 16 GB and 32 GB; not the A100 40 GB and 80 GB, whose HBM rates differ), so a
    measurement of one prices the other."""
    return a is not None and b is not None and (a.peak_flops, a.memory_bandwidth_Bps) == \
        (b.peak_flops, b.memory_bandwidth_Bps)


def profile_device(profile) -> str:
    """The device a profile was measured on, as its metadata names it (``NVIDIA H200``;
    ``cpu (AMD EPYC)``; ``NVIDIA Tesla V100-SXM2-16GB``, the default's), ``unknown`` where it
    names none: what prices a prediction without ``--gpu`` (the summary's ``profile_device``)."""
    meta = getattr(profile, "metadata", None) or {}
    kind, name = str(meta.get("device") or ""), str(meta.get("device_name") or "")
    if kind.lower() == "cpu":
        return f"cpu ({name})" if name and name.lower() != "cpu" else "cpu"
    return name or kind or "unknown"


def profile_gpu(profile) -> GPU | None:
    """The GPU preset a profile was measured on, if its ``device_name`` (``NVIDIA H200``;
    ``perfsim calibrate`` writes it) or ``device`` names one."""
    meta = getattr(profile, "metadata", None) or {}
    dev = str(meta.get("device_name") or meta.get("device", "")).lower().replace(" ", "-")
    best = None
    for name, gpu in GPUS.items():
        parts = name.split("-")
        if all(p in dev for p in parts):
            return gpu
        if parts[0] in dev and best is None:
            best = gpu
    return best
