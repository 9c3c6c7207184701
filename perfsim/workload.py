"""What is trained: a model as a sequence of layers with costs, and its partition.

A workload comes from

* a preset of :mod:`perfsim.models.registry` (the runtime's GPT-2 family and MLP, GPT-3,
  LLaMA 2, BERT, Mixtral; size-only presets of the seeds' other models:
  ``deberta-v2-xxlarge``, ``resnet50``, ``vgg16``), an inline transformer or a config.json;
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
      bwd_s = "8ms"                    # optional (default 2 x fwd_s); times take units
                                       # as text ("8ms", perfsim.units), a number is seconds

Per-layer compute time per micro-batch (:mod:`perfsim.engine.layer_times`), in order
of preference: a profile record for the model and layer
(:meth:`perfsim.profile.Profile.compute_time`), the file's ``fwd_s``/``bwd_s`` times the
micro-batch, the operator model of a GPU preset, or forward FLOPs divided by the
profile's effective FLOP rate (backward = 2 x forward, Kaplan et al. 2020, Sec. 2.1).

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

from perfsim.documents import read_document
from perfsim.errors import ConfigError
from perfsim.models.registry import get_spec
from perfsim.models.size_only import SizeSpec
from perfsim.models.specs import LayerSpec, ModelSpec, check_layer_count
from perfsim.models.transformer import TransformerSpec
from perfsim.units import parse_time

# --------------------------------------------------------------------- model


@dataclass(frozen=True)
class Model:
    """A model's spec with its layers built and, from a workload file, per-sample times."""

    #: what the layers come from: a preset's, an inline or config.json transformer's, or a
    #: workload file's layers (a :class:`perfsim.models.size_only.SizeSpec`)
    spec: ModelSpec
    #: ``spec.layers()``, built once
    layers: tuple[LayerSpec, ...]
    fwd_s: tuple[float | None, ...] | None = None  # per sample, from a workload file
    bwd_s: tuple[float | None, ...] | None = None
    tied_values: int = 0  # a workload file's tied LM head: values of its embedding copy

    @classmethod
    def of(cls, spec: ModelSpec, **kw) -> "Model":
        return cls(spec, tuple(spec.layers()), **kw)

    @property
    def name(self) -> str:
        return self.spec.name

    def context_rank(self, cp: int) -> "Model":
        """One context-parallel rank's model (``Strategy.cp``): the transformer's sequence shard
        (:meth:`perfsim.models.transformer.TransformerSpec.context_shard`), whose compute is that rank's;
        itself for ``cp == 1`` or a model that is not a transformer."""
        if cp == 1 or self.arch is None:
            return self
        return Model.of(self.arch.context_shard(cp), tied_values=self.tied_values)

    @property
    def tokens_per_sample(self) -> int:
        return self.spec.tokens_per_sample

    @property
    def arch(self) -> TransformerSpec | None:
        """The transformer's shape (tensor-parallel collectives, activation memory, the
        operator model need it), or None."""
        return self.spec if isinstance(self.spec, TransformerSpec) else None

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)


def get_model(name: str, seq_len: int | None = None) -> Model:
    """A model by preset name (:mod:`perfsim.models.registry`), inline spec
    (``gpt:layers=..``) or Hugging Face ``config.json`` path; ``seq_len`` overrides a
    transformer's sequence length."""
    return Model.of(get_spec(name, seq_len))


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
        for k in ("fwd_s", "bwd_s"):  # a time: a number is seconds, text takes units ("5ms")
            if e.get(k) is not None:
                e = {**e, k: parse_time(e[k], f"{where}: layers[{i}].{k}", hint_unit="s")}
        for k in ("params", "flops"):
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
    built = tuple(layers)
    return Model(SizeSpec(name, tokens, built), built, tuple(fwd) if has_times else None,
                 tuple(bwd) if has_times else None, tied_values=tied)


# --------------------------------------------------------------------- partition


# The partition algorithm lives in perfsim.partition, shared with the runtime.
from perfsim.partition import partition_weights as partition  # noqa: E402
