"""Per-layer compute time of a workload: measured where a profile has it, priced otherwise.

For every layer of a :class:`perfsim.workload.Model`, in order of preference: a profile
record for the model and layer at this precision (:meth:`perfsim.profile.Profile.compute_time`),
the workload file's ``fwd_s``/``bwd_s`` times the micro-batch, the operator compute model of
a GPU preset (:mod:`perfsim.engine.compute`: the model's operator lists,
:mod:`perfsim.models.ops`, priced with the GPU's curve), or forward FLOPs divided by the
profile's effective FLOP rate (backward = 2 x forward, Kaplan et al. 2020, arXiv:2001.08361,
Sec. 2.1).
"""

from __future__ import annotations

from perfsim.engine import compute
from perfsim.errors import ConfigError
from perfsim.hardware import check_precision, curve_for, profile_gpu, same_silicon
from perfsim.models.registry import get_model_spec
from perfsim.models.specs import is_block
from perfsim.models.tensor_parallel import check_tp
from perfsim.models.transformer import padded_vocab
from perfsim.workload import Model


def measured_shape(profile, name: str, arch) -> bool:
    """Whether ``profile``'s compute records of model ``name`` (per layer, per whole stage)
    time a model of ``arch``'s sequence length. ``perfsim calibrate`` times a registry preset
    at the preset's own ``seq_len`` (it has no flag for another), so a ``--seq-len`` that
    differs makes another model for those records: it is priced as an unmeasured model is,
    never by a measurement of other shapes."""
    if profile is None or arch is None:
        return True
    try:
        spec = get_model_spec(name)
    except ConfigError:  # not a preset (a config.json, a workload): its records are its own
        return True
    return getattr(spec, "seq_len", arch.seq_len) == arch.seq_len


def _measured(profile, model: Model, layer: str, micro_batch: int, op: str, precision: str) -> float | None:
    """A profile's record of the layer at this precision, or None. A record of 0 s is
    not a measurement, unless it says ``folded`` (the layer's time is counted in its
    stage's other layers: the paper-derived default folds embed / head into its equal
    stages, ``traces/make_default_profile.py``), then it is 0 s."""
    if profile is None or not measured_shape(profile, model.name, model.arch):
        return None
    recs = profile.select(f"layer_{op}", model=model.name, name=layer)
    if not recs or any(compute.PROFILE_DTYPES.get(str(r.get("dtype") or "fp32"), r.get("dtype")) != precision for r in recs):
        return None
    t = profile.compute_time(model.name, layer, micro_batch, op)
    if not t and all(r.get("folded") for r in recs):
        return 0.0
    return t if t else None


def _recomputed(model: Model, layer, fwd_s: float, recompute: str) -> float:
    """Backward seconds added by recomputing a block whose forward takes ``fwd_s``
    (measured, not modelled): all of it (``full``), or the attention core's FLOP share
    ``2 T^2 (q_dim + out_dim) / flops_fwd``, ``4 T^2 d`` without MLA (``selective``, Korthikanti
    et al. 2022, arXiv:2205.05198)."""
    if recompute == "full":
        return fwd_s
    if recompute == "selective":
        if model.arch is None or not layer.flops_fwd:
            raise ConfigError(f"recompute=selective: model {model.name!r} is not a transformer")
        a = model.arch
        return fwd_s * 2 * a.seq_len * a.seq_len * (a.q_dim + a.out_dim) / layer.flops_fwd
    return 0.0


def timed_recompute(profile, model: Model, layer: str) -> str:
    """The recomputation a layer's measured backward already contains: its ``layer_bwd``
    records' ``recompute`` fact (absent: ``none``). The default profile's blocks say
    ``full``: the AQ-SGD paper's code checkpoints every block, and its measured backward
    is 3x its forward (``traces/make_default_profile.py``). Records that disagree are refused."""
    kinds = {r.get("recompute") or "none" for r in profile.select("layer_bwd", model=model.name, name=layer)}
    if len(kinds) > 1:
        raise ConfigError(f"profile: the layer_bwd records of {model.name} {layer} were timed with different "
                          f"recomputation ({', '.join(sorted(kinds))}); keep one")
    return kinds.pop() if kinds else "none"


def _with_recompute(model: Model, profile, layer, f: float, b: float | None, recompute: str) -> float:
    """A block's backward under ``recompute`` from its measured forward ``f`` and backward
    ``b`` (None: 2 x ``f``): the recomputation the measurement contains
    (:func:`timed_recompute`) taken out, the wanted one added."""
    timed = timed_recompute(profile, model, layer.name) if b is not None else "none"
    if b is None:
        b = 2.0 * f
    if timed == recompute:
        return b
    bare = b - _recomputed(model, layer, f, timed)
    if bare <= 0:
        raise ConfigError(f"profile: {model.name} {layer.name}'s backward ({b:.4g} s) is not longer than the "
                          f"{timed} recomputation its record says it contains ({b - bare:.4g} s)")
    return bare + _recomputed(model, layer, f, recompute)


def _tp_from_profile(model: Model, profile, micro_batch: int, tp: int, sp: bool, recompute: str
                     ) -> tuple[list[float], list[float], str] | None:
    """One tensor-parallel rank's layer times from a profile's single-rank fp32
    records (a CPU profile, no GPU preset): every block's measured time times
    :func:`perfsim.engine.compute.tp_measured_split`'s factor; the embedding and
    the LM head as measured, replicated on every TP rank as ``perfsim run --tp``
    keeps them (:mod:`perfsim.runtime.tensor_parallel`). None when the profile
    lacks a record of some layer (the caller then needs a GPU preset)."""
    times = [(_measured(profile, model, layer.name, micro_batch, "fwd", "fp32"),
              _measured(profile, model, layer.name, micro_batch, "bwd", "fp32")) for layer in model.layers]
    if any(f is None for f, _ in times) or model.layers[0].name != "embed":
        return None
    check_tp(model.arch, tp)
    blocks = [i for i, layer in enumerate(model.layers) if is_block(layer.name)]
    block_fwd = sum(times[i][0] for i in blocks) / len(blocks)
    factor, mem_rate, gemm_rate = compute.tp_measured_split(model.arch, micro_batch, tp, sp, times[0][0], block_fwd)
    fwd, bwd = [], []
    for i, (layer, (f, b)) in enumerate(zip(model.layers, times)):
        if i in blocks:
            b = _with_recompute(model, profile, layer, f, b, recompute)
            f, b = f * factor, b * factor
        else:
            b = b if b is not None else 2.0 * f
        fwd.append(float(f))
        bwd.append(float(b))
    source = (f"profile's single-rank records split for tp={tp}{' with sequence parallelism' if sp else ''}: "
              f"blocks x {factor:.3f} (GEMMs and attention 1/tp; memory-bound ops at the embedding's "
              f"{mem_rate / 1e9:.3g} GB/s, GEMMs at the block's remaining {gemm_rate / 1e9:.3g} GFLOP/s), "
              "embedding and LM head replicated")
    return fwd, bwd, source


def layer_times(model: Model, profile, micro_batch: int, **kw) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of every layer for one micro-batch
    (:func:`resolve_layer_times` without the source sentence)."""
    fwd, bwd, _ = resolve_layer_times(model, profile, micro_batch, **kw)
    return fwd, bwd


def resolve_layer_times(model: Model, profile, micro_batch: int, *, gpu=None, precision: str = "fp32",
                        tp: int = 1, sequence_parallel: bool = False, recompute: str = "none",
                        vocab_multiple: int = 1, attention: str = "megatron",
                        host_overhead_s: float | None = None, routing=None, kernels: str = "fused",
                        grad_acc=None, fp8_casts: str = "te") -> tuple[list[float], list[float], str]:
    """Forward and backward seconds of every layer for one micro-batch on one
    tensor-parallel rank, and a sentence saying where they come from.

    Order of preference per layer: the profile's record at this precision
    (``tp == 1``, no ``gpu`` named other than the profile's: :func:`perfsim.hardware.same_silicon`;
    the same holds for its measured operator rates); the workload file's
    times; the operator compute model of ``gpu`` (:mod:`perfsim.engine.compute`; the
    profile's own GPU when it names a preset and the precision differs from its
    records); else the layer's FLOPs at the profile's effective FLOP rate plus its
    bytes (its operators' for a transformer, else weights, input and output) at the
    profile's memory bandwidth. A layer
    with neither a time nor FLOPs is an error: nothing is charged 0 s silently.
    ``vocab_multiple``: the operator model pads the vocabulary to a multiple of this
    times ``tp``, as Megatron-LM does (:data:`perfsim.models.transformer.MEGATRON_VOCAB_MULTIPLE`);
    the parameter count stays the model's. ``attention``: the operator model's attention
    kernels (``megatron`` or ``flash``); ``kernels``: ``fused`` (Megatron-LM's) or ``eager`` (plain
    PyTorch, :mod:`perfsim.models.eager`) memory-bound operators. ``routing``: a MoE model's
    :class:`perfsim.models.moe.Routing` (capacity factor, expert parallelism, imbalance);
    ``grad_acc``: the operator model's gradient accumulation per micro-batch
    (:class:`perfsim.models.ops.GradAccumulation`; None: fused, nothing beyond the embedding's);
    ``fp8_casts``: Transformer Engine's quantisation kernels under fp8
    (:func:`perfsim.engine.compute.transformer_times`)."""
    if tp > 1 and gpu is None and precision == "fp32" and model.arch is not None:
        split = _tp_from_profile(model, profile, micro_batch, tp, sequence_parallel, recompute)
        if split is not None:
            return split
    # the profile's measurements describe its own device: a GPU named other than it is priced
    # by its own model, never by another device's records or rates
    foreign = gpu is not None and profile is not None and not same_silicon(profile_gpu(profile), gpu)
    use_profile = tp == 1 and not foreign
    if gpu is None and profile is not None and (precision != "fp32" or not use_profile):
        gpu = profile_gpu(profile)
        if gpu is None:
            raise ConfigError(f"precision={precision}, tp={tp}: the profile was measured otherwise and "
                              "names no known GPU; give --gpu")
    modelled = None
    source = "profile"
    if gpu is not None:
        check_precision(gpu, precision)
        curve, source = curve_for(gpu, host_overhead_s)
        rates = None if foreign else compute.measured_rates(profile, precision)
        if rates is not None:
            source = (f"operator rates measured in the profile ({len(rates.gemm)} GEMMs, "
                      f"{len(rates.memory)} memory-bound points, {precision}); host time per operator "
                      f"from the curve ({source})")
        if model.arch is not None:
            check_tp(model.arch, tp)
            modelled = compute.transformer_times(padded_vocab(model.arch, vocab_multiple * tp), gpu, precision,
                                                 micro_batch, tp,
                                                 sequence_parallel, recompute, curve, rates, attention,
                                                 routing, kernels, grad_acc, fp8_casts)
        else:
            if tp > 1:
                raise ConfigError(f"tp={tp}: model {model.name!r} is not a transformer")
            modelled = compute.generic_times(model.layers, gpu, precision, micro_batch, curve)
    rate = profile.effective_flops() if profile is not None else None
    mem_bw = (profile.metadata.get("memory_bandwidth_Bps") if profile is not None else None) or 900e9
    fwd, bwd = [], []
    measured = 0
    timed: set[str] = set()  # the recomputation the measured block backwards contain
    for i, layer in enumerate(model.layers):
        f = _measured(profile, model, layer.name, micro_batch, "fwd", precision) if use_profile else None
        b = _measured(profile, model, layer.name, micro_batch, "bwd", precision) if use_profile else None
        measured += f is not None
        from_profile = f is not None
        if f is None and model.fwd_s is not None and model.fwd_s[i] is not None and tp == 1:
            f, b = model.fwd_s[i] * micro_batch, model.bwd_s[i] * micro_batch
        if f is None and modelled is not None:
            f, b = modelled[0][i], modelled[1][i]
        elif from_profile and is_block(layer.name):
            if b is not None:
                timed.add(timed_recompute(profile, model, layer.name))
            b = _with_recompute(model, profile, layer, f, b, recompute)
        elif f is not None and recompute != "none" and is_block(layer.name):
            b = (b if b is not None else 2.0 * f) + _recomputed(model, layer, f, recompute)
        if f is None:
            if not layer.flops_fwd:
                raise ConfigError(f"model {model.name!r}: layer {layer.name!r} has neither a time nor FLOPs")
            if not rate and not measured_shape(profile, model.name, model.arch):
                raise ConfigError(f"seq_len={model.arch.seq_len}: the profile times {model.name} at its own "
                                  f"{get_model_spec(model.name).seq_len} tokens and has no FLOP rate to price "
                                  "another length; leave --seq-len out, or give --gpu")
            if not rate:
                own = profile_gpu(profile) if profile is not None else None
                raise ConfigError(f"model {model.name!r}: no compute time for layer {layer.name!r} "
                                  "(profile has neither a record nor an effective FLOP rate); give "
                                  + (f"--gpu {own.name} (the profile's GPU: its operator model, with the "
                                     "profile's measured rates)" if own is not None else
                                     "--gpu, or a profile that times it (perfsim calibrate)"))
            if model.arch is not None:
                moved = compute.layer_bytes(model.arch, layer.name, micro_batch, 4)
            else:
                numel = 1
                for d in layer.out_shape:
                    numel *= d
                moved = 4 * (layer.params + 2 * numel * micro_batch)
            f = layer.flops_fwd * micro_batch / rate + moved / mem_bw
            source = "profile (unmeasured layers from FLOPs and bytes at the profile's rates)"
        if b is None:
            b = 2.0 * f + (_recomputed(model, layer, f, recompute) if is_block(layer.name) else 0.0)
        fwd.append(float(f))
        bwd.append(float(b))
    if measured and modelled is not None:  # measured times win where the profile has them
        source = ("profile's per-layer records" if measured == len(model.layers) else
                  f"profile's per-layer records ({measured} of {len(model.layers)} layers), the rest: {source}")
    timed.discard("none")
    if timed:
        kinds = "/".join(sorted(timed))
        source += (f" (its block backwards were timed with {kinds} recomputation" +
                   (")" if timed == {recompute} else f": taken out, recompute {recompute} priced)"))
    return fwd, bwd, source
