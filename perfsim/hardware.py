"""GPU presets: peak dense FLOP/s per precision, memory bandwidth and capacity.

Every figure is the vendor's datasheet number (dense, i.e. without structured
sparsity; SI units: FLOP/s, bytes/s, bytes). ``tf32`` is the tensor-core rate for
fp32 inputs; a GPU without a precision has no entry (V100 has no bf16 or tf32).
``calibrated`` names the GPU whose achieved-efficiency curve
(:mod:`perfsim.engine.compute`) was fitted on real measurements; other GPUs use
the nearest calibrated GPU's curve scaled by their own peaks, an assumption the
result states (``compute_model`` in the summary).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfsim.errors import ConfigError

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
#: bytes of one value per training precision; ``fp8`` is NVIDIA Transformer Engine's
#: recipe (Micikevicius et al., "FP8 Formats for Deep Learning", arXiv:2209.05433): fp8
#: GEMMs, bf16 everywhere else -- weights, activations, messages are bf16 values
BYTES_PER_VALUE = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}


def value_precision(precision: str) -> str:
    """The precision of the values outside the GEMMs: ``bf16`` under ``fp8`` (Transformer
    Engine keeps norms, softmax, attention, the LM head and all tensors between
    operators in bf16), else ``precision`` itself."""
    return "bf16" if precision == "fp8" else precision

_V100 = "NVIDIA Tesla V100 GPU datasheet (2020), https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021), https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-nvidia-us-2188504-web.pdf"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023), https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446"
_L4 = "NVIDIA L4 Tensor Core GPU datasheet (2023), https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"
_ADA = "NVIDIA Ada GPU Architecture whitepaper v2.1, Appendix A, Table 9 (GeForce RTX 4090; FP32 accumulate), https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
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
    #: family used to pick the nearest calibrated efficiency curve
    family: str = ""

    def __post_init__(self):
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


def _gpu(name, fp32, tf32, bf16, fp16, bw, mem, src, family, fp8=None):
    rates = {k: v for k, v in (("fp32", fp32), ("tf32", tf32), ("bf16", bf16), ("fp16", fp16), ("fp8", fp8))
             if v}
    return GPU(name, rates, bw, mem, src, family)


GPUS: dict[str, GPU] = {g.name: g for g in (
    _gpu("v100-sxm2-16gb", 15.7 * T, None, None, 125 * T, 900 * G, 16 * 2**30, _V100, "volta"),
    _gpu("v100-sxm2-32gb", 15.7 * T, None, None, 125 * T, 900 * G, 32 * 2**30, _V100, "volta"),
    _gpu("v100-pcie-16gb", 14 * T, None, None, 112 * T, 900 * G, 16 * 2**30, _V100, "volta"),
    _gpu("v100-pcie-32gb", 14 * T, None, None, 112 * T, 900 * G, 32 * 2**30, _V100, "volta"),
    _gpu("a100-sxm4-40gb", 19.5 * T, 156 * T, 312 * T, 312 * T, 1555 * G, 40 * 2**30, _A100, "ampere"),
    _gpu("a100-sxm4-80gb", 19.5 * T, 156 * T, 312 * T, 312 * T, 2039 * G, 80 * 2**30, _A100, "ampere"),
    _gpu("a100-pcie-40gb", 19.5 * T, 156 * T, 312 * T, 312 * T, 1555 * G, 40 * 2**30, _A100, "ampere"),
    _gpu("a100-pcie-80gb", 19.5 * T, 156 * T, 312 * T, 312 * T, 1935 * G, 80 * 2**30, _A100, "ampere"),
    # fp8: the datasheets' "FP8 Tensor Core" figures are with sparsity (3,958 / 3,026 TFLOPS): halved
    _gpu("h100-sxm5-80gb", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 3350 * G, 80 * 2**30, _H100, "hopper",
         fp8=1978.9 * T),
    _gpu("h100-pcie-80gb", 51 * T, 378 * T, 756 * T, 756 * T, 2000 * G, 80 * 2**30, _H100, "hopper", fp8=1513 * T),
    _gpu("h200-sxm-141gb", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 4800 * G, 141 * G, _H200, "hopper",
         fp8=1978.9 * T),
    _gpu("l4", 30.3 * T, 60 * T, 121 * T, 121 * T, 300 * G, 24 * 2**30, _L4, "ada"),
    _gpu("rtx-4090", 82.6 * T, 82.6 * T, 165.2 * T, 165.2 * T, 1008 * G, 24 * 2**30, _ADA, "ada"),
    _gpu("mi300x", 163.4 * T, 653.7 * T, 1307.4 * T, 1307.4 * T, 5300 * G, 192 * G, _MI300X, "cdna3"),
)}

#: the intra-node fabric a node of each GPU ships with (perfsim.fabrics): NVSwitch/NVLink on
#: SXM parts, the PCIe generation of the card otherwise; absent where no preset fits (MI300X)
NODE_FABRIC = {"v100-sxm2-16gb": "nvlink2", "v100-sxm2-32gb": "nvlink2", "v100-pcie-16gb": "pcie3",
               "v100-pcie-32gb": "pcie3", "a100-sxm4-40gb": "nvlink3", "a100-sxm4-80gb": "nvlink3",
               "a100-pcie-40gb": "pcie4", "a100-pcie-80gb": "pcie4", "h100-sxm5-80gb": "nvlink4",
               "h100-pcie-80gb": "pcie5", "h200-sxm-141gb": "nvlink4", "l4": "pcie4", "rtx-4090": "pcie4"}

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
