"""Model specs: the one description of a trainable model's shape.

The simulator reads layer parameter counts and boundary activation shapes from
here; the runtime (``perfsim.runtime``) builds its torch modules from the same
spec, so ``perfsim predict --model gpt2-tiny`` and ``perfsim run --model
gpt2-tiny`` describe the same job.

A model is a sequence of *layers* (the unit a pipeline partition splits):
for GPT-2, the token+position embedding, ``n_layer`` transformer blocks and the
final norm + LM head; for an MLP, each Linear(+activation).

Parameter counts follow the GPT-2 architecture (Radford et al. 2019; nanoGPT's
``GPT.get_num_params``): a block has ``12 d^2 + 13 d`` parameters (attention
qkv+proj ``4d^2 + 4d``, MLP ``8d^2 + 5d``, two LayerNorms ``4d``), the embedding
``V d + T d``; the LM head is tied to the token embedding (counted once, on the
embedding layer) and its final LayerNorm has ``2d``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class GPTSpec:
    """A GPT-2-style decoder (pre-LN blocks, GELU MLP of width 4d, tied head)."""

    name: str
    n_layer: int
    d_model: int
    n_head: int
    seq_len: int
    vocab_size: int
    kind: str = field(default="gpt", init=False)

    def __post_init__(self):
        for f in ("n_layer", "d_model", "n_head", "seq_len", "vocab_size"):
            if getattr(self, f) < 1:
                raise ConfigError(f"{self.name}.{f}={getattr(self, f)}: must be >= 1")
        if self.d_model % self.n_head:
            raise ConfigError(f"{self.name}: d_model={self.d_model} not divisible by n_head={self.n_head}")

    def layers(self) -> list[LayerSpec]:
        d, T, V = self.d_model, self.seq_len, self.vocab_size
        block_params = 12 * d * d + 13 * d
        # matmul flops per token: 2*params(weights) + attention scores 2*2*T*d (causal avg ignored)
        block_flops = T * (2 * 12 * d * d + 4 * T * d)
        out = [LayerSpec("embed", V * d + T * d, (T, d), float(T * d))]  # the position add
        out += [LayerSpec(f"block{i}", block_params, (T, d), float(block_flops)) for i in range(self.n_layer)]
        out.append(LayerSpec("head", 2 * d, (T, V), float(2 * T * d * V)))
        return out

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len


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


#: Models that both the simulator and the runtime know. The simulator adds
#: size-only presets (BERT, DeBERTa, ResNet, VGG) in ``perfsim.workload``.
MODEL_SPECS: dict[str, GPTSpec | MLPSpec] = {
    s.name: s
    for s in (
        GPTSpec("gpt2-tiny", n_layer=4, d_model=128, n_head=4, seq_len=64, vocab_size=256),
        GPTSpec("gpt2-small-byte", n_layer=8, d_model=256, n_head=8, seq_len=128, vocab_size=256),
        GPTSpec("gpt2", n_layer=12, d_model=768, n_head=12, seq_len=1024, vocab_size=50257),
        GPTSpec("gpt2-medium", n_layer=24, d_model=1024, n_head=16, seq_len=1024, vocab_size=50257),
        GPTSpec("gpt2-large", n_layer=36, d_model=1280, n_head=20, seq_len=1024, vocab_size=50257),
        GPTSpec("gpt2-xl", n_layer=48, d_model=1600, n_head=25, seq_len=1024, vocab_size=50257),
        MLPSpec("digits-mlp", sizes=(64, 256, 256, 256, 10)),
    )
}


def get_model_spec(name: str) -> GPTSpec | MLPSpec:
    """Look a runtime-capable model spec up by preset name."""
    try:
        return MODEL_SPECS[name.lower()]
    except KeyError:
        raise ConfigError(f"model {name!r}: unknown (known: {', '.join(MODEL_SPECS)})") from None
