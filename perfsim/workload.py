"""What is trained: a model as a sequence of layers with costs, and its partition.

A workload comes from

* a preset: the GPT-2 family of :mod:`perfsim.models.specs` (shared with the
  runtime), plus size-only presets of the seeds' other models
  (``deberta-v2-xxlarge``, ``bert-large``, ``resnet50``, ``vgg16``);
* or a workload file (TOML or JSON)::

      name = "my-model"
      tokens_per_sample = 512          # optional, default 1
      tied_values = 51463168           # optional: the last layer's copy of the first's
                                       # table (a tied LM head), see below
      [[layers]]
      name = "block"                   # repeated layers get an index suffix
      count = 24                       # optional, default 1
      params = 12596224
      out_shape = [512, 1024]          # boundary activation, one sample
      flops = 1.3e10                   # forward FLOPs, one sample } at least one
      fwd_s = 0.004                    # forward seconds, one sample } of the two
      bwd_s = 0.008                    # optional (default 2 x fwd_s)

Per-layer compute time per micro-batch, in order of preference: a profile
record for the model and layer (:meth:`perfsim.profile.Profile.compute_time`),
the file's ``fwd_s``/``bwd_s`` times the micro-batch, or forward FLOPs divided
by the profile's effective FLOP rate (backward = 2 x forward, Kaplan et al.
2020, Sec. 2.1).

``tied_values`` counts the values of a tied LM head that the last layer holds as
a copy of the first layer's embedding (already in both layers' ``params``): with
``tied_embedding`` ``sync`` the first and the last stage all-reduce that many
gradient values after the data-parallel sync (:func:`perfsim.engine.plan.tied_sync_bytes`).

The partition is contiguous. By default it minimises the slowest stage's
fwd+bwd time (the linear-partition problem; binary search on the bound with a
greedy fill, exact for contiguous partitions), so the paper's 48-block GPT2-1.5B
on 8 stages gets 6 blocks per stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsim.documents import read_document
from perfsim.errors import ConfigError
from perfsim.hardware import GPUS, check_precision
from perfsim.models.specs import MODEL_SPECS, LayerSpec, check_layer_count, get_model_spec
from perfsim.models.tensor_parallel import check_tp
from perfsim.models.transformer import TRANSFORMER_PRESETS, padded_vocab, resolve_transformer

# --------------------------------------------------------------------- presets


def _transformer_encoder(name: str, n_layer: int, d: int, seq: int, vocab: int,
                         extra_embed: int = 0) -> list[LayerSpec]:
    """BERT/DeBERTa-style encoder: embedding, ``n_layer`` blocks (12d^2 + 13d params,
    FFN width 4d, as GPT-2), a pooler + 2-way classifier head."""
    block_flops = seq * (2 * 12 * d * d + 4 * seq * d)
    layers = [LayerSpec("embed", vocab * d + extra_embed + 2 * d, (seq, d), float(2 * seq * d))]
    layers += [LayerSpec(f"block{i}", 12 * d * d + 13 * d, (seq, d), float(block_flops))
               for i in range(n_layer)]
    layers.append(LayerSpec("head", d * d + d + 2 * d + 2, (2,), float(2 * (d * d + 2 * d))))
    return layers


def _resnet50() -> list[LayerSpec]:
    """ResNet-50 (He et al. 2016, Table 1) at 224x224: stem, 16 bottlenecks, fc.
    Conv FLOPs = 2 x weights x output pixels; BatchNorm adds 2 params per channel."""
    layers = [LayerSpec("stem", 3 * 64 * 49 + 2 * 64, (64, 56, 56), 2.0 * 3 * 64 * 49 * 112 * 112)]
    c_in, hw = 64, 56
    for stage, (mid, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for b in range(blocks):
            if b == 0 and stage > 0:
                hw //= 2
            out = 4 * mid
            w = c_in * mid + 9 * mid * mid + mid * out
            params = w + 2 * (mid + mid + out)
            if b == 0:
                params += c_in * out + 2 * out
                w += c_in * out
            layers.append(LayerSpec(f"layer{stage + 1}.{b}", params, (out, hw, hw), 2.0 * w * hw * hw))
            c_in = out
    layers.append(LayerSpec("fc", 2048 * 1000 + 1000, (1000,), 2.0 * 2048 * 1000))
    return layers


def _vgg16() -> list[LayerSpec]:
    """VGG-16 (Simonyan & Zisserman 2015, config D) at 224x224; pooling folded into
    the conv before it."""
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    layers, c_in, hw, i = [], 3, 224, 0
    for k, c in enumerate(cfg):
        if c == "M":
            continue
        pooled = k + 1 < len(cfg) and cfg[k + 1] == "M"
        out_hw = hw // 2 if pooled else hw
        layers.append(LayerSpec(f"conv{i}", 9 * c_in * c + c, (c, out_hw, out_hw), 2.0 * 9 * c_in * c * hw * hw))
        c_in, hw, i = c, out_hw, i + 1
    for j, (a, b) in enumerate(((512 * 7 * 7, 4096), (4096, 4096), (4096, 1000))):
        layers.append(LayerSpec(f"fc{j}", a * b + b, (b,), 2.0 * a * b))
    return layers


#: size-only presets (the simulator's; the runtime only knows MODEL_SPECS)
SIZE_PRESETS: dict[str, tuple[Any, int]] = {
    # DeBERTa-v2-xxlarge (He et al. 2021): 48 layers, d=1536, vocab 128100,
    # relative-position table 512 x d; sequence 256 (a typical fine-tuning length).
    "deberta-v2-xxlarge": (lambda: _transformer_encoder("deberta-v2-xxlarge", 48, 1536, 256, 128100,
                                                        extra_embed=512 * 1536), 256),
    # BERT-Large (Devlin et al. 2019): 24 layers, d=1024, vocab 30522, 512 positions.
    "bert-large": (lambda: _transformer_encoder("bert-large", 24, 1024, 512, 30522,
                                                extra_embed=512 * 1024 + 2 * 1024), 512),
    "resnet50": (_resnet50, 1),
    "vgg16": (_vgg16, 1),
}


def preset_names() -> list[str]:
    return list(MODEL_SPECS) + [n for n in TRANSFORMER_PRESETS] + [n for n in SIZE_PRESETS
                                                                  if n not in TRANSFORMER_PRESETS]


# --------------------------------------------------------------------- model


@dataclass(frozen=True)
class Model:
    """Layers of a model and, optionally, per-sample times from a workload file."""

    name: str
    layers: tuple[LayerSpec, ...]
    tokens_per_sample: int = 1
    fwd_s: tuple[float | None, ...] | None = None  # per sample, from a workload file
    bwd_s: tuple[float | None, ...] | None = None
    arch: Any = None  # perfsim.models.transformer.TransformerSpec of a transformer
    tied_values: int = 0  # a workload file's tied LM head: values of its embedding copy

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)


def get_model(name: str, seq_len: int | None = None) -> Model:
    """A model by preset name (GPT-2 family, GPT-3, LLaMA-2, BERT; size-only presets),
    inline spec (``gpt:layers=..``) or Hugging Face ``config.json`` path; ``seq_len``
    overrides a transformer's sequence length."""
    arch = resolve_transformer(str(name), seq_len)
    if arch is not None:
        return Model(arch.name, tuple(arch.layers()), arch.tokens_per_sample, arch=arch)
    if seq_len:
        raise ConfigError(f"seq_len={seq_len}: model {name!r} is not a transformer")
    key = str(name).lower()
    if key in MODEL_SPECS:
        spec = get_model_spec(key)
        return Model(spec.name, tuple(spec.layers()), spec.tokens_per_sample)
    if key in SIZE_PRESETS:
        build, tokens = SIZE_PRESETS[key]
        return Model(key, tuple(build()), tokens)
    raise ConfigError(f"model {name!r}: unknown preset (known: {', '.join(preset_names())})")


_LAYER_KEYS = {"name", "count", "params", "out_shape", "flops", "fwd_s", "bwd_s"}


def load_workload_file(path: str | Path) -> Model:
    """Read a TOML or JSON workload file (format in the module docstring)."""
    p = Path(path)
    where = f"workload {str(p)!r}"
    data = read_document(p, "workload", kind="json" if p.suffix.lower() == ".json" else "toml")
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: top level must be a table/object")
    unknown = set(data) - {"name", "tokens_per_sample", "tied_values", "layers"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    entries = data.get("layers")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: needs a non-empty 'layers' list")
    total = 0
    for i, e in enumerate(entries):  # the size first: nothing is built for a file over the limit
        count = e.get("count", 1) if isinstance(e, dict) else 1
        total += count if isinstance(count, int) and not isinstance(count, bool) else 1
        check_layer_count(total, f"{where}: layers[{i}]" + (f".count={count}" if count != 1 else ""))
    layers, fwd, bwd = [], [], []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ConfigError(f"{where}: layers[{i}] is not a table")
        bad = set(e) - _LAYER_KEYS
        if bad:
            raise ConfigError(f"{where}: layers[{i}] unknown key(s) {sorted(bad)}")
        for k in ("params", "out_shape"):
            if k not in e:
                raise ConfigError(f"{where}: layers[{i}] lacks {k!r}")
        count = e.get("count", 1)
        shape = e["out_shape"]
        if not isinstance(count, int) or count < 1:
            raise ConfigError(f"{where}: layers[{i}].count={count!r} must be an integer >= 1")
        if (not isinstance(shape, list) or not shape
                or any(not isinstance(d, int) or d < 1 for d in shape)):
            raise ConfigError(f"{where}: layers[{i}].out_shape={shape!r} must be a list of positive integers")
        for k in ("params", "flops", "fwd_s", "bwd_s"):
            v = e.get(k, 0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{where}: layers[{i}].{k}={v!r} must be a number >= 0")
        base = str(e.get("name", f"layer{i}"))
        if "fwd_s" not in e and "flops" not in e:  # it would be silently free
            raise ConfigError(f"{where}: layers[{i}] ({base!r}) has neither fwd_s nor flops; give one "
                              "(flops = 0 marks a layer free on purpose)")
        for j in range(count):
            layers.append(LayerSpec(base if count == 1 else f"{base}{j}", int(e["params"]),
                                    tuple(shape), float(e.get("flops", 0.0))))
            f = e.get("fwd_s")
            fwd.append(None if f is None else float(f))
            b = e.get("bwd_s")
            bwd.append(None if b is None and f is None else float(b if b is not None else 2 * f))
    tokens = data.get("tokens_per_sample", 1)
    if not isinstance(tokens, int) or tokens < 1:
        raise ConfigError(f"{where}: tokens_per_sample={tokens!r} must be an integer >= 1")
    tied = data.get("tied_values", 0)
    if not isinstance(tied, int) or isinstance(tied, bool) or not 0 <= tied <= min(layers[0].params, layers[-1].params):
        raise ConfigError(f"{where}: tied_values={tied!r} must be an integer from 0 to the first and the "
                          "last layer's params (the head's copy of the embedding)")
    name = str(data.get("name", p.stem))
    has_times = any(t is not None for t in fwd)
    return Model(name, tuple(layers), tokens, tuple(fwd) if has_times else None,
                 tuple(bwd) if has_times else None, tied_values=tied)


#: a record's dtype (torch's name as calibrate writes it, or the short name) -> precision
_DTYPES = {"float32": "fp32", "fp32": "fp32", "float16": "fp16", "fp16": "fp16", "bfloat16": "bf16", "bf16": "bf16"}


def _measured(profile, model: Model, layer: str, micro_batch: int, op: str, precision: str) -> float | None:
    """A profile's record of the layer at this precision, or None. A record of 0 s is
    not a measurement, unless it says ``folded`` (the layer's time is counted in its
    stage's other layers: the paper-derived default folds embed / head into its equal
    stages, ``traces/make_default_profile.py``), then it is 0 s."""
    if profile is None:
        return None
    recs = profile.select(f"layer_{op}", model=model.name, name=layer)
    if not recs or any(_DTYPES.get(str(r.get("dtype") or "fp32"), r.get("dtype")) != precision for r in recs):
        return None
    t = profile.compute_time(model.name, layer, micro_batch, op)
    if not t and all(r.get("folded") for r in recs):
        return 0.0
    return t if t else None


def _profile_gpu(profile):
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


def _recomputed(model: Model, layer, fwd_s: float, recompute: str) -> float:
    """Backward seconds added by recomputing a block whose forward takes ``fwd_s``
    (measured, not modelled): all of it (``full``), or the attention core's FLOP share
    ``4 T^2 d / flops_fwd`` (``selective``, Korthikanti et al. 2022, arXiv:2205.05198)."""
    if recompute == "full":
        return fwd_s
    if recompute == "selective":
        if model.arch is None or not layer.flops_fwd:
            raise ConfigError(f"recompute=selective: model {model.name!r} is not a transformer")
        a = model.arch
        return fwd_s * 4 * a.seq_len * a.seq_len * a.q_dim / layer.flops_fwd
    return 0.0


def _tp_from_profile(model: Model, profile, micro_batch: int, tp: int, sp: bool, recompute: str
                     ) -> tuple[list[float], list[float], str] | None:
    """One tensor-parallel rank's layer times from a profile's single-rank fp32
    records (a CPU profile, no GPU preset): every block's measured time times
    :func:`perfsim.engine.compute.tp_measured_split`'s factor; the embedding and
    the LM head as measured, replicated on every TP rank as ``perfsim run --tp``
    keeps them (:mod:`perfsim.runtime.tensor_parallel`). None when the profile
    lacks a record of some layer (the caller then needs a GPU preset)."""
    from perfsim.engine.compute import tp_measured_split

    times = [(_measured(profile, model, layer.name, micro_batch, "fwd", "fp32"),
              _measured(profile, model, layer.name, micro_batch, "bwd", "fp32")) for layer in model.layers]
    if any(f is None for f, _ in times) or model.layers[0].name != "embed":
        return None
    check_tp(model.arch, tp)
    blocks = [i for i, layer in enumerate(model.layers) if layer.name.startswith("block")]
    block_fwd = sum(times[i][0] for i in blocks) / len(blocks)
    factor, mem_rate, gemm_rate = tp_measured_split(model.arch, micro_batch, tp, sp, times[0][0], block_fwd)
    fwd, bwd = [], []
    for i, (layer, (f, b)) in enumerate(zip(model.layers, times)):
        b = b if b is not None else 2.0 * f
        if i in blocks:
            f, b = f * factor, b * factor
            b += _recomputed(model, layer, f, recompute)
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
                        host_overhead_s: float | None = None, routing=None
                        ) -> tuple[list[float], list[float], str]:
    """Forward and backward seconds of every layer for one micro-batch on one
    tensor-parallel rank, and a sentence saying where they come from.

    Order of preference per layer: the profile's record at this precision
    (``tp == 1``, no ``gpu`` named other than the profile's); the workload file's
    times; the operator compute model of ``gpu`` (:mod:`perfsim.engine.compute`; the
    profile's own GPU when it names a preset and the precision differs from its
    records); else the layer's FLOPs at the profile's effective FLOP rate plus its
    bytes (its operators' for a transformer, else weights, input and output) at the
    profile's memory bandwidth. A layer
    with neither a time nor FLOPs is an error: nothing is charged 0 s silently.
    ``vocab_multiple``: the operator model pads the vocabulary to a multiple of this
    times ``tp``, as Megatron-LM does (:data:`perfsim.models.transformer.MEGATRON_VOCAB_MULTIPLE`);
    the parameter count stays the model's. ``attention``: the operator model's attention
    kernels (``megatron`` or ``flash``). ``routing``: a MoE model's
    :class:`perfsim.models.moe.Routing` (capacity factor, expert parallelism, imbalance)."""
    from perfsim.engine import compute

    if tp > 1 and gpu is None and precision == "fp32" and model.arch is not None:
        split = _tp_from_profile(model, profile, micro_batch, tp, sequence_parallel, recompute)
        if split is not None:
            return split
    use_profile = tp == 1
    if gpu is None and profile is not None and (precision != "fp32" or not use_profile):
        gpu = _profile_gpu(profile)
        if gpu is None:
            raise ConfigError(f"precision={precision}, tp={tp}: the profile was measured otherwise and "
                              "names no known GPU; give --gpu")
    modelled = None
    source = "profile"
    if gpu is not None:
        check_precision(gpu, precision)
        curve, source = compute.curve_for(gpu, host_overhead_s)
        rates = compute.measured_rates(profile, precision)
        if rates is not None:
            source = (f"operator rates measured in the profile ({len(rates.gemm)} GEMMs, "
                      f"{len(rates.memory)} memory-bound points, {precision}); host time per operator "
                      f"from the curve ({source})")
        if model.arch is not None:
            check_tp(model.arch, tp)

            modelled = compute.transformer_times(padded_vocab(model.arch, vocab_multiple * tp), gpu, precision,
                                                 micro_batch, tp,
                                                 sequence_parallel, recompute, curve, rates, attention,
                                                 routing)
        else:
            if tp > 1:
                raise ConfigError(f"tp={tp}: model {model.name!r} is not a transformer")
            modelled = compute.generic_times(model.layers, gpu, precision, micro_batch, curve)
    rate = profile.effective_flops() if profile is not None else None
    mem_bw = (profile.metadata.get("memory_bandwidth_Bps") if profile is not None else None) or 900e9
    fwd, bwd = [], []
    measured = 0
    for i, layer in enumerate(model.layers):
        f = _measured(profile, model, layer.name, micro_batch, "fwd", precision) if use_profile else None
        b = _measured(profile, model, layer.name, micro_batch, "bwd", precision) if use_profile else None
        measured += f is not None
        if f is None and model.fwd_s is not None and model.fwd_s[i] is not None and use_profile:
            f, b = model.fwd_s[i] * micro_batch, model.bwd_s[i] * micro_batch
        if f is None and modelled is not None:
            f, b = modelled[0][i], modelled[1][i]
        elif f is not None and recompute != "none" and layer.name.startswith("block"):
            b = (b if b is not None else 2.0 * f) + _recomputed(model, layer, f, recompute)
        if f is None:
            if not layer.flops_fwd:
                raise ConfigError(f"model {model.name!r}: layer {layer.name!r} has neither a time nor FLOPs")
            if not rate:
                raise ConfigError(f"model {model.name!r}: no compute time for layer {layer.name!r} "
                                  "(profile has neither a record nor an effective FLOP rate)")
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
            b = 2.0 * f + (_recomputed(model, layer, f, recompute) if layer.name.startswith("block") else 0.0)
        fwd.append(float(f))
        bwd.append(float(b))
    if measured and modelled is not None:  # measured times win where the profile has them
        source = ("profile's per-layer records" if measured == len(model.layers) else
                  f"profile's per-layer records ({measured} of {len(model.layers)} layers), the rest: {source}")
    return fwd, bwd, source


# --------------------------------------------------------------------- partition


# The partition algorithm lives in perfsim.partition, shared with the runtime.
from perfsim.partition import partition_weights as partition  # noqa: E402
