"""A stage's gradient buckets: what its data-parallel sync exchanges, and at what host cost.

Backward produces gradients from the last layer to the first; they are filled into
buckets in that order (PyTorch DDP's ``bucket_cap_mb``, Li et al., "PyTorch Distributed:
Experiences on Accelerating Data Parallel Training", arXiv:2006.15704, Sec. 3.2.3), each
with the collectives the gradient compressor plans for it (its ``dp_plan``; per matrix
for PowerSGD as torch's ``powerSGD_hook``: :func:`_grad_steps`), the encodes and
decodes the runtime performs (:func:`bucket_codec_times`, :func:`codec_passes`) and the
copies in and out of the bucket (:func:`copy_time`). ZeRO-1 adds the all-gather of the
updated weights (Rajbhandari et al. 2020, arXiv:1910.02054, Sec. 5.1: :func:`zero1_steps`);
with expert parallelism smaller than data parallelism the routed experts' gradients sync
over their expert-data-parallel group (DeepSpeed-MoE, Rajbhandari et al. 2022,
arXiv:2201.05596, Sec. 5: :func:`expert_buckets`).
:func:`perfsim.engine.plan.build_plan` fills each stage's ``buckets`` from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfsim.compression.base import ALLGATHER, ALLREDUCE, REDUCE_SCATTER, CommStep
from perfsim.errors import ConfigError
from perfsim.hardware import BYTES_PER_VALUE, curve_for
from perfsim.models.moe import expert_layers

#: fallback optimizer / copy cost when the profile has none: the optimizer's fp32 step
#: traffic (Adam 28 bytes per parameter: read p, g, m, v; write p, m, v;
#: :meth:`perfsim.job.Optimizer.step_bytes`) at this memory bandwidth (bytes/s;
#: V100 HBM2, NVIDIA V100 datasheet)
FALLBACK_MEMORY_BPS = 900e9


@dataclass
class Bucket:
    """One gradient bucket of a stage (layers in reverse order, as DDP fills them)."""

    numel: int
    ready_fraction: float  # share of the last backward done when it is ready
    steps: list[CommStep]
    encode_s: float  # every encode the runtime performs for this bucket
    decode_s: float  # every decode (codec_passes)
    copy_s: float = 0.0  # flatten the gradients into the bucket and copy the result back
    #: the replicas that sync it: each with every ``stride``-th other (1: all ``dp`` replicas;
    #: ``ep``: the routed experts' expert-data-parallel group of ``dp / ep`` replicas,
    #: :func:`perfsim.models.moe.expert_dp_replicas`)
    stride: int = 1


def _grad_steps(comp, layers, dp: int) -> list[CommStep]:
    """The collectives of one bucket. Compressors that work per matrix (PowerSGD's
    ``matrix_plan``) see each parameter tensor of a layer where the model lists them
    (``LayerSpec.tensors``: an MLP's weight matrix and bias vector), else the layer's
    gradient as one (hidden, rest) matrix -- the last boundary dimension as rows, an
    approximation of its weight matrices. As torch's ``powerSGD_hook`` does, the
    tensors it leaves uncompressed (vectors, too small to pay) go in one fp32
    allreduce first, then all P's in one allreduce, then all Q's.
    Others see the flattened bucket, as DDP hands it to a comm hook."""
    if not hasattr(comp, "matrix_plan"):
        return list(comp.dp_plan((sum(layer.params for layer in layers),), dp))
    first: list[CommStep] = []  # the uncompressed allreduce
    merged: list[CommStep] = []  # P's, Q's
    for layer in layers:
        rows = layer.out_shape[-1]
        shapes = layer.tensors or [
            (rows, layer.params // rows) if layer.params % rows == 0 and layer.params >= rows else (layer.params,)]
        for shape in shapes:
            steps = comp.dp_plan(shape, dp)
            into = first if len(steps) == 1 else merged
            for i, st in enumerate(steps):
                if i < len(into) and into[i].kind == st.kind and into[i].reduce == st.reduce:
                    into[i] = CommStep(st.kind, into[i].nbytes + st.nbytes, st.reduce, st.label)
                else:
                    into.append(st)
    return first + merged


def _buckets(layers, layer_bwd, bucket_bytes, comp, dp, profile, native: bool = False, gpu=None,
             copies: bool = True, zero_param_bytes: int = 0, codecs=None) -> list[Bucket]:
    """Fill buckets from the last layer backwards (backward produces gradients in
    that order; PyTorch DDP's ``bucket_cap_mb``, Li et al., "PyTorch Distributed: Experiences on
    Accelerating Data Parallel Training", arXiv:2006.15704, Sec. 3.2.3). ``copies``:
    each bucket is copied in and out (:func:`copy_time`); not for a contiguous
    gradient buffer (``Strategy.grad_buffer``). ``zero_param_bytes``: bytes per
    parameter of the weights under ZeRO-1 (0: off), :func:`zero1_steps`. ``codecs``: what
    prices the encodes and decodes (:func:`perfsim.engine.codec_cost.codec_costs`; None: the
    profile)."""
    codecs = profile if codecs is None else codecs
    total_bwd = sum(layer_bwd) or 1.0
    order = list(range(len(layers)))[::-1]
    buckets, current, done_bwd = [], [], 0.0
    spec = comp.spec or comp.name
    for i in order:
        current.append(layers[i])
        done_bwd += layer_bwd[i]
        size = 4 * sum(layer.params for layer in current)
        if size >= bucket_bytes or i == order[-1]:
            numel = size // 4
            if numel:
                try:
                    steps = _grad_steps(comp, current, dp)
                except (ValueError, TypeError, RuntimeError) as exc:  # cannot plan this shape
                    raise ConfigError(f"grad_compress {spec!r}: cannot plan a bucket of {numel} "
                                      f"elements ({exc})") from exc
                # uncompressed gradients go to the collective as they are (no codec call)
                plain = spec in ("fp32", "none") or native
                enc_s, dec_s = (0.0, 0.0) if plain else bucket_codec_times(codecs, spec, steps, dp, 4 * numel)
                if zero_param_bytes:
                    steps = zero1_steps(steps, numel, zero_param_bytes, dp, reduce_scatter=plain and not copies)
                buckets.append(Bucket(numel, done_bwd / total_bwd if sum(layer_bwd) else 1.0, steps,
                                      enc_s, dec_s, 2 * copy_time(profile, 4 * numel, gpu) if copies else 0.0))
            current = []
    return buckets


def expert_buckets(dense: list[Bucket], layers, layer_bwd, arch, strategy, comp, profile, native: bool,
                   gpu=None, codecs=None) -> list[Bucket]:
    """A stage's buckets when expert parallelism is smaller than data parallelism: the
    dense ones (all ``dp`` replicas) and the routed experts' gradients, bucketed alike but
    all-reduced over their expert-data-parallel group only -- the ``dp / ep`` replicas
    holding the same experts (:func:`perfsim.models.moe.expert_dp_replicas`; Megatron-Core's
    expert data parallel group; DeepSpeed-MoE, Rajbhandari et al. 2022, arXiv:2201.05596,
    Sec. 5), ``experts / ep`` experts' parameters per rank
    (:func:`perfsim.models.moe.expert_params_per_rank`). Both on the stage's one sync stream,
    in the order they become ready (a tie: the dense one first). Under ZeRO-1 each group's
    buckets shard its own optimizer state (:func:`zero1_steps` over the ``dp / ep`` replicas)."""
    group = strategy.replicas // strategy.ep
    moe = expert_layers(arch, layers, strategy.tp, strategy.ep)
    experts = _buckets(moe, layer_bwd, strategy.bucket_bytes, comp, group, profile, native=native, gpu=gpu,
                       copies=strategy.grad_buffer == "bucketed", codecs=codecs,
                       zero_param_bytes=BYTES_PER_VALUE[strategy.precision] if strategy.zero else 0)
    return sorted(dense + [replace(b, stride=strategy.ep) for b in experts], key=lambda b: b.ready_fraction)


def zero1_steps(steps: list[CommStep], numel: int, param_bytes: int, dp: int, reduce_scatter: bool
                ) -> list[CommStep]:
    """A bucket's collectives under ZeRO-1 (Rajbhandari et al. 2020, arXiv:1910.02054,
    Sec. 5.1: each rank updates its ``1/dp`` of the parameters, then they are gathered):
    the gradient exchange, then an all-gather of the updated ``param_bytes``-per-value
    weights (each rank contributes its shard). ``reduce_scatter``: the plain
    all-reduce becomes a reduce-scatter, as in Megatron-LM's distributed optimizer
    over its contiguous buffer (``--use-distributed-optimizer``; PyTorch's
    ``ZeroRedundancyOptimizer`` beside DDP keeps the all-reduce). The gather is
    charged with the sync, before the step: the same total when not overlapped."""
    if reduce_scatter:
        steps = [CommStep(REDUCE_SCATTER, st.nbytes, st.reduce, st.label) if st.kind == ALLREDUCE else st
                 for st in steps]
    return [*steps, CommStep(ALLGATHER, -(-numel * param_bytes // dp), label="zero1 params")]


def bucket_codec_times(profile, spec: str, steps, dp: int, nbytes: float) -> tuple[float, float]:
    """(encode, decode) seconds of one bucket's exchange of ``nbytes`` of fp32 gradients
    (``profile``: the profile, or what prices codecs in its place on another GPU,
    :class:`perfsim.engine.codec_cost.ModelledCodecs`):
    the compressor's own data-parallel path where the profile timed it
    (:meth:`perfsim.profile.Profile.dp_codec_time`: what ``allreduce_mean`` runs around
    its collectives, in concurrent processes), else :func:`codec_passes` full-bucket
    compress / decompress calls."""
    enc, dec = profile.dp_codec_time("encode", spec, nbytes), profile.dp_codec_time("decode", spec, nbytes)
    if enc is not None and dec is not None:
        return enc, dec
    passes = codec_passes(steps, dp)
    return passes[0] * profile.encode_time(spec, nbytes), passes[1] * profile.decode_time(spec, nbytes)


def codec_passes(steps, dp: int) -> tuple[float, float]:
    """(encodes, decodes) of a whole bucket that the runtime performs per sync,
    counted in full-bucket passes (measured: tests/engine/test_fidelity.py counts the
    runtime's codec calls and the elements they touch).

    * 1-bit 3-phase allreduce (an alltoall then an allgather;
      :meth:`perfsim.compression.onebit.OneBit.allreduce_mean`): encode the bucket,
      decode the ``dp`` received chunks (one bucket), re-encode this rank's chunk
      (``1/dp`` of a bucket), decode the ``dp`` gathered chunks (one bucket): 1 + 1/dp
      encodes, 2 decodes;
    * an allgather of payloads (the compressor base class, QSGD, ECQ-SGD, DirectQ):
      one encode, one decode per gathered payload, this rank's included: ``dp``;
    * otherwise (allreduce of codes, MaxNorm family): one of each.
    """
    kinds = {st.kind for st in steps}
    if "alltoall" in kinds and "allgather" in kinds:
        return 1.0 + 1.0 / dp, 2.0
    if "allgather" in kinds:
        return 1.0, float(dp)
    return 1.0, 1.0


def copy_time(profile, nbytes: float, gpu=None) -> float:
    """One copy of ``nbytes`` (gradient bucketing: flatten into the bucket, copy the
    averaged bucket back; PyTorch DDP, arXiv:2006.15704 Sec. 3.2.3): with a GPU
    preset, read + write at its achieved memory bandwidth (its compute curve; a
    profile measured elsewhere does not apply); else the profile's measured fp32
    "codec" (a copy into a fresh buffer), else read + write at
    :data:`FALLBACK_MEMORY_BPS` (V100 HBM2, NVIDIA V100 datasheet: 900 GB/s)."""
    if gpu is not None:
        return 2.0 * nbytes / (gpu.memory_bandwidth_Bps * curve_for(gpu)[0].mem_eff)
    measured = profile.encode_time("fp32", nbytes) if profile is not None else 0.0
    return measured if measured > 0 else 2.0 * nbytes / FALLBACK_MEMORY_BPS
