"""Torch modules for the layers of a model spec, for timing.

Execute mode builds its models in ``perfsim.runtime.models``; when that module
offers per-layer modules we time those (the same code that trains). Otherwise
the layers are built here from :mod:`perfsim.models.specs`, with the same
architecture the spec's parameter counts describe:

* MLP (``MLPSpec``): ``Linear(a, b)`` followed by ReLU, except the last layer.
* GPT-2 (``GPTSpec``, nanoGPT-style pre-LN decoder): ``embed`` = token +
  position embedding; ``block`` = LN -> causal self-attention (fused qkv,
  ``scaled_dot_product_attention``) -> residual, LN -> MLP(4d, GELU) -> residual;
  ``head`` = final LN + LM head (``d x V``, tied to the embedding in the spec's
  parameter count; the timing is the same either way).

The last layer is timed together with the loss (cross-entropy), as the last
pipeline stage computes it in a training step.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from perfsim.errors import ConfigError
from perfsim.models.specs import GPTSpec, MLPSpec


class _Embed(nn.Module):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        self.wte = nn.Embedding(spec.vocab_size, spec.d_model)
        self.wpe = nn.Embedding(spec.seq_len, spec.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.wte(idx) + self.wpe(pos)


class _Block(nn.Module):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        d = spec.d_model
        self.n_head = spec.n_head
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        shape = (B, T, self.n_head, C // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class _Head(nn.Module):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        self.ln = nn.LayerNorm(spec.d_model)
        self.lm = nn.Linear(spec.d_model, spec.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.ln(x))


def _runtime_layers(spec) -> list[nn.Module] | None:
    """Per-layer modules from execute mode, when it exposes them.

    Uses ``perfsim.runtime.models.build_layer(spec, index, seed)`` (the modules
    ``perfsim run`` trains); anything else -> None (build here).
    """
    try:
        from perfsim.runtime import models as rt
    except Exception:  # noqa: BLE001 - runtime not there / not importable yet
        return None
    build = getattr(rt, "build_layer", None)
    if build is None:
        return None
    try:
        return [build(spec, i, 0) for i in range(len(spec.layers()))]
    except Exception:  # noqa: BLE001 - a different signature: fall back
        return None


def build_layers(spec, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
                 prefer_runtime: bool = True) -> tuple[list[nn.Module], str]:
    """One module per layer of ``spec``; returns (modules, source) where source
    is ``"runtime"`` or ``"calibrate"``."""
    torch.manual_seed(0)
    mods = _runtime_layers(spec) if prefer_runtime else None
    source = "runtime"
    if mods is None:
        source = "calibrate"
        if isinstance(spec, MLPSpec):
            mods = []
            n = len(spec.sizes) - 1
            for i, (a, b) in enumerate(zip(spec.sizes[:-1], spec.sizes[1:])):
                mods.append(nn.Sequential(nn.Linear(a, b), nn.ReLU()) if i < n - 1 else nn.Linear(a, b))
        elif isinstance(spec, GPTSpec):
            mods = [_Embed(spec)] + [_Block(spec) for _ in range(spec.n_layer)] + [_Head(spec)]
        else:
            raise ConfigError(f"model {getattr(spec, 'name', spec)!r}: cannot build layers for timing")
    return [m.to(device=device, dtype=dtype).train() for m in mods], source


def layer_input(spec, index: int, micro_batch: int, *, dtype: torch.dtype, device: str,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """A random input for layer ``index`` at ``micro_batch`` samples.

    Layer 0 of a GPT takes token ids; every other layer takes the previous
    layer's output activation (``out_shape`` of layer ``index - 1``), with
    ``requires_grad`` so its backward computes the input gradient that a
    pipeline stage sends upstream.
    """
    layers = spec.layers()
    if index == 0:
        if isinstance(spec, GPTSpec):
            return torch.randint(0, spec.vocab_size, (micro_batch, spec.seq_len), device=device,
                                 generator=generator)
        x = torch.randn((micro_batch, spec.sizes[0]), device=device, dtype=dtype, generator=generator)
        return x
    shape = (micro_batch, *layers[index - 1].out_shape)
    return torch.randn(shape, device=device, dtype=dtype, generator=generator).requires_grad_(True)


def loss_of(spec, out: torch.Tensor, micro_batch: int) -> torch.Tensor:
    """Training loss on the last layer's output (random targets)."""
    if isinstance(spec, GPTSpec):
        tgt = torch.randint(0, spec.vocab_size, (micro_batch * spec.seq_len,), device=out.device)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), tgt)
    tgt = torch.randint(0, out.shape[-1], (micro_batch,), device=out.device)
    return F.cross_entropy(out.float(), tgt)


def activation_bytes(shape: tuple[int, ...], micro_batch: int, dtype: torch.dtype) -> int:
    """Bytes of one micro-batch's activation of per-sample ``shape``."""
    return micro_batch * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
