"""Optional Triton import and the launch helpers shared by the kernels.

Triton is imported lazily-once here; without it (or without a CUDA device and
without ``TRITON_INTERPRET=1``) every public entry falls back to its plain-torch
reference. ``TRITON_INTERPRET`` is read when a kernel is *decorated*, so it must
be set before :mod:`perfsim.kernels` is imported (the tests run the interpreter
in a subprocess for that reason).
"""

from __future__ import annotations

import os

from perfsim._lazy import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _gpu_driver() -> bool:
    """A GPU driver's device node exists (NVIDIA or ROCm): the only case besides
    the interpreter where a Triton kernel can run. Checked without importing torch."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd"))


triton = tl = None
HAS_TRITON = False
if INTERPRET or _gpu_driver():  # a CPU-only process never needs triton (0.4 s to import)
    try:  # pragma: no cover - depends on the environment
        import triton
        import triton.language as tl

        HAS_TRITON = True
    except Exception:  # ImportError, or a broken install
        triton = tl = None


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for launch grids, in plain Python: ``triton.cdiv`` called from Python
    goes through Triton's constexpr wrapper (about 10-20 us a call, as much as a launch)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (``triton.next_power_of_2`` in plain Python)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def use_triton(t: torch.Tensor) -> bool:
    """The public entries pick the Triton kernel only for CUDA tensors."""
    return HAS_TRITON and t.is_cuda


_OPTS = {} if INTERPRET else {"enable_fp_fusion": False}


def launch_opts() -> dict:
    """Compile options: no fp contraction, so ``a*b + c`` rounds twice exactly as
    the torch reference does (fma would differ in the last bit). One shared dict: pass it as
    ``**launch_opts()``, never change it."""
    return _OPTS


def require_triton() -> None:
    from perfsim.errors import ConfigError

    if not HAS_TRITON:
        raise ConfigError("triton is not installed; the Triton kernels are unavailable")
