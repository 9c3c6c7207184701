"""Counter-based random bits for stochastic rounding (no ``torch.rand``).

Stochastic rounding needs one uniform number per element. ``torch.rand`` is
several times slower than this hash on a CPU (docs/validation.md, "Compression
kernels") and its stream cannot be reproduced inside a Triton kernel. We use a
*counter-based* generator instead (the idea of Salmon et al., "Parallel random
numbers: as easy as 1, 2, 3", SC'11): the random bits of element ``i`` are a
pure hash of ``(key, i)``, so any implementation that evaluates the same hash
gets the same bits, in any order, on any device.

Definition (the reference and the Triton kernels implement exactly this):

* ``key = call_key(seed, step, stream)``: a 32-bit value mixed on the host from
  the compressor's seed, its call counter and a stream id (Python ints).
* For element ``i`` (flat index in the tensor being rounded) let ``j = i >> 1``
  and ``h = fmix32(j * 0x9E3779B1 + key)`` (all arithmetic mod 2**32);
  ``fmix32`` is MurmurHash3's 32-bit finaliser (xor-shift 16, multiply
  0x85EBCA6B, xor-shift 13, multiply 0xC2B2AE35, xor-shift 16; shifts logical).
* Element ``i`` takes the low 16 bits of ``h`` when ``i`` is even, the high 16
  bits when odd, read as a *signed* 16-bit integer ``s`` in ``[-32768, 32767]``.
  Its uniform is ``u = (s + 32768.5) / 65536`` in ``(0, 1)``; 16 bits bound the
  rounding bias by ``2**-17`` of one quantization step (before float32 rounding).

One 32-bit hash feeds two elements, which halves the integer work. In torch the
hash runs on int32 tensors: multiplication wraps mod 2**32 and a logical right
shift is an arithmetic shift followed by a mask, so the bits equal the uint32
definition. Reading the int32 hash buffer as int16 (little-endian) yields the
signed halves in element order without further ops.
"""

from __future__ import annotations

import sys

from perfsim._lazy import torch

from perfsim.errors import ConfigError
from perfsim.kernels._workspace import workspace

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("perfsim.kernels assumes a little-endian host (int32 -> int16 halves)")

GOLDEN = 0x9E3779B1
FMIX_C1 = 0x85EBCA6B
FMIX_C2 = 0xC2B2AE35
MASK32 = 0xFFFFFFFF
#: largest tensor the 32-bit counter covers without repeating
MAX_ELEMENTS = 2**32


def to_int32(v: int) -> int:
    """Two's-complement reinterpretation of a 32-bit value as a signed int."""
    v &= MASK32
    return v - (1 << 32) if v >= (1 << 31) else v


GOLDEN_I32 = to_int32(GOLDEN)
FMIX_C1_I32 = to_int32(FMIX_C1)
FMIX_C2_I32 = to_int32(FMIX_C2)


def fmix32(h: int) -> int:
    """MurmurHash3 finaliser on a Python int (uint32 semantics)."""
    h &= MASK32
    h ^= h >> 16
    h = (h * FMIX_C1) & MASK32
    h ^= h >> 13
    h = (h * FMIX_C2) & MASK32
    h ^= h >> 16
    return h


def call_key(seed: int, step: int, stream: int = 0) -> int:
    """The signed 32-bit key of one rounding call, from ``(seed, step, stream)``.

    Distinct streams separate independent uses inside one compressor (e.g.
    AQ-SGD's message and its low-precision buffer)."""
    h = fmix32(int(seed) * GOLDEN + 0x632BE5AB)
    h = fmix32(h ^ (int(step) & MASK32) ^ ((int(step) >> 32) * 0x27D4EB2F))
    h = fmix32(h + int(stream) * 0x165667B1)
    return to_int32(h)


_BASE_CACHE: dict[tuple, torch.Tensor] = {}


def _hash_base(nhash: int, device: torch.device) -> torch.Tensor:
    """``j * GOLDEN`` for ``j < nhash`` (int32, wrapped); key-independent, so cached."""
    k = (nhash, str(device))
    base = _BASE_CACHE.get(k)
    if base is None:
        base = torch.arange(nhash, dtype=torch.int32, device=device).mul_(GOLDEN_I32)
        if len(_BASE_CACHE) >= 8:
            _BASE_CACHE.pop(next(iter(_BASE_CACHE)))
        _BASE_CACHE[k] = base
    return base


def hash_int16_ref(n: int, key: int, device=None, *, scratch: bool = False) -> torch.Tensor:
    """The signed 16-bit random value ``s`` of elements ``0..n-1`` (int16 tensor).

    ``scratch=True`` returns a view of a reused buffer (valid until the next
    call; the quantizer's hot path), otherwise a fresh tensor."""
    if n < 0 or n > MAX_ELEMENTS:
        raise ConfigError(f"random stream of {n} elements: must be in [0, 2**32]")
    nhash = (n + 1) // 2
    device = torch.device(device or "cpu")
    h = torch.add(_hash_base(nhash, device), to_int32(key), out=workspace("hash_h", nhash, torch.int32, device))
    t = workspace("hash_t", nhash, torch.int32, device)
    torch.bitwise_right_shift(h, 16, out=t)
    h ^= t.bitwise_and_(0xFFFF)
    h.mul_(FMIX_C1_I32)
    torch.bitwise_right_shift(h, 13, out=t)
    h ^= t.bitwise_and_(0x7FFFF)
    h.mul_(FMIX_C2_I32)
    torch.bitwise_right_shift(h, 16, out=t)
    h ^= t.bitwise_and_(0xFFFF)
    out = h.view(torch.int16)[:n]
    return out if scratch else out.clone()


def uniform_ref(n: int, key: int, device=None) -> torch.Tensor:
    """Uniform floats in (0, 1) of the stream (for tests and statistics)."""
    s = hash_int16_ref(n, key, device).to(torch.float32)
    return (s + 32768.5) * (1.0 / 65536.0)


# ---------------------------------------------------------------- Triton twin
from perfsim.kernels._triton import HAS_TRITON, tl, triton  # noqa: E402

if HAS_TRITON:

    @triton.jit
    def hash_int16_tl(idx, key):
        """Triton twin of :func:`hash_int16_ref` for int32 element indices ``idx``:
        the signed 16-bit value as int32."""
        h = (idx >> 1) * -1640531535 + key  # 0x9E3779B1 as int32
        h = h ^ ((h >> 16) & 0xFFFF)
        h = h * -2048144789  # 0x85EBCA6B
        h = h ^ ((h >> 13) & 0x7FFFF)
        h = h * -1028477387  # 0xC2B2AE35
        h = h ^ ((h >> 16) & 0xFFFF)
        return tl.where((idx & 1) == 1, h >> 16, (h << 16) >> 16)
