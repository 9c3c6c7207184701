"""Reusable scratch buffers for the CPU hot paths.

Fresh multi-MB allocations cost page faults (more than one arithmetic pass over
the same bytes; docs/validation.md, "Compression kernels"), so kernels reuse
per-thread temporaries;
tensors handed back to callers (payloads, decoded values) are always fresh.
"""

from __future__ import annotations

import threading

from perfsim._lazy import torch

_WS = threading.local()


def workspace(name: str, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A scratch buffer of ``n`` elements, reused across calls (per thread, per
    name, dtype and device). Its contents are garbage; valid until the next call
    that asks for the same name."""
    cache = getattr(_WS, "cache", None)
    if cache is None:
        cache = _WS.cache = {}
    k = (name, dtype, str(device))
    buf = cache.get(k)
    if buf is None or buf.numel() < n:
        buf = cache[k] = torch.empty(max(n, 1), dtype=dtype, device=device)
    return buf[:n]


def clear() -> None:
    """Drop every cached buffer of this thread."""
    _WS.cache = {}
