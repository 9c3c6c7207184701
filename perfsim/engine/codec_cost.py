"""What a compressor's encode and decode cost: measured on the profile's device, modelled on any other.

A profile's codec records (``encode`` / ``decode`` / ``dp_encode`` / ``dp_decode``,
:meth:`perfsim.profile.Profile.encode_time`) time its own device -- a CPU's, an H200's.
They price a prediction only on that device: with no GPU preset, or with a preset of
the same silicon (:func:`perfsim.hardware.same_silicon`), as a profile's per-layer records
do (:mod:`perfsim.engine.layer_times`). On any other GPU each codec is the kernels its
compressor runs (:meth:`perfsim.compression.base.Compressor.codec_traffic`: memory-bound
passes over the tensor, PowerSGD's GEMMs), each priced as one operator by
:func:`perfsim.engine.compute.op_time` -- ``max(bytes / (bw x mem_eff), kernel_s)``, a GEMM
by the roofline of the GPU's curve (Williams et al. 2009, CACM 52(4)) -- the one
definition of a GPU's cost. The passes come from the codecs' definitions: AQ-SGD
(arXiv:2206.01299), QSGD (arXiv:1610.02132), QSGD-MaxNorm (arXiv:2109.12497), ECQ-SGD
(arXiv:1806.08054), 1-bit Adam (arXiv:2102.02888), PowerSGD (arXiv:1905.13727).
"""

from __future__ import annotations

from perfsim.compression import make_compressor
from perfsim.engine.compute import op_time
from perfsim.hardware import curve_for, profile_gpu, same_silicon
from perfsim.models.ops import Op


class ModelledCodecs:
    """Codec seconds on GPU preset ``gpu`` from its own model (module docstring), with the
    cost queries of a profile (:meth:`encode_time`, :meth:`decode_time`,
    :meth:`dp_codec_time`) so that a plan asks either alike."""

    def __init__(self, gpu, host_overhead_s: float | None = None):
        self.gpu = gpu
        self.curve = curve_for(gpu, host_overhead_s)[0]
        self._comp: dict[str, object] = {}
        self._memo: dict[tuple, float] = {}

    def passes_time(self, kernels) -> float:
        """Seconds of a sequence of :class:`~perfsim.compression.base.CodecPass` kernels on
        this GPU: each one operator (fp32: the codecs work on an fp32 copy)."""
        total = 0.0
        for k in kernels:
            op = Op("codec", *k.gemm) if k.gemm is not None else Op("codec", bytes=k.nbytes)
            total += op_time(op, self.gpu, "fp32", self.curve, 4)
        return total

    def _time(self, side: int, spec: str, nbytes: float, shape=None) -> float:
        if spec == "none" or nbytes <= 0:
            return 0.0
        shape = tuple(int(d) for d in shape) if shape is not None else (int(nbytes) // 4,)
        key = (side, spec, shape)
        if key not in self._memo:  # a planner prices the same few codecs many times
            comp = self._comp.get(spec)
            if comp is None:
                comp = self._comp[spec] = make_compressor(spec)
            self._memo[key] = self.passes_time(comp.codec_traffic(shape)[side])
        return self._memo[key]

    def encode_time(self, spec: str, nbytes: float, shape=None, model: str | None = None) -> float:
        """One :meth:`~perfsim.compression.base.Compressor.compress` of an fp32 tensor of
        ``nbytes`` (of ``shape`` where given: a pipeline boundary's; else a flat one)."""
        return self._time(0, spec, nbytes, shape)

    def decode_time(self, spec: str, nbytes: float, shape=None, model: str | None = None) -> float:
        """One decompress back to an fp32 tensor of ``nbytes`` (``shape`` as for :meth:`encode_time`)."""
        return self._time(1, spec, nbytes, shape)

    def dp_codec_time(self, op: str, spec: str, nbytes: float) -> None:
        """No data-parallel path timed: :func:`perfsim.engine.buckets.codec_passes` counts
        the encodes and decodes of an exchange."""
        return None


def codec_costs(profile, gpu, host_overhead_s: float | None = None):
    """(what prices codecs, a sentence saying so): ``profile`` itself where its records
    describe the device predicted for (no GPU preset, or one of the profile's silicon), else
    :class:`ModelledCodecs` of ``gpu``."""
    if gpu is None or (profile is not None and same_silicon(profile_gpu(profile), gpu)):
        device = (profile.metadata.get("device_name") or profile.metadata.get("device")) if profile is not None else None
        return profile, f"codec: the profile's records ({device or 'its device'})"
    key = (id(gpu), host_overhead_s)
    held = _MODELLED.get(key)
    if held is None or held.gpu is not gpu:  # one per GPU object (kept alive here, so its id stays its own)
        held = _MODELLED[key] = ModelledCodecs(gpu, host_overhead_s)
    return held, (f"codec: modelled on {gpu.name} (kernel passes at its memory bandwidth, GEMMs on its "
                  "curve: perfsim.engine.codec_cost)")


#: the modelled codecs of each GPU preset object and host time, built once per process
_MODELLED: dict[tuple, ModelledCodecs] = {}
