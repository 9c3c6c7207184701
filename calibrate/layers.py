"""Torch modules for the layers of a model spec, for timing.

The modules are execute mode's own (``perfsim.runtime.models``), built from
:mod:`perfsim.models.specs`: calibration times the same code that trains.

The last layer is timed together with the loss (cross-entropy), as the last
pipeline stage computes it in a training step.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from perfsim.errors import ConfigError
from perfsim.models.specs import MLPSpec
from perfsim.models.transformer import TransformerSpec


def build_layers(spec, *, dtype: torch.dtype = torch.float32, device: str = "cpu"
                 ) -> tuple[list[nn.Module], str]:
    """One module per layer of ``spec``: the very modules ``perfsim run`` trains
    (:func:`perfsim.runtime.models.build_layer`), so calibration times the code
    that runs. Returns (modules, source="runtime")."""
    from perfsim.runtime import build_layer

    torch.manual_seed(0)
    if not isinstance(spec, (TransformerSpec, MLPSpec)):
        raise ConfigError(f"model {getattr(spec, 'name', spec)!r}: cannot build layers for timing")
    mods = [build_layer(spec, i, 0) for i in range(len(spec.layers()))]
    return [m.to(device=device, dtype=dtype).train() for m in mods], "runtime"


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
        if isinstance(spec, TransformerSpec):
            return torch.randint(0, spec.vocab, (micro_batch, spec.seq_len), device=device,
                                 generator=generator)
        x = torch.randn((micro_batch, spec.sizes[0]), device=device, dtype=dtype, generator=generator)
        return x
    shape = (micro_batch, *layers[index - 1].out_shape)
    return torch.randn(shape, device=device, dtype=dtype, generator=generator).requires_grad_(True)


def loss_of(spec, out: torch.Tensor, micro_batch: int) -> torch.Tensor:
    """Training loss on the last layer's output (random targets)."""
    if isinstance(spec, TransformerSpec):
        tgt = torch.randint(0, spec.vocab, (micro_batch * spec.seq_len,), device=out.device)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), tgt)
    tgt = torch.randint(0, out.shape[-1], (micro_batch,), device=out.device)
    return F.cross_entropy(out.float(), tgt)


def activation_bytes(shape: tuple[int, ...], micro_batch: int, dtype: torch.dtype) -> int:
    """Bytes of one micro-batch's activation of per-sample ``shape``."""
    return micro_batch * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
