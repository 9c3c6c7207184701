"""Casts: ``fp32`` (no compression), ``fp16``, ``bf16``.

The simplest compressors and the reference for the interface. Casts are
allreduce-compatible (a sum of fp16 values is an fp16 allreduce), at the usual
cost of rounding in the sum.
"""

from __future__ import annotations

from typing import Sequence

from perfsim._lazy import torch

from perfsim.compression.base import Compressor, Payload, check_input, numel_of
from perfsim.compression.registry import register


class _Cast(Compressor):
    allreduce_compatible = True
    reduce_scatter_compatible = True
    #: the torch dtype on the wire, by name, and its size in bytes (sizes need no torch)
    wire_dtype_name: str = "float32"
    wire_itemsize: int = 4

    @property
    def wire_dtype(self) -> torch.dtype:
        return getattr(torch, self.wire_dtype_name)

    def __init__(self, *, seed: int = 0):
        """``seed`` is accepted like every compressor's and unused: casts round
        deterministically."""
        self.spec = self.canonical_spec()

    def wire_bytes(self, shape: Sequence[int], *, warmup: bool = False) -> int:
        return numel_of(shape) * self.wire_itemsize

    def compress(self, x: torch.Tensor, *, key=None) -> Payload:
        check_input(x)
        return Payload({"values": x.detach().to(self.wire_dtype).contiguous()}, tuple(x.shape), x.dtype)

    def decompress(self, payload: Payload, *, key=None) -> torch.Tensor:
        return payload.tensors["values"].to(payload.dtype)

    def allreduce_mean(self, x: torch.Tensor, group=None) -> torch.Tensor:
        import torch.distributed as dist  # lazy: torch is heavy, needed only here

        buf = x.detach().to(self.wire_dtype).contiguous()
        dist.all_reduce(buf, group=group)
        return buf.to(x.dtype) / dist.get_world_size(group)


@register
class FP32(_Cast):
    """No compression: send fp32."""

    name = "fp32"
    wire_dtype_name, wire_itemsize = "float32", 4

    def codec_traffic(self, shape: Sequence[int]):
        """No kernel: ``x.to(float32)`` of an fp32 tensor is the tensor itself (and
        Megatron-LM's ``p2p_communication`` sends the activation as it is)."""
        return (), ()


@register
class FP16(_Cast):
    """IEEE half precision cast."""

    name = "fp16"
    wire_dtype_name, wire_itemsize = "float16", 2


@register
class BF16(_Cast):
    """bfloat16 cast (fp32 range, 8-bit mantissa)."""

    name = "bf16"
    wire_dtype_name, wire_itemsize = "bfloat16", 2
