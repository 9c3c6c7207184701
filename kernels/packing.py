"""Dense bit packing: the wire format of every quantized payload.

Format (byte-exact, documented in README "Wire format"): ``n`` unsigned codes of
``b`` bits (``b`` in 1, 2, 3, 4, 6, 8) form one little-endian bit stream; code
``i`` occupies stream bits ``[i*b, (i+1)*b)``, and stream bit ``k`` is bit
``k % 8`` of byte ``k // 8``. The packed length is exactly ``ceil(n*b/8)``
bytes; unused high bits of the last byte are zero. For b = 2, 4, 8 this is
``8/b`` codes per byte, lowest code in the lowest bits; for b = 3 eight codes
fill three bytes, for b = 6 four codes fill three bytes (no byte per value).

``pack_bits_ref`` / ``unpack_bits_ref`` are the plain-torch references (any
device). The public entries ``pack_bits`` / ``unpack_bits`` (in
``perfsim.kernels``) pick the Triton kernel for CUDA tensors.
"""

from __future__ import annotations

import math

from perfsim._lazy import torch

from perfsim.errors import ConfigError

SUPPORTED_BITS = (1, 2, 3, 4, 6, 8)


def group_size(bits: int) -> tuple[int, int]:
    """(codes per group, bytes per group): the smallest run of codes that ends on
    a byte boundary."""
    g = 8 // math.gcd(8, bits)
    return g, g * bits // 8


def packed_nbytes(n: int, bits: int) -> int:
    """Exact packed size of ``n`` codes of ``bits`` bits."""
    check_bits(bits)
    return (n * bits + 7) // 8


def check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ConfigError(f"bits={bits}: unsupported (choose from {', '.join(map(str, SUPPORTED_BITS))})")


def check_packed(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Validate a packed buffer for ``n`` codes of ``bits`` bits; returns it flat."""
    check_bits(bits)
    if packed.dtype != torch.uint8:
        raise ConfigError(f"packed: dtype {packed.dtype}, expected torch.uint8")
    packed = packed.reshape(-1)
    if packed.numel() != packed_nbytes(n, bits):
        raise ConfigError(f"packed: {packed.numel()} bytes, expected {packed_nbytes(n, bits)} "
                          f"for {n} codes of {bits} bits")
    return packed


def pack_bits_ref(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack a 1-D uint8 tensor of codes in ``[0, 2**bits)`` into ``ceil(n*bits/8)`` bytes."""
    check_bits(bits)
    if codes.dtype != torch.uint8:
        raise ConfigError(f"codes: dtype {codes.dtype}, expected torch.uint8")
    codes = codes.reshape(-1)
    n = codes.numel()
    out_len = packed_nbytes(n, bits)
    if bits == 8:
        return codes.clone()
    g, gbytes = group_size(bits)
    pad = (-n) % g
    c = torch.nn.functional.pad(codes, (0, pad)).view(-1, g).to(torch.int32)
    shifts = torch.arange(g, device=codes.device, dtype=torch.int32) * bits
    word = (c << shifts).sum(dim=1, dtype=torch.int32)  # g*bits <= 24 bits: fits int32
    byte_shifts = torch.arange(gbytes, device=codes.device, dtype=torch.int32) * 8
    out = ((word.unsqueeze(1) >> byte_shifts) & 0xFF).to(torch.uint8).reshape(-1)
    return out[:out_len].contiguous()


def unpack_bits_ref(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits_ref`: ``n`` uint8 codes from packed bytes."""
    packed = check_packed(packed, bits, n)
    if bits == 8:
        return packed.clone()
    g, gbytes = group_size(bits)
    groups = -(-n // g)
    p = torch.nn.functional.pad(packed, (0, groups * gbytes - packed.numel())).view(-1, gbytes).to(torch.int32)
    byte_shifts = torch.arange(gbytes, device=packed.device, dtype=torch.int32) * 8
    word = (p << byte_shifts).sum(dim=1, dtype=torch.int32)
    shifts = torch.arange(g, device=packed.device, dtype=torch.int32) * bits
    codes = ((word.unsqueeze(1) >> shifts) & ((1 << bits) - 1)).to(torch.uint8).reshape(-1)
    return codes[:n].contiguous()
