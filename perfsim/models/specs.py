"""Model specs: what every description of a model's shape provides (:class:`ModelSpec`).

The simulator reads layer parameter counts and boundary activation shapes from a
spec; the runtime (``perfsim.runtime``) builds its torch modules from the same
spec, so ``perfsim predict --model gpt2-tiny`` and ``perfsim run --model
gpt2-tiny`` describe the same job. The specs: any transformer
(:class:`perfsim.models.transformer.TransformerSpec`; GPT-2, the runtime's GPT, LLaMA,
BERT, mixtures of experts, a config.json), a plain MLP (:class:`MLPSpec`), a model known
only by its layers' sizes (:class:`perfsim.models.size_only.SizeSpec`); every preset name
is in one registry (:mod:`perfsim.models.registry`).

A model is a sequence of *layers* (the unit a pipeline partition splits):
for GPT-2, the token+position embedding, ``n_layer`` transformer blocks and the
final norm + LM head; for an MLP, each Linear(+activation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from perfsim.errors import ConfigError

#: the most layers a model may have (a transformer's blocks, a workload file's layers
#: with their counts): checked before any layer is built, so a typo such as
#: ``count = 100000000`` is one line, not gigabytes of memory (docs/formats.md). Ten
#: times the deepest transformer trained so far (DeepNet, 1,000 layers: Wang et al.,
#: "DeepNet: Scaling Transformers to 1,000 Layers", arXiv:2203.00555)
MAX_LAYERS = 10_000


def check_layer_count(n: int, what: str) -> None:
    """Refuse more than :data:`MAX_LAYERS` layers; ``what`` names the culprit."""
    if n > MAX_LAYERS:
        raise ConfigError(f"{what}: {n} layers in all, more than perfsim takes ({MAX_LAYERS}; "
                          "perfsim.models.specs.MAX_LAYERS)")


def check_positive_ints(owner: str, obj, names) -> None:
    """ConfigError naming ``owner`` and the field unless each of ``obj``'s ``names`` is an integer >= 1
    (a bool is not one)."""
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{owner} {name}={v!r}: must be an integer >= 1")


def block_index(name: str) -> int | None:
    """The transformer block index of layer ``name``: ``block3`` -> 3, and a multi-token
    prediction module ``mtp61`` -> 61 (its transformer block follows the model's ``n_layer``
    blocks, as a Hugging Face checkpoint numbers it: DeepSeek-V3's ``model.layers.61``); None for
    any other layer."""
    for prefix in ("block", "mtp"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return int(name[len(prefix):])
    return None


def is_block(name: str) -> bool:
    """Layer ``name`` holds a transformer block (what recomputation re-runs, tensor parallelism
    splits and a MoE block's experts live in): ``block*``, and a multi-token prediction module
    (``mtp<i>``, :func:`block_index`)."""
    return name.startswith("block") or (name.startswith("mtp") and name[3:].isdigit())


@dataclass(frozen=True)
class LayerSpec:
    """One partitionable layer.

    name: e.g. ``block3``.
    params: number of trainable parameters.
    out_shape: shape of its output activation for ONE sample (batch dim excluded),
      which is what crosses a pipeline boundary placed after this layer.
    flops_fwd: forward FLOPs for one sample (2 per multiply-add); backward is
      taken as 2x forward (Kaplan et al. 2020), a fallback when no profile
      gives measured times.
    tensors: the shapes of the layer's parameter tensors where the model knows them
      (an MLP's weight and bias), for compressors that treat each tensor apart
      (PowerSGD); empty: one ``(out features, rest)`` matrix stands for the layer.
    """

    name: str
    params: int
    out_shape: tuple[int, ...]
    flops_fwd: float
    tensors: tuple[tuple[int, ...], ...] = ()


@runtime_checkable
class ModelSpec(Protocol):
    """A model's shape as the simulator, the runtime and the memory model read it: its
    name, the tokens one sample holds, and its partitionable layers."""

    #: preset name (or an inline spec's text)
    name: str

    @property
    def tokens_per_sample(self) -> int:
        """Tokens of one sample (a transformer's sequence length; 1 for an MLP or a CNN)."""
        ...

    def layers(self) -> list[LayerSpec]:
        """The partitionable layers, in order."""
        ...


@dataclass(frozen=True)
class MLPSpec:
    """A plain MLP classifier: Linear+ReLU layers, the last Linear without ReLU."""

    name: str
    sizes: tuple[int, ...]  # input, hidden..., classes
    kind: str = field(default="mlp", init=False)

    def __post_init__(self):
        if len(self.sizes) < 2 or any(s < 1 for s in self.sizes):
            raise ConfigError(f"{self.name}.sizes={self.sizes}: need >= 2 positive sizes")

    def layers(self) -> list[LayerSpec]:
        return [LayerSpec(f"fc{i}", a * b + b, (b,), float(2 * a * b), tensors=((b, a), (b,)))
                for i, (a, b) in enumerate(zip(self.sizes[:-1], self.sizes[1:]))]

    @property
    def tokens_per_sample(self) -> int:
        return 1
