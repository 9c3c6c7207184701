"""Torch modules built from a preset's spec (:mod:`perfsim.models.registry`), split into pipeline stages.

The runtime and the simulator read the same spec and the same partition
(:func:`perfsim.partition.partition_model`), so a stage here holds exactly the
layers the simulator puts on it.

GPT: GPT-2-style pre-LN decoder (Radford et al. 2019; layout as nanoGPT):
``embed`` = token + learned position embedding, ``block<i>`` =
``x + attn(ln1(x))`` then ``x + mlp(ln2(x))`` with causal self-attention and a
GELU MLP of width 4d, ``head`` = final LayerNorm + LM head. The LM head has its
own ``V*d`` weight (32k parameters for the byte-level presets): *untied* from the
token embedding by default, so stages stay independent; ``tied=True`` starts it as
a copy of the embedding's table, which :mod:`perfsim.runtime.tied` then keeps equal
(Megatron's tied embedding across pipeline stages).

MLP (``digits-mlp``): Linear+ReLU per layer, the last Linear without ReLU.

Initialisation is per layer from ``(seed, layer index)``, so the weights do not
depend on how the model is partitioned: ``pp=1`` and ``pp=4`` start from the
same model. Init follows GPT-2 (normal std 0.02, residual projections scaled by
``1/sqrt(2 n_layer)``).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from perfsim.errors import ConfigError
from perfsim.models.specs import MLPSpec, ModelSpec
from perfsim.models.transformer import TransformerSpec
from perfsim.partition import partition_model


def check_gpt(spec: TransformerSpec) -> None:
    """ConfigError unless the runtime's GPT modules below build ``spec`` exactly: a
    GPT-2-style decoder (:data:`perfsim.models.transformer.ARCHS` ``gpt``), MLP width 4 d,
    multi-head attention of ``hidden / heads`` wide heads over the whole causal prefix, a dense
    MLP, no multi-token prediction module."""
    if (spec.arch != "gpt" or spec.encoder or spec.moe or spec.ffn != 4 * spec.hidden
            or spec.kv_heads != spec.heads or spec.head_dim * spec.heads != spec.hidden or spec.mla
            or spec.sliding_window or spec.attention_chunk or spec.mtp_layers):
        raise ConfigError(f"model {spec.name!r}: the runtime builds GPT-2-style decoders only "
                          "(gpt arch, ffn 4 x hidden, multi-head attention over the whole prefix, no experts, "
                          "no multi-token prediction)")


class Embed(nn.Module):
    def __init__(self, spec: TransformerSpec):
        super().__init__()
        self.tok = nn.Embedding(spec.vocab, spec.hidden)
        self.pos = nn.Embedding(spec.seq_len, spec.hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        return self.tok(idx) + self.pos(pos)[None]


class Block(nn.Module):
    def __init__(self, spec: TransformerSpec):
        super().__init__()
        d = spec.hidden
        self.n_head = spec.heads
        self.head_dim = spec.head_dim
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        # [q; k; v] of this rank's heads: all heads, or n_head / tp under tensor
        # parallelism (perfsim.runtime.tensor_parallel), where t may be a sequence slice
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=2)
        shape = (b, q.shape[1], -1, self.head_dim)
        q, k, v = (z.reshape(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).flatten(2))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, spec: TransformerSpec):
        super().__init__()
        self.ln_f = nn.LayerNorm(spec.hidden)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class Dense(nn.Module):
    def __init__(self, n_in: int, n_out: int, relu: bool):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return F.relu(y) if self.relu else y


def _init_gpt_layer(module: nn.Module, spec: TransformerSpec, gen: torch.Generator) -> None:
    resid_std = 0.02 / math.sqrt(2 * spec.n_layer)
    for name, p in module.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif name.startswith("ln"):  # ln1, ln2, ln_f: LayerNorm weight = 1
            nn.init.ones_(p)
        else:
            std = resid_std if name.split(".")[0] in ("proj", "fc_proj") else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def _init_dense(module: Dense, gen: torch.Generator) -> None:
    # PyTorch's default Linear init (Kaiming-uniform, a=sqrt(5)) drawn from `gen`
    w, b = module.linear.weight, module.linear.bias
    bound = 1.0 / math.sqrt(w.shape[1])
    with torch.no_grad():
        w.copy_((torch.rand(w.shape, generator=gen) * 2 - 1) * bound)
        b.copy_((torch.rand(b.shape, generator=gen) * 2 - 1) * bound)


def build_layer(spec: ModelSpec, index: int, seed: int) -> nn.Module:
    """Layer ``index`` of ``spec.layers()`` as a torch module, initialised from
    ``(seed, index)``."""
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + index)
    if isinstance(spec, TransformerSpec):
        check_gpt(spec)
        n = len(spec.layers())
        if index == 0:
            layer = Embed(spec)
        elif index == n - 1:
            layer = Head(spec)
        else:
            layer = Block(spec)
        _init_gpt_layer(layer, spec, gen)
        return layer
    if isinstance(spec, MLPSpec):
        sizes = spec.sizes
        layer = Dense(sizes[index], sizes[index + 1], relu=index < len(sizes) - 2)
        _init_dense(layer, gen)
        return layer
    raise ConfigError(f"model {getattr(spec, 'name', spec)!r}: the runtime builds only GPT and MLP specs")


class Stage(nn.Module):
    """The layers ``[start, end)`` of a model: one pipeline stage."""

    def __init__(self, spec: ModelSpec, start: int, end: int, seed: int, tied: bool = False):
        super().__init__()
        self.spec, self.start, self.end = spec, start, end
        self.layers = nn.ModuleList(build_layer(spec, i, seed) for i in range(start, end))
        self.is_first = start == 0
        self.is_last = end == len(spec.layers())
        if tied and self.is_last:
            if not isinstance(spec, TransformerSpec):
                raise ConfigError(f"model {spec.name!r}: only a GPT model has an embedding to tie")
            embed = self.layers[0] if self.is_first else build_layer(spec, 0, seed)
            with torch.no_grad():  # the head starts as a copy of the token table
                self.layers[-1].lm_head.weight.copy_(embed.tok.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy (next byte for GPT, class for MLP)."""
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def build_stages(spec: ModelSpec, num_stages: int, seed: int, by: str = "params", tied: bool = False) -> list[Stage]:
    """All stages of ``spec`` partitioned as the simulator partitions it."""
    return [Stage(spec, a, b, seed, tied) for a, b in partition_model(spec, num_stages, by)]


def build_stage(spec: ModelSpec, num_stages: int, stage: int, seed: int, by: str = "params", tied: bool = False) -> Stage:
    """Only stage ``stage`` (what one pipeline rank holds)."""
    a, b = partition_model(spec, num_stages, by)[stage]
    return Stage(spec, a, b, seed, tied)


def boundary_shape(spec, stage_module: Stage, micro_batch: int) -> tuple[int, ...]:
    """Shape of the activation stage ``stage_module`` sends downstream."""
    return (micro_batch, *spec.layers()[stage_module.end - 1].out_shape)
